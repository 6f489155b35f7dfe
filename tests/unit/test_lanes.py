"""Lanes (consumers.lanes): which partitions of a batch go to a lane, and what a lane does to
its partition's position, commit and pause, with a recording double of the consumer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError

import consumers.lanes as lanes_module
from consumers.lanes import Lanes, split


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int
    value: bytes


def recs(partition: int, *sizes: int, start: int = 0, topic: str = "docs") -> list[Rec]:
    return [Rec(topic, partition, start + i, b"x" * n) for i, n in enumerate(sizes)]


@dataclass
class Consumer:
    """What a lane calls on aiokafka's consumer, recorded."""

    calls: list[tuple[str, Any]] = field(default_factory=list)
    fail_commit: bool = False
    gone: bool = False  # the assignment dropped (aiokafka asserts it is there)

    def pause(self, tp: TopicPartition) -> None:
        self.calls.append(("pause", tp))

    def resume(self, tp: TopicPartition) -> None:
        assert not self.gone
        self.calls.append(("resume", tp))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        assert not self.gone
        self.calls.append(("seek", (tp, offset)))

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.fail_commit:
            raise CommitFailedError("rebalanced")
        self.calls.append(("commit", offsets))


def test_a_partition_goes_to_a_lane_by_the_weight_of_its_records_in_the_batch() -> None:
    small, heavy = recs(0, 10, 10), recs(1, 600, 600)
    batch = [small[0], heavy[0], small[1], heavy[1]]
    inline, lanes = split(batch, min_bytes=1000, room=4)
    assert inline == small and lanes == {("docs", 1): heavy}
    # Many small records of one partition weigh as much as one large one.
    many = recs(2, *[100] * 10)
    inline, lanes = split(many, min_bytes=1000, room=4)
    assert (inline, lanes) == ([], {("docs", 2): many})


def test_no_room_or_a_busy_partition_keeps_records_inline_in_their_order() -> None:
    a, b, c = recs(0, 5000), recs(1, 3000), recs(2, 4000)
    batch = [*a, *b, *c]
    inline, lanes = split(batch, min_bytes=1000, room=2)
    assert list(lanes) == [("docs", 0), ("docs", 2)] and inline == b  # the heaviest first
    inline, lanes = split(batch, min_bytes=1000, room=0)
    assert (inline, lanes) == (batch, {})
    inline, lanes = split(batch, min_bytes=1000, room=4, busy={("docs", 0)})
    assert inline == a and set(lanes) == {("docs", 1), ("docs", 2)}
    # The same partition number of another topic (topic tenancy) is another place.
    other = recs(0, 5000, topic="docs.t2")
    _inline, lanes = split([*a, *other], min_bytes=1000, room=4, busy={("docs", 0)})
    assert set(lanes) == {("docs.t2", 0)}


async def test_a_lane_pauses_at_its_first_record_and_commits_past_its_last_once_applied() -> None:
    consumer, lanes = Consumer(), Lanes("documents", min_bytes=1, most=2)
    mine = recs(1, 10, 10, start=40)
    applied = asyncio.Event()
    go = asyncio.Event()

    async def apply(records: Any) -> None:
        assert list(records) == mine
        await go.wait()
        applied.set()

    lanes.start(consumer, ("docs", 1), mine, apply)
    tp = TopicPartition("docs", 1)
    assert consumer.calls == [("pause", tp), ("seek", (tp, 40))]  # before any await: no commit passes it
    assert lanes.running == 1
    assert list(lanes.now()) == ["docs/1"] and lanes.now()["docs/1"].startswith("applying 2 record(s), 0 KiB, for ")
    _inline, more = lanes.split(recs(1, 10, start=42))
    assert more == {}  # one lane per partition
    go.set()
    await lanes.settle({("docs", 1)})
    assert applied.is_set() and lanes.running == 0 and lanes.now() == {}
    assert consumer.calls[2:] == [("seek", (tp, 42)), ("commit", {tp: 42}), ("resume", tp)]


async def test_a_failed_lane_commits_nothing_and_resumes_where_it_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lanes_module, "RETRY_S", 0.01)
    consumer, lanes = Consumer(), Lanes("documents", min_bytes=1, most=2)

    async def apply(_records: Any) -> None:
        raise RuntimeError("redis went away")

    lanes.start(consumer, ("docs", 0), recs(0, 10, start=7), apply)
    await lanes.settle({("docs", 0)})
    tp = TopicPartition("docs", 0)
    assert consumer.calls == [("pause", tp), ("seek", (tp, 7)), ("resume", tp)]


async def test_a_lane_that_finds_its_assignment_gone_ends_without_a_commit() -> None:
    """A pattern subscription that found a new topic drops the assignment until the group
    rejoins; aiokafka's seek and resume then fail an assertion. The lane ends all the same,
    and its records are delivered again after the rejoin."""
    consumer, lanes = Consumer(), Lanes("documents", min_bytes=1, most=2)
    tp = TopicPartition("docs", 0)

    async def apply(_records: Any) -> None:
        consumer.gone = True

    lanes.start(consumer, ("docs", 0), recs(0, 10), apply)
    await lanes.settle({("docs", 0)})
    assert lanes.running == 0 and consumer.calls == [("pause", tp), ("seek", (tp, 0))]


async def test_a_commit_that_fails_still_resumes_the_partition() -> None:
    consumer, lanes = Consumer(fail_commit=True), Lanes("documents", min_bytes=1, most=1)

    async def apply(_records: Any) -> None:
        return None

    lanes.start(consumer, ("docs", 0), recs(0, 10), apply)
    await lanes.settle({("docs", 0)})
    assert consumer.calls[-1] == ("resume", TopicPartition("docs", 0))


async def test_close_waits_then_cancels_and_no_lane_starts_after_it() -> None:
    consumer, lanes = Consumer(), Lanes("documents", min_bytes=1, most=4)
    cancelled = asyncio.Event()

    async def forever(_records: Any) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    lanes.start(consumer, ("docs", 0), recs(0, 10), forever)
    await asyncio.sleep(0)
    await lanes.close(timeout_s=0.05)
    assert cancelled.is_set() and lanes.running == 0
    tp = TopicPartition("docs", 0)
    # Left paused: the poll runs until the broker stops, and must not apply it again inline.
    assert consumer.calls == [("pause", tp), ("seek", (tp, 0))]
    inline, more = lanes.split(recs(1, 10))
    assert more == {} and len(inline) == 1


def test_no_lanes_when_there_are_none() -> None:
    lanes = Lanes("documents", min_bytes=1, most=0)
    batch = recs(0, 5000)
    assert lanes.split(batch) == (batch, {})


async def test_a_cut_ends_the_wait_of_a_close_at_once() -> None:
    """``up``'s second Ctrl-C: the stop does not wait the shutdown timeout for a lane."""
    consumer, lanes = Consumer(), Lanes("documents", min_bytes=1, most=4)

    async def forever(_records: Any) -> None:
        await asyncio.sleep(3600)

    lanes.start(consumer, ("docs", 0), recs(0, 10), forever)
    cut = asyncio.Event()
    closing = asyncio.ensure_future(lanes.close(timeout_s=3600, cut=cut))
    await asyncio.sleep(0.05)
    assert not closing.done()  # waiting for the lane
    cut.set()
    await asyncio.wait_for(closing, timeout=5)
    assert lanes.running == 0
