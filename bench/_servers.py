"""Embedded servers (Redis, the tansu broker) and processes a benchmark starts, stops and waits for."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (the offline environment and sys.path, before any project module)


@dataclass
class Servers:
    """Embedded servers started for one benchmark run."""

    redis_url: str = ""
    kafka_bootstrap: str = ""
    redis_dir: Path | None = None
    procs: list[Any] = field(default_factory=list)


@contextlib.contextmanager
def embedded_servers(
    *, kafka: bool = True, redis_dir: Path | None = None, appendonly: bool = True
) -> Iterator[Servers]:
    """Redis (with RediSearch) and, optionally, the tansu broker on free ports.

    Args:
        kafka: also start the broker.
        redis_dir: Redis's data dir (kept); a temporary one (removed) when ``None``.
        appendonly: persist with AOF, as the daemon's own ``agentmemd up`` does.

    Both are stopped (SIGTERM, then SIGKILL) in reverse order when the block exits.
    """
    from daemon.launcher import free_port, start_redis, start_tansu

    tmp = Path(tempfile.mkdtemp(prefix="agentmemd-bench-"))
    servers = Servers()
    try:
        data_dir = redis_dir if redis_dir is not None else tmp / "redis"
        servers.redis_dir = data_dir
        servers.redis_url = f"redis://127.0.0.1:{free_port()}/0"
        servers.procs.append(start_redis(servers.redis_url, data_dir=data_dir, appendonly=appendonly))
        if kafka:
            broker = start_tansu(f"127.0.0.1:{free_port()}", log_dir=tmp / "tansu")
            servers.kafka_bootstrap = broker.address
            servers.procs.append(broker)
        yield servers
    finally:
        for proc in reversed(servers.procs):
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def spawn_logged(args: list[str], log_path: Path, env: dict[str, str] | None) -> subprocess.Popen[Any]:
    """``args`` started with its output in ``log_path``, stopped (SIGTERM) with this process."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent
        )


def _die_with_parent() -> None:
    import ctypes

    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 60.0) -> None:
    """A clean stop (SIGTERM, as Ctrl-C), then SIGKILL after ``timeout_s``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _log_tail(path: Path, chars: int | None = 2000) -> str:
    text = path.read_text(errors="replace")
    return text if chars is None else text[-chars:]


async def start_agentmemd(servers: Servers, log_path: Path, env: dict[str, str]) -> subprocess.Popen[Any]:
    """``agentmemd run`` as its own process (as it is deployed) on ``servers``, graph off, no HTTP
    server, with the ``AGENTMEM_*`` settings of ``env`` on top; returned once it consumes."""
    settings = {
        "AGENTMEM_KAFKA_BOOTSTRAP": servers.kafka_bootstrap,
        "AGENTMEM_REDIS_URL": servers.redis_url,
        "AGENTMEM_GRAPH__ENABLED": "false",
        "AGENTMEM_HTTP_PORT": "0",
        "AGENTMEM_LOG_LEVEL": "warning",
    }
    args = [str(Path(sys.executable).parent / "agentmemd"), "run"]
    proc = spawn_logged(args, log_path, {**os.environ, **settings, **env})

    async def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"agentmemd exited {proc.returncode}: {_log_tail(log_path)}")
        return "agentmemd ready" in _log_tail(log_path, None)

    try:
        if not await wait_until(ready, timeout_s=300, interval_s=0.1):
            raise RuntimeError(f"agentmemd not ready in 300 s: {_log_tail(log_path)}")
    except BaseException:
        stop_process(proc)
        raise
    return proc


async def wait_redis_ready(client: Any, timeout_s: float = 300.0) -> None:
    """Wait until Redis answers and has finished loading its AOF."""
    from redis import exceptions as rexc

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await client.ping()
            info = await client.info("persistence")
            if int(info.get("loading", 0)) == 0:
                return
        except (rexc.BusyLoadingError, rexc.ConnectionError, rexc.TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"redis not ready within {timeout_s}s")
        await asyncio.sleep(0.2)


async def wait_until(check: Callable[[], Any], *, timeout_s: float, interval_s: float = 0.02) -> bool:
    """Poll the async ``check`` until it is true; False on timeout (never raises for it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(interval_s)
    return False
