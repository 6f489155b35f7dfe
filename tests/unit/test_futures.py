"""memory.futures.settle: a result, an exception, and a future already done left alone."""

from __future__ import annotations

import asyncio

import pytest

from memory.futures import settle


async def test_result_and_exception_reach_their_waiters() -> None:
    loop = asyncio.get_running_loop()
    ok: asyncio.Future[int] = loop.create_future()
    bad: asyncio.Future[int] = loop.create_future()
    settle(ok, 7)
    settle(bad, ValueError("no"))
    assert await ok == 7
    with pytest.raises(ValueError, match="no"):
        await bad


async def test_a_done_future_keeps_what_it_has() -> None:
    loop = asyncio.get_running_loop()
    cancelled: asyncio.Future[int] = loop.create_future()
    cancelled.cancel()
    settle(cancelled, 1)  # must not raise InvalidStateError
    assert cancelled.cancelled()
    answered: asyncio.Future[int] = loop.create_future()
    answered.set_result(1)
    settle(answered, RuntimeError("late"))
    assert answered.result() == 1
