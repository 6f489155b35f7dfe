"""How a request waits for its reply (pure: nothing connects): the lost-log check runs beside
the wait, once a second at most, and never costs a reply that came."""

from __future__ import annotations

import asyncio

import pytest

from consumers.transport import KafkaTransport


def _transport() -> KafkaTransport:
    return KafkaTransport(
        bootstrap="127.0.0.1:1",
        reply_topic="memory.replies",
        reply_partition=None,
        reply_fetch_wait_ms=5,
        reply_idle_pause_s=0,
        timeout_s=30,
        kafka_options={},
        max_request_size=1 << 20,
    )


@pytest.mark.parametrize(("after_s", "checks_asked"), [(0.05, 0), (1.3, 1)])
async def test_a_reply_is_returned_with_a_check_asked_for_each_second_without_it(
    monkeypatch: pytest.MonkeyPatch, after_s: float, checks_asked: int
) -> None:
    """A reply in milliseconds pays for no lost-log check; one after 1.3 s asked for one, beside the wait."""
    transport = _transport()
    checks: list[float] = []
    monkeypatch.setattr(transport._replies, "check_lost_log", lambda: checks.append(0.0))
    fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(after_s, fut.set_result, b"reply")
    assert await transport._await_reply(fut, 5.0) == b"reply"
    assert len(checks) == checks_asked


async def test_no_reply_times_out_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a reply the wait ends in a TimeoutError, the future left for the caller to drop."""
    transport = _transport()
    monkeypatch.setattr(transport._replies, "check_lost_log", lambda: None)
    fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await transport._await_reply(fut, 0.3)
    assert not fut.done()


async def test_one_check_at_a_time_for_every_waiting_request() -> None:
    """Many requests waiting ask for checks; the reader runs one, and none within a second of it."""
    transport = _transport()
    replies = transport._replies
    replies.check_lost_log()
    first = replies._checking
    for _ in range(10):
        replies.check_lost_log()
    assert replies._checking is first
    await asyncio.sleep(0)  # (it ends at once: no consumer)
    replies.check_lost_log()
    assert replies._checking is first  # within LOST_LOG_CHECK_S of the last
    await replies.close()
