"""Lanes (consumers.lanes): which records of a batch go to a lane, are applied inline or wait,
and what the subscriber does to its partitions' positions, pauses and commits meanwhile, with
a recording double of the consumer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError

import consumers.lanes as lanes_module
from consumers.lanes import Lanes, owner_for, plan
from memory.embed_order import background


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int
    value: bytes
    key: bytes | None = b"k"


def recs(partition: int, *sizes: int, start: int = 0, topic: str = "docs", key: bytes | None = b"k") -> list[Rec]:
    return [Rec(topic, partition, start + i, b"x" * n, key) for i, n in enumerate(sizes)]


def one(partition: int, offset: int, key: bytes | None, size: int = 10) -> Rec:
    return Rec("docs", partition, offset, b"x" * size, key)


TP0, TP1 = TopicPartition("docs", 0), TopicPartition("docs", 1)


@dataclass
class Consumer:
    """What the lanes call on aiokafka's consumer, recorded."""

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
        assert not self.gone
        if self.fail_commit:
            raise CommitFailedError("rebalanced")
        self.calls.append(("commit", offsets))

    def commits(self) -> list[dict[TopicPartition, int]]:
        return [arg for name, arg in self.calls if name == "commit"]


class Applier:
    """An ``apply`` that records what it applied and holds batches holding a given record."""

    def __init__(self) -> None:
        self.applied: list[Rec] = []
        self.gates: dict[int, asyncio.Event] = {}  # offset -> released
        self.fail_once: set[int] = set()

    def gate(self, offset: int) -> asyncio.Event:
        return self.gates.setdefault(offset, asyncio.Event())

    async def __call__(self, records: Any) -> None:
        for r in records:
            if r.offset in self.gates:
                await self.gates[r.offset].wait()
            if r.offset in self.fail_once:
                self.fail_once.discard(r.offset)
                raise RuntimeError("redis went away")
        self.applied.extend(records)


def test_a_heavy_batchs_partitions_go_to_lanes() -> None:
    small, heavy = recs(0, 10, 10), recs(1, 600, 600)
    batch = [small[0], heavy[0], small[1], heavy[1]]
    p = plan(batch, min_bytes=1000, room=4)
    # Its small records are applied inline all the same: they do not wait for the heavy ones.
    assert p.inline == small and p.lanes == {("docs", 1): heavy} and p.holds == {}
    # A bulk load spread over the partitions, none of them heavy alone, is as heavy as one document.
    spread = [r for i in range(4) for r in recs(i, 300, start=i)]
    assert set(plan(spread, min_bytes=1000, room=4).lanes) == {("docs", i) for i in range(4)}
    # A light batch is applied inline.
    p = plan(spread[:3], min_bytes=1000, room=4)
    assert (p.inline, p.lanes) == (spread[:3], {})


def test_in_a_heavy_batch_a_small_record_waits_only_for_its_own_key_and_a_keyless_one() -> None:
    bulk = [one(0, 1, b"a", 600), one(0, 2, b"small"), one(0, 3, b"a", 5), one(0, 4, None, 5), one(0, 5, b"b", 5)]
    p = plan(bulk, min_bytes=600, room=4)
    # "a" is bound to the lane, so its small record follows it; after a keyless one, everything.
    assert [r.offset for r in p.inline] == [2] and [r.offset for r in p.lanes[("docs", 0)]] == [1, 3, 4, 5]
    # Small records are inline up to a budget (min_bytes / 8 in all); the rest go to the lane.
    many = [one(0, 1, b"big", 900), *(one(0, i, f"k{i}".encode(), 30) for i in range(2, 12))]
    p = plan(many, min_bytes=1000, room=4)
    assert [r.offset for r in p.inline] == [2, 3, 4, 5] and len(p.lanes[("docs", 0)]) == 7
    # Beside a running lane, a heavy batch holds the partition from its first record bound to a lane.
    p = plan(
        [one(0, 7, b"small"), *recs(0, 600, 600, start=8, key=b"c")],
        min_bytes=1000,
        room=4,
        running={("docs", 0): {b"x"}},
    )
    assert [r.offset for r in p.inline] == [7] and p.holds == {("docs", 0): 8} and p.lanes == {}


def test_no_room_keeps_records_inline_in_their_order() -> None:
    a, b, c = recs(0, 5000), recs(1, 3000), recs(2, 4000)
    batch = [*a, *b, *c]
    p = plan(batch, min_bytes=1000, room=2)
    assert list(p.lanes) == [("docs", 0), ("docs", 2)] and p.inline == b  # the heaviest first
    p = plan(batch, min_bytes=1000, room=0)
    assert (p.inline, p.lanes) == (batch, {})
    # The same partition number of another topic (topic tenancy) is another place.
    other = recs(0, 5000, topic="docs.t2")
    p = plan([*a, *other], min_bytes=1000, room=4, running={("docs", 0): {b"big"}})
    assert set(p.lanes) == {("docs.t2", 0)}


def test_beside_a_lane_only_what_keeps_its_order_with_the_lane_waits() -> None:
    running = {("docs", 0): {b"big"}}
    # Other keys are applied; from the lane's own key on, the partition is held.
    batch = [one(0, 10, b"a"), one(1, 3, b"big"), one(0, 11, b"big"), one(0, 12, b"b")]
    p = plan(batch, min_bytes=1000, room=4, running=running)
    assert p.inline == [batch[0], batch[1]] and p.holds == {("docs", 0): 11} and p.lanes == {}
    # A record without a key keeps its order with everything.
    p = plan([one(0, 10, b"a"), one(0, 11, None)], min_bytes=1000, room=4, running=running)
    assert [r.offset for r in p.inline] == [10] and p.holds == {("docs", 0): 11}
    # A large batch of the same partition waits for the lane rather than take a second one.
    heavy = recs(0, 600, 600, start=10, key=b"c")
    p = plan(heavy, min_bytes=1000, room=4, running=running)
    assert (p.inline, p.lanes, p.holds) == ([], {}, {("docs", 0): 10})


def test_a_turn_keeps_its_order_with_its_agent() -> None:
    owner = owner_for("transcripts")
    assert owner(b"planner/s1") == owner(b"planner") == b"planner" and owner(None) is None
    assert owner_for("documents")(b"a/b.md") == b"a/b.md"
    running = {("docs", 0): {b"planner"}}
    forget_all = one(0, 5, b"planner")  # an agent-wide forget waits for the lane's turns
    other = one(0, 4, b"scout/s9")
    p = plan([other, forget_all], min_bytes=1000, room=4, running=running, owner=owner)
    assert p.inline == [other] and p.holds == {("docs", 0): 5}


async def test_writes_after_a_lane_go_on_and_its_partition_is_committed_past_them_once_it_is_done() -> None:
    consumer, lanes, apply = Consumer(), Lanes("documents", min_bytes=1000, most=2), Applier()
    big = recs(0, 600, 600, start=40, key=b"big")
    apply.gate(40)
    await lanes.apply(consumer, big, apply)
    assert lanes.running == 1 and consumer.calls == []  # not paused: the partition is read on
    assert list(lanes.now()) == ["docs/0"] and lanes.now()["docs/0"].startswith("applying 2 record(s), 1 KiB, for ")
    # A small write of another key on the same partition, and one on another partition.
    await lanes.apply(consumer, [one(0, 42, b"small"), one(1, 7, b"other")], apply)
    assert [r.offset for r in apply.applied] == [42, 7]
    # Partition 0 is committed up to the lane's first record only: a crash delivers it again.
    assert consumer.commits() == [{TP0: 40, TP1: 8}]
    apply.gate(40).set()
    await lanes.settle({("docs", 1)})  # no lane there: returns at once
    await _lane_done(lanes)
    assert consumer.commits()[-1] == {TP0: 43}  # past the small write applied meanwhile
    assert ("resume", TP0) not in consumer.calls and lanes.now() == {}


async def test_a_record_of_the_lanes_key_holds_its_partition_until_the_lane_is_done() -> None:
    consumer, lanes, apply = Consumer(), Lanes("documents", min_bytes=1000, most=2), Applier()
    apply.gate(40)
    await lanes.apply(consumer, recs(0, 1200, start=40, key=b"big"), apply)
    await lanes.apply(consumer, [one(0, 41, b"small"), one(0, 42, b"big"), one(0, 43, b"later")], apply)
    assert [r.offset for r in apply.applied] == [41]
    assert consumer.calls[:2] == [("pause", TP0), ("seek", (TP0, 42))]  # 42 and 43 fetched again later
    assert lanes.now()["docs/0"].endswith("later records held from offset 42")
    apply.gate(40).set()
    await _lane_done(lanes)
    assert consumer.commits() == [{TP0: 40}, {TP0: 42}] and consumer.calls[-1] == ("resume", TP0)


async def test_a_failed_lane_is_fetched_again_and_its_floor_stands_till_it_is_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lanes_module, "RETRY_S", 0.01)
    consumer, lanes, apply = Consumer(), Lanes("documents", min_bytes=1000, most=2), Applier()
    apply.fail_once.add(7)
    await lanes.apply(consumer, recs(0, 1200, start=7, key=b"big"), apply)
    await _lane_done(lanes)
    assert consumer.calls == [("pause", TP0), ("seek", (TP0, 7)), ("resume", TP0)]
    # A batch of an earlier fetch, past the failed lane, is applied but not committed past it.
    await lanes.apply(consumer, [one(0, 8, b"small")], apply)
    assert consumer.commits() == [{TP0: 7}]
    # Fetched again from the lane's first record (small enough now to go inline): committed past.
    await lanes.apply(consumer, [one(0, 7, b"big"), one(0, 8, b"small")], apply)
    assert consumer.commits()[-1] == {TP0: 9}


async def test_a_failed_batch_puts_its_partitions_back_to_their_first_records() -> None:
    consumer, lanes, apply = Consumer(), Lanes("documents", min_bytes=1000, most=2), Applier()
    apply.fail_once.add(6)
    with pytest.raises(RuntimeError):
        await lanes.apply(consumer, [one(0, 5, b"a"), one(1, 3, b"b"), one(0, 6, b"c")], apply)
    assert consumer.calls == [("seek", (TP0, 5)), ("seek", (TP1, 3))] and consumer.commits() == []


async def test_commits_never_go_back() -> None:
    """A lane's commit and a batch's may finish in either order: the lower one is not sent."""
    consumer, lanes, apply = Consumer(), Lanes("documents", min_bytes=1000, most=2), Applier()
    await lanes.apply(consumer, [one(0, 9, b"a")], apply)
    await lanes._commit(consumer, {("docs", 0): 5})
    assert consumer.commits() == [{TP0: 10}]


async def test_a_lane_that_finds_its_assignment_gone_ends_without_a_commit() -> None:
    """A pattern subscription that found a new topic drops the assignment until the group
    rejoins; aiokafka's commit then fails an assertion. The lane ends all the same, and its
    records are delivered again after the rejoin."""
    consumer, lanes = Consumer(), Lanes("documents", min_bytes=1, most=2)

    async def apply(_records: Any) -> None:
        consumer.gone = True

    lanes.start(consumer, ("docs", 0), recs(0, 10), apply)
    await lanes.settle({("docs", 0)})
    assert lanes.running == 0 and consumer.calls == []


async def test_a_commit_that_fails_still_resumes_a_held_partition() -> None:
    consumer, lanes, apply = Consumer(fail_commit=True), Lanes("documents", min_bytes=1000, most=1), Applier()
    apply.gate(0)
    await lanes.apply(consumer, recs(0, 1200, key=b"big"), apply)
    await lanes.apply(consumer, [one(0, 1, b"big")], apply)
    apply.gate(0).set()
    await lanes.settle({("docs", 0)})
    assert consumer.calls[-1] == ("resume", TP0) and consumer.commits() == []


async def test_close_waits_then_cancels_pauses_and_no_lane_starts_after_it() -> None:
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
    # Paused: the poll runs until the broker stops, and must not apply the lane's later records.
    assert consumer.calls == [("pause", TP0)]
    p = lanes.plan(recs(1, 10))
    assert p.lanes == {} and len(p.inline) == 1


def test_no_lanes_when_there_are_none() -> None:
    lanes = Lanes("documents", min_bytes=1, most=0)
    batch = recs(0, 5000)
    assert lanes.plan(batch).inline == batch


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


async def test_a_revocation_forgets_what_was_kept_of_its_partitions() -> None:
    """A partition owned again later starts from the group's commit, not this member's."""
    consumer, lanes, apply = Consumer(), Lanes("documents", min_bytes=1000, most=2), Applier()
    await lanes.apply(consumer, [one(0, 9, b"a")], apply)
    await lanes.settle({("docs", 0)})
    await lanes._commit(consumer, {("docs", 0): 5})
    assert consumer.commits() == [{TP0: 10}, {TP0: 5}]


async def _lane_done(lanes: Lanes, place: tuple[str, int] = ("docs", 0)) -> None:
    """Wait for the lane of ``place`` to end, keeping what the lanes hold of it (``settle``
    would forget it, as a revocation does)."""
    await asyncio.wait_for(asyncio.wait({lanes._lanes[place].task}), 5)
    assert lanes.running == 0


async def test_a_lanes_work_is_background_and_inline_work_is_not() -> None:
    """A lane's embedding requests let the other writes' go first (memory.embed_order)."""
    consumer, lanes = Consumer(), Lanes("documents", min_bytes=1000, most=2)
    seen: dict[int, bool] = {}

    async def apply(records: Any) -> None:
        seen[records[0].offset] = background()

    await lanes.apply(consumer, recs(0, 1200, start=3, key=b"big"), apply)
    await lanes.apply(consumer, [one(1, 9, b"small")], apply)
    await _lane_done(lanes)
    assert seen == {3: True, 9: False}


async def test_a_heavy_batchs_small_records_are_applied_before_its_lanes_start() -> None:
    """So a small record of a key is applied before the lane's later one of the same key, and a
    lane never commits past a small record of its batch that is not applied yet."""
    consumer, lanes, apply = Consumer(), Lanes("documents", min_bytes=600, most=2), Applier()
    apply.gate(11)
    batch = [one(0, 10, b"a", 600), one(0, 11, b"small"), one(0, 12, b"a", 5)]
    inline = asyncio.create_task(lanes.apply(consumer, batch, apply))
    await asyncio.sleep(0.01)
    assert lanes.running == 0 and apply.applied == []  # the lane waits for the small record
    apply.gate(11).set()
    apply.gate(10)
    await inline
    assert lanes.running == 1
    apply.gate(10).set()
    await _lane_done(lanes)
    assert [r.offset for r in apply.applied] == [11, 10, 12]
    assert consumer.commits() == [{TP0: 10}, {TP0: 13}]


async def test_a_failed_small_record_puts_its_batchs_lane_records_back_too() -> None:
    """The lane is not started: nothing of the batch is committed, and all of it comes again."""
    consumer, lanes, apply = Consumer(), Lanes("documents", min_bytes=600, most=2), Applier()
    apply.fail_once.add(11)
    with pytest.raises(RuntimeError):
        await lanes.apply(consumer, [one(0, 10, b"a", 600), one(0, 11, b"small")], apply)
    assert lanes.running == 0 and consumer.calls == [("seek", (TP0, 10))] and consumer.commits() == []


async def test_a_put_back_never_skips_another_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lane fails (back to 10); the batch in hand fails too (back to 12): the partition is
    fetched again from 10, and only a fetch from there ends it."""
    monkeypatch.setattr(lanes_module, "RETRY_S", 0.05)
    consumer, lanes, apply = Consumer(), Lanes("documents", min_bytes=600, most=2), Applier()
    apply.fail_once |= {10, 12}
    await lanes.apply(consumer, [one(0, 10, b"a", 700)], apply)  # the lane, failing
    await asyncio.sleep(0.01)
    with pytest.raises(RuntimeError):
        await lanes.apply(consumer, [one(0, 12, b"b")], apply)  # fetched before the put-back
    seeks = [arg[1] for name, arg in consumer.calls if name == "seek"]
    assert seeks == [10, 10] and consumer.commits() == []
    await _lane_done(lanes)
    assert consumer.calls[-1] == ("resume", TP0)
    # Fetched from 10 again: small enough now for inline, and committed past all of it.
    await lanes.apply(consumer, [one(0, 10, b"a"), one(0, 11, b"x"), one(0, 12, b"b")], apply)
    assert consumer.commits() == [{TP0: 13}]
