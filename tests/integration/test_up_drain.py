"""`agentmemd up` stopped right after writes the broker accepted: its embedded broker keeps
them in memory only, so the daemon applies them before it stops, and a restart finds them all."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from consumers.client import MemoryClient
from daemon.launcher import free_port
from tests.integration.test_cli import AGENTMEMD, CHECKOUT

pytestmark = pytest.mark.integration

PARAGRAPH = "The kestrel gateway rotates its certificates every night; page the on-call when a rotation fails. "


class Up:
    """One `agentmemd up` in its own process group, its stdout read line by line."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._log = log.open("a")
        self.proc = subprocess.Popen(
            [AGENTMEMD, "up"], env=env, stdout=subprocess.PIPE, stderr=self._log, text=True, start_new_session=True
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if "agentmemd ready" in line:
                self.ready.set()

    def ctrl_c(self) -> int:
        os.killpg(self.proc.pid, signal.SIGINT)
        code = self.proc.wait(timeout=120)
        self._log.close()
        return code


async def test_a_stopped_up_applies_what_its_broker_accepted_before_it_stops(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "AGENTMEM_KAFKA_BOOTSTRAP": (bootstrap := f"127.0.0.1:{free_port()}"),
        "AGENTMEM_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "AGENTMEM_DATA_DIR": str(tmp_path / "data"),
        "AGENTMEM_TOPIC_PARTITIONS": "1",
        "AGENTMEM_HTTP_PORT": "0",
        "AGENTMEM_GRAPH__ENABLED": "false",
        "PYTHONPATH": os.pathsep.join([CHECKOUT, os.environ.get("PYTHONPATH", "")]),
    }
    docs = [f"drain/{n}.md" for n in range(40)]
    first = Up(env, tmp_path / "up.log")
    try:
        assert await asyncio.to_thread(first.ready.wait, 120), first.lines
        async with MemoryClient(bootstrap=bootstrap) as memory:
            for n, doc in enumerate(docs):  # accepted by the broker, not waited for
                await memory.publish_document(doc, f"Note {n}. " + PARAGRAPH * 12, version=1)
    finally:
        code = await asyncio.to_thread(first.ctrl_c)
    assert code == 0, first.lines
    said = "".join(first.lines)
    assert "unapplied" not in said, said
    second = Up(env, tmp_path / "up.log")
    try:
        assert await asyncio.to_thread(second.ready.wait, 120), second.lines
        async with MemoryClient(bootstrap=bootstrap) as memory:
            reply = await memory.get(docs)
        assert [i.doc_id for i in reply.items if i.status != "found"] == [], said
    finally:
        assert await asyncio.to_thread(second.ctrl_c) == 0


async def test_a_second_signal_ends_the_wait_on_a_broker_that_never_answers(tmp_path: Path) -> None:
    """The lag is read from a broker that takes connections and never answers: the second
    Ctrl-C ends the drain then and there, not after the read's own 10 s bound or the drain's
    60; with no drain at all nothing is read."""
    from daemon.drain import drain_events
    from daemon.settings import Settings

    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # accepts, never replies
    port = silent.sockets[0].getsockname()[1]
    settings = Settings(kafka_bootstrap=f"127.0.0.1:{port}", up_drain_s=60.0)
    try:
        again = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, again.set)
        assert await asyncio.wait_for(drain_events(settings, again), timeout=8.0) == -1
        assert await asyncio.wait_for(drain_events(settings.model_copy(update={"up_drain_s": 0.0}), again), 1.0) == -1
    finally:
        silent.close()
        await silent.wait_closed()
