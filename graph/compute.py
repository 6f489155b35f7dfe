"""Community detection and id matching off the daemon's process: where the CPU work of a
recompute runs.

Why a process and not a thread: Leiden (leidenalg, through cdlib and igraph) and the graph
building around it hold the GIL. Measured here with ``detect`` in a thread next to an event
loop, on random graphs of 500 / 2,000 / 5,000 entities (3 edges each): the loop's wake-ups
were late by 5-7 ms at the median and by up to 27 / 135 / 499 ms at worst, for the whole
0.08 / 0.35 / 1.4 s of the detection. Every await of ingestion, of a query and of the Kafka
clients' heartbeats waits that long, so a recompute showed up as a stall of freshness and
query latency. In a process of its own (spawned once, cdlib imported there while the
embedding worker loads its model) the daemon's loop never waits for it.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.abc
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol, TypeVar

import structlog

from graph import communities
from graph.errors import ComputeCrashed

log = structlog.get_logger()

T = TypeVar("T")


class Offload(Protocol):
    """Runs a picklable, module-level function with its arguments away from the event loop."""

    def __call__(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Awaitable[T]: ...


async def in_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """The in-process offload: a thread (tests, the CLI's one-off recompute)."""
    return await asyncio.to_thread(fn, *args, **kwargs)


class _NoTorch(importlib.abc.MetaPathFinder):
    """Refuses torch to the worker: cdlib's overlapping-community algorithms import it when
    present (a third of the worker's memory, seconds of its start), and Leiden never uses it.
    cdlib takes a missing torch as an optional package left out."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname == "torch" or fullname.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (not in the community worker)", name=fullname)


def _worker_init(parent: int) -> None:
    """In the worker: import cdlib (without torch), and exit when the daemon is gone.

    A pool's worker outlives a parent that was killed (``kill -9``, the OOM killer): it
    waits on its task queue for good, ~450 MB each (seen: the test suite's killed daemons
    left theirs behind). A watchdog thread ends it once its parent is no longer its parent.
    """
    # Its lifetime is the daemon's (close() kills it): a Ctrl-C or a SIGTERM sent to the whole
    # process group is the daemon's to act on, not a KeyboardInterrupt traceback from here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True, name="orphan-watch").start()
    if "torch" not in sys.modules:
        sys.meta_path.insert(0, _NoTorch())
    communities.preload()


def _exit_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _processes(pool: ProcessPoolExecutor | None) -> list[Any]:
    """A pool's worker processes: the executor keeps them private, with no public accessor."""
    return list((getattr(pool, "_processes", None) or {}).values())


class CommunityComputer:
    """One spawned worker process, kept warm, that runs ``detect`` and ``assign_ids``.

    Calls are serialized by the pool (one worker): a daemon recomputes one tenant at a time
    under the recompute lease anyway. A worker that dies is replaced on the next call; the
    call it died in fails with ComputeCrashed, which the recompute loop retries later.
    """

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False

    def _ensure(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=mp.get_context("spawn"),
                initializer=_worker_init,
                initargs=(os.getpid(),),
            )
        return self._pool

    async def start(self) -> None:
        """Start the worker and import cdlib there (seconds); failures are logged, not raised:
        the first recompute tries again and says why."""
        try:
            await self(communities.preload)
        except Exception as exc:
            log.warning("graph.compute_start_failed", error=f"{type(exc).__name__}: {exc}")

    async def __call__(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        if self._closed:
            raise ComputeCrashed("the community compute process is stopped (the daemon is stopping)")
        pool = self._ensure()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(pool, functools.partial(fn, *args, **kwargs))
        except BrokenProcessPool as exc:
            if self._closed:  # killed by close(): the daemon is stopping, nothing crashed
                raise ComputeCrashed("the community compute process was stopped") from exc
            if self._pool is pool:
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
            log.error("graph.compute_crashed", task=getattr(fn, "__name__", repr(fn)))
            raise ComputeCrashed("the community compute process died; the next recompute starts a new one") from exc

    def pids(self) -> list[int]:
        """The worker's process id(s) (for tests and operators)."""
        return [p.pid for p in _processes(self._pool) if p.pid is not None]

    def close(self) -> None:
        """Stop the worker without waiting for a detection in progress (it is killed)."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # The executor has no public way to stop a running task before Python 3.14: its
        # processes are killed directly, so a long Leiden run cannot hold the shutdown.
        procs = _processes(pool)
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
