"""Bounded teardown: a close that hangs, fails or swallows its cancellation never hangs the caller."""

from __future__ import annotations

import asyncio
import contextlib

from structlog.testing import capture_logs

from daemon.teardown import bounded, cancelled


async def _swallows_cancellation(stop: asyncio.Event) -> None:
    # What a client library's close looks like when an inner task eats the CancelledError.
    while not stop.is_set():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.01)


async def test_a_close_that_ignores_cancellation_is_abandoned_at_its_deadline() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await bounded("stubborn close", _swallows_cancellation(stop), seconds=0.2) is False
    assert loop.time() - t0 < 5  # returned at its deadline, not when the close ended
    stop.set()


async def test_a_failing_close_is_reported_not_raised() -> None:
    async def fails() -> None:
        raise ConnectionError("broker went away")

    with capture_logs() as logs:
        assert await bounded("failing close", fails(), seconds=1) is False
    [entry] = [e for e in logs if e["event"] == "teardown.step_failed"]
    assert entry["what"] == "failing close" and "broker went away" in entry["error"]


async def test_a_clean_close_reports_success() -> None:
    with capture_logs() as logs:
        assert await bounded("clean close", asyncio.sleep(0), seconds=1) is True
    assert not [e for e in logs if e["log_level"] == "warning"]


async def test_cancelling_a_task_that_ignores_cancellation_returns() -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(_swallows_cancellation(stop))
    await asyncio.sleep(0.02)
    await cancelled("stubborn task", task, seconds=0.2)
    assert not task.done()  # left behind, as logged
    stop.set()
    await task


async def test_a_task_that_already_failed_is_left_to_its_owner() -> None:
    async def fails() -> None:
        raise RuntimeError("slot lost")

    task = asyncio.create_task(fails())
    await asyncio.wait({task})
    await cancelled("failed task", task, seconds=1)  # neither raises nor waits
    assert isinstance(task.exception(), RuntimeError)
