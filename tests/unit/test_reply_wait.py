"""How a request waits for its reply (pure: nothing connects): the lost-log check runs beside
the wait, once a second at most, and never costs a reply that came; a paused reader's move to
the end, which a broker that is down holds, is left or ended cleanly."""

from __future__ import annotations

import asyncio

import pytest

from consumers.reply_reader import ReplyReader
from consumers.transport import KafkaTransport
from memory.errors import BackendUnavailable


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


class _DeadBrokerConsumer:
    """A paused reply consumer whose move to the end never completes, as with the broker down."""

    def __init__(self) -> None:
        self.paused = self.resumed = 0
        self.move = asyncio.Event()  # set: the broker is back

    def assignment(self) -> set[int]:
        return {0}

    def pause(self, *tps: object) -> None:
        self.paused += 1

    def resume(self, *tps: object) -> None:
        self.resumed += 1

    async def seek_to_end(self, *tps: object) -> None:
        await self.move.wait()

    async def position(self, tp: object) -> int:
        return 0

    async def stop(self) -> None:
        pass


def _paused_reader(idle_pause_s: float) -> tuple[ReplyReader, _DeadBrokerConsumer]:
    reader = ReplyReader(
        bootstrap="127.0.0.1:1", topic="r", partition=None, fetch_wait_ms=5, idle_pause_s=idle_pause_s, kafka_options={}
    )
    consumer = _DeadBrokerConsumer()
    reader._consumer = consumer  # type: ignore[assignment]
    reader._reader = asyncio.create_task(asyncio.sleep(3600))
    reader._pause()
    assert reader._paused is consumer
    return reader, consumer


async def test_a_reader_woken_during_an_outage_pauses_again_once_the_broker_is_back() -> None:
    """The request gave up at its deadline, so its pause timer fired while the reader was still
    paused; resumed when the move completed, it polled ~200 times a second until the next call."""
    reader, consumer = _paused_reader(idle_pause_s=0.05)
    fut = reader.expect("a")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await reader.wake()
    reader.done_with("a", fut)
    await asyncio.sleep(0.1)  # its pause timer fires while the move still waits
    consumer.move.set()
    await asyncio.sleep(0.01)
    assert consumer.resumed == 1 and reader._paused is None
    await asyncio.sleep(0.1)
    assert reader._paused is consumer and consumer.paused == 2  # paused again
    await reader.close()


async def test_a_request_waiting_on_the_move_when_the_client_closes_is_told_so() -> None:
    """close() cancels the move; the request waiting on it, which nobody cancelled, got a bare
    CancelledError, which task groups and run_coroutine_threadsafe take for a cancellation."""
    reader, _ = _paused_reader(idle_pause_s=5)
    waiting = asyncio.create_task(reader.wake())
    await asyncio.sleep(0.05)
    await reader.close()
    with pytest.raises(BackendUnavailable, match="was closed"):
        await waiting
    # A request cancelled itself is still cancelled.
    reader, _ = _paused_reader(idle_pause_s=5)
    cancelled = asyncio.create_task(reader.wake())
    await asyncio.sleep(0.05)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await reader.close()
