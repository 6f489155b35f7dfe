"""Session-wide real servers: a tansu broker and Redis with RediSearch on free ports.

Set AGENTMEM_TEST_KAFKA / AGENTMEM_TEST_REDIS_URL to run against servers you started
(for example compose/ with Apache Kafka) instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def unique(name: str, n: int = 10) -> str:
    """A short name derived from a test id, so parallel tests never share state."""
    return "t" + hashlib.sha1(name.encode()).hexdigest()[:n]


@pytest.fixture(autouse=True)
async def _asyncio_tasks_dumped_before_timeout(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """A test that hangs on an await shows, shortly before pytest-timeout fails it, every
    asyncio task and the await chain it is suspended in (pytest-timeout dumps threads only,
    and a hung await leaves the main thread idle in the event loop's select)."""
    marker = request.node.get_closest_marker("timeout")
    timeout = float(marker.args[0] if marker and marker.args else request.config.getini("timeout") or 0)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if timeout <= 20 or reporter is None or capture is None:
        yield
        return

    from daemon.teardown import await_chain

    def dump() -> None:
        # Written past output capture, so that the dump is in the log right where the
        # test hangs, even where the failure's captured sections are cut short.
        lines = [f"--- asyncio tasks {timeout - 15:.0f} s into {request.node.nodeid} ---"]
        for task in asyncio.all_tasks():
            lines.append(f"{task.get_name()}: {task.get_coro()!r}")
            lines.extend(f"    {where}" for where in await_chain(task))
        with capture.global_and_fixture_disabled():
            reporter.write_line("\n" + "\n".join(lines))

    handle = asyncio.get_running_loop().call_later(timeout - 15, dump)
    try:
        yield
    finally:
        handle.cancel()


@pytest.fixture(scope="session")
def tmp_root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="agentmemd-tests-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_url(tmp_root: Path) -> Iterator[str]:
    if url := os.environ.get("AGENTMEM_TEST_REDIS_URL"):
        yield url
        return
    from daemon.launcher import free_port, start_redis

    url = f"redis://127.0.0.1:{free_port()}/0"
    server = start_redis(url, data_dir=tmp_root / "redis")
    yield url
    server.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_root: Path) -> Iterator[str]:
    if bootstrap := os.environ.get("AGENTMEM_TEST_KAFKA"):
        yield bootstrap
        return
    from daemon.launcher import free_port, start_tansu

    server = start_tansu(f"127.0.0.1:{free_port()}", log_dir=tmp_root / "tansu")
    yield server.address
    server.stop()


@pytest.fixture(scope="session", autouse=True)
def _shared_workers_closed() -> Iterator[None]:
    """The session's shared embedding and detection workers (tests.helpers.shared_workers),
    started by the first test that needs them, are closed at the end."""
    from tests.helpers import close_shared_workers

    yield
    close_shared_workers()


@pytest.fixture(scope="session")
async def embedder() -> object:
    """The session's shared embedder (tests that close or break one load their own)."""
    from tests.helpers import shared_workers

    return (await shared_workers())[0]
