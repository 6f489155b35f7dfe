"""Bounded teardown: closing a client must never hang a command whose work is done.

A client's close can wait forever on its library's internals (a background task that
missed its cancellation, a connection whose close never completes). A reindex that has
switched and reported, or a probe that has its answer, must still return: each close
gets a deadline, and one that misses it is logged and left behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Collection
from typing import Any

import structlog

log = structlog.get_logger()

#: Seconds one close may take before it is abandoned.
CLOSE_TIMEOUT_S = 15.0


def await_chain(task: asyncio.Task[Any]) -> list[str]:
    """Where a task is suspended, outermost first (``Task.get_stack`` shows only the top
    coroutine's frame, which does not say what it waits on)."""
    where: list[str] = []
    coro: Any = task.get_coro()
    while coro is not None and len(where) < 40:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            where.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
    return where


def _retrieved(task: asyncio.Future[Any]) -> None:
    # What a close left behind raises once it ends is of no use to anyone by then; retrieved,
    # so that asyncio does not log it as never retrieved.
    if not task.cancelled():
        task.exception()


async def bounded(what: str, aw: Awaitable[object], seconds: float = CLOSE_TIMEOUT_S) -> bool:
    """Await a close for at most ``seconds``; True if it finished cleanly.

    A failure or a timeout is logged, never raised: teardown runs in ``finally`` blocks,
    where it must not replace the error (or the result) being returned. ``asyncio.wait``
    rather than ``wait_for``: the latter waits for the cancelled close to end, which is
    exactly what a close that swallows its cancellation never does.
    """
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_retrieved)
        log.warning("teardown.step_timed_out", what=what, after_s=seconds)
        return False
    if task.cancelled():
        log.warning("teardown.step_failed", what=what, error="cancelled")
        return False
    exc = task.exception()
    if exc is not None:
        log.warning("teardown.step_failed", what=what, error=f"{type(exc).__name__}: {exc}")
        return False
    return True


async def cancelled(what: str, task: asyncio.Task[None], seconds: float = CLOSE_TIMEOUT_S) -> None:
    """Cancel a background task and wait (bounded) for it to end.

    What a task that had already ended raised is its owner's to report, not teardown's.
    """
    if task.done():
        if not task.cancelled():
            task.exception()  # retrieved: asyncio would otherwise log it as never retrieved
        return
    if await cancel_and_wait([task], seconds=seconds):
        log.warning("teardown.step_timed_out", what=what, after_s=seconds, awaiting=await_chain(task))


async def cancel_and_wait(
    tasks: Collection[asyncio.Task[Any]], *, seconds: float = CLOSE_TIMEOUT_S, tries: int = 3
) -> set[asyncio.Task[Any]]:
    """Cancel tasks and wait up to ``seconds`` for them to end, cancelling again, ``tries``
    times in all, those still running: a lost cancellation is a race (on Python 3.11,
    asyncio.wait_for inside redis-py's command send returns normally when the send completes
    as the cancellation arrives), so another one gets through. Returns the tasks still
    running, left behind (what they raise once they end is retrieved)."""
    pending = {t for t in tasks if not t.done()}
    for _ in range(tries):
        if not pending:
            break
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=seconds / tries)
    for task in pending:
        task.add_done_callback(_retrieved)
    return pending
