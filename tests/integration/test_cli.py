"""The quick start as a user runs it: `agentmemd up`, publish and query from the CLI, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from daemon.launcher import free_port

pytestmark = pytest.mark.integration

AGENTMEMD = str(Path(sys.executable).parent / "agentmemd")
# The checkout under test first: the console script imports whatever install it was made by.
CHECKOUT = str(Path(__file__).resolve().parents[2])


def _cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AGENTMEMD, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.timeout(420)  # some 20 CLI processes and a model load: 85 s idle, twice that on a busy machine
def test_up_publish_query_and_clean_stop(tmp_path: Path) -> None:
    """`agentmemd up` reaches ready, serves CLI publishes and queries, and Ctrl-C stops every child."""
    env = {
        **os.environ,
        "AGENTMEM_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
        "AGENTMEM_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "AGENTMEM_DATA_DIR": str(tmp_path / "data"),
        "AGENTMEM_TOPIC_PARTITIONS": "1",
        "AGENTMEM_HTTP_PORT": str(http_port := free_port()),
        "COLUMNS": "200",
        "PYTHONPATH": os.pathsep.join([CHECKOUT, os.environ.get("PYTHONPATH", "")]),
    }
    log = (tmp_path / "up.log").open("w")
    # A session of its own, so that a Ctrl-C can go to its whole process group, as a terminal's does.
    proc = subprocess.Popen(
        [AGENTMEMD, "up"], env=env, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True
    )
    ready = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "ready" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(120), f"no ready line; stdout={lines!r}"
        # A new user learns where the status page and the explorer are from the ready line.
        assert f"status page http://127.0.0.1:{http_port}/, explorer /explore" in lines[-1], lines
        # ... and which data dir holds its memory: relative by default, so the directory it was
        # started from decides (from elsewhere, the memory would look empty).
        assert f"agentmemd data: {tmp_path / 'data'} (new: the memory starts empty" in lines[0], lines
        children = psutil.Process(proc.pid).children(recursive=True)
        names = sorted(c.name() for c in children)
        assert any(n.startswith("redis-server") for n in names) and any(n.startswith("tansu") for n in names), names

        doc = tmp_path / "runbook.md"
        doc.write_text("Runbook: when the ledger-service throws ERR_LEDGER_LOCK_9C1, restart the lock manager.\n")
        res = _cli(
            env, "publish", "doc", str(doc), "--doc-id", "runbooks/ledger.md", "--meta", "service=ledger-service"
        )
        assert res.returncode == 0, res.stderr
        res = _cli(
            env,
            "publish",
            "observation",
            "--agent-id",
            "ops-1",
            "--session-id",
            "s-9",
            "--turn",
            "3",
            "--timestamp",
            "2026-05-02T10:00:00Z",
            "I restarted the lock manager for ERR_LEDGER_LOCK_9C1.",
        )
        assert res.returncode == 0, res.stderr

        deadline = time.monotonic() + 60
        reply: dict[str, object] = {}
        while time.monotonic() < deadline:
            res = _cli(env, "query", "ERR_LEDGER_LOCK_9C1", "--top-k", "5", "--json")
            assert res.returncode == 0, res.stderr
            reply = json.loads(res.stdout)
            if reply["total_retrieved"] == 2:
                break
            time.sleep(0.5)
        results = reply["results"]
        assert isinstance(results, list)
        assert {r["doc_id"] for r in results} == {"runbooks/ledger.md", "transcript:ops-1/s-9/3"}

        res = _cli(env, "recent", "--agent-id", "ops-1", "--timeout", "45")
        assert res.returncode == 0 and "s-9/3 assistant: I restarted the lock manager" in res.stdout, res
        assert "2026-05-02 10:00 UTC" in res.stdout, res.stdout  # dated by --timestamp, shown as query shows times
        # Without --turn, the turn after the session's last stored one (each command looks it up).
        for n in (0, 1):
            res = _cli(
                env, "publish", "observation", "--agent-id", "ops-2", "--session-id", "s", "--wait", f"Note {n}."
            )
            assert res.returncode == 0 and f"observation published as turn {n}: indexed" in res.stdout, res
        res = _cli(
            env,
            "publish",
            "observation",
            "--agent-id",
            "a",
            "--session-id",
            "s",
            "--turn",
            "0",
            "--timestamp",
            "soon",
            "x",
        )
        assert res.returncode == 2 and "--timestamp" in res.stderr, res
        res = _cli(env, "recent", "--agent-id", "ops-1", "--session-id", "s-8", "--json")
        assert res.returncode == 0 and json.loads(res.stdout)["items"] == [], res
        res = _cli(env, "query", "ERR_LEDGER_LOCK_9C1", "--filter", "service=ledger-service")
        assert res.returncode == 0 and "runbooks/ledger.md_p0" in res.stdout
        res = _cli(env, "query", "x", "--filter", "tenant=a")
        assert res.returncode == 1 and "invalid_request" in res.stderr
        # --json prints the raw reply, an error reply too (stdout is never left empty)
        res = _cli(env, "query", "x", "--filter", "tenant=a", "--json")
        assert res.returncode == 1 and json.loads(res.stdout)["error"]["code"] == "invalid_request", res
        # An edit keeps what the runbook said before: `get --history` shows both.
        doc.write_text("Runbook: when the ledger-service throws ERR_LEDGER_LOCK_9C1, drain the queue first.\n")
        res = _cli(env, "publish", "doc", str(doc), "--doc-id", "runbooks/ledger.md", "--wait")
        assert res.returncode == 0, res.stderr
        res = _cli(env, "get", "runbooks/ledger.md", "--history")
        assert res.returncode == 0, res.stderr
        now, before = res.stdout.index("drain the queue first"), res.stdout.index("restart the lock manager")
        assert now < before and " until " in res.stdout, res.stdout
        # The edit dropped the metadata: the earlier version shows what it had.
        assert "metadata service=ledger-service" in res.stdout[now:], res.stdout
        assert "metadata" not in res.stdout[:now], res.stdout  # the current version has none
        res = _cli(env, "get", "runbooks/ledger.md", "runbooks/none.md", "--json")
        assert res.returncode == 3, res  # one not found: apart from a failure's 1
        items = json.loads(res.stdout)["items"]
        assert [(i["status"], i["history"]) for i in items] == [("found", None), ("not_found", None)], items
        # A forget says what it removed: nothing for a session never written (a misspelt id).
        forget = ("publish", "forget", "--agent-id", "ops-1", "--wait", "--session-id")
        res = _cli(env, *forget, "s-99")
        assert res.returncode == 0 and "nothing stored for session s-99 of agent ops-1" in res.stdout, res
        # ... and names the agent's sessions, the one the id spells nearly first.
        said = " ".join(res.stdout.split())
        assert "did you mean s-9? agent ops-1's latest sessions: s-9" in said, res.stdout
        res = _cli(env, "publish", "forget", "--agent-id", "ops-nobody", "--wait", "--session-id", "s-1")
        assert "agent ops-nobody has no turns stored" in res.stdout, res
        res = _cli(env, *forget, "s-9")
        assert res.returncode == 0 and "forgot session s-9 of agent ops-1: 1 turn(s) removed" in res.stdout, res
        # So does a delete: of a doc never written, and of one stored.
        res = _cli(env, "publish", "delete", "runbooks/ledgr.md", "--wait")
        assert res.returncode == 0 and "nothing stored for runbooks/ledgr.md: nothing removed" in res.stdout, res
        assert "did you mean runbooks/ledger.md?" in res.stdout, res
        res = _cli(env, "publish", "delete", "runbooks/ledger.md", "--wait")
        assert res.returncode == 0 and "indexed (1 chunk(s) removed)" in res.stdout, res
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        code = proc.wait(timeout=60)
    assert code == 0
    log.close()
    # Every process of the group had the Ctrl-C: none prints a traceback (a worker that did not
    # ignore it would print a KeyboardInterrupt).
    assert "Traceback" not in (tmp_path / "up.log").read_text()
    # Every child goes with the daemon: Redis and tansu are stopped by it, the embedding
    # worker and multiprocessing's resource tracker exit when their pipes to it close
    # (which they notice within moments of its exit, hence the short wait).
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not [c for c in alive if c.status() != psutil.STATUS_ZOMBIE], [c.cmdline() for c in alive]


def test_run_stops_on_sigterm_while_still_starting(redis_url: str) -> None:
    """A stop ends a start-up in progress (a group join that never ends must not leave kill -9
    as the only way out): here the broker is down, so start-up waits for it, and SIGTERM must
    end that wait."""
    env = {
        **os.environ,
        "AGENTMEM_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",  # nobody listens
        "AGENTMEM_REDIS_URL": redis_url,
        "AGENTMEM_INDEX__NAME": f"sigterm-start-{os.getpid()}",
        "AGENTMEM_HTTP_PORT": "0",
        "AGENTMEM_LOG_FORMAT": "json",
        "PYTHONPATH": os.pathsep.join([CHECKOUT, os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen([AGENTMEMD, "run"], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 180
        waiting = False
        while not waiting and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            waiting = "daemon.broker_waited" in line
        assert waiting, f"the daemon never reached the broker wait (rc {proc.poll()})"
        proc.send_signal(signal.SIGTERM)
        # Well under start-up's own 120 s wait for the broker.
        code = proc.wait(timeout=30)
        assert code == 0, code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
