"""The ingest subscribers' rebalance listener (consumers.assignment.AssignmentWatcher): records of
partitions revoked before their batch was handled are left to the new owner, and their
positions put back so that the commit after the batch does not pass them."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError

from consumers.assignment import AssignmentWatcher


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int


@dataclass
class Consumer:
    seeks: list[tuple[TopicPartition, int]] = field(default_factory=list)
    unassigned: bool = False

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if self.unassigned:
            raise IllegalStateError("No current assignment for partition")
        self.seeks.append((tp, offset))


def watcher() -> AssignmentWatcher:
    return AssignmentWatcher("documents", lambda _name, _n: None)


async def test_records_revoked_before_their_batch_is_handled_are_not_committed_past() -> None:
    w = watcher()
    await w.on_partitions_assigned([TopicPartition("docs", 0), TopicPartition("docs", 1)])
    batch = [Rec("docs", 0, 5), Rec("docs", 1, 9), Rec("docs", 1, 10), Rec("docs", 0, 6)]
    await w.on_partitions_revoked([TopicPartition("docs", 1)])  # between the poll and the handler
    consumer = Consumer()
    async with w.handling(batch, consumer) as kept:  # type: ignore[arg-type]
        assert kept == [batch[0], batch[3]]
    assert consumer.seeks == [(TopicPartition("docs", 1), 9)]


async def test_nothing_is_rewound_when_every_record_is_owned_or_the_assignment_is_gone() -> None:
    w = watcher()
    await w.on_partitions_assigned([TopicPartition("docs", 0)])
    consumer = Consumer()
    async with w.handling([Rec("docs", 0, 1)], consumer) as kept:  # type: ignore[arg-type]
        assert len(kept) == 1
    assert consumer.seeks == []
    await w.on_partitions_revoked([TopicPartition("docs", 0)])
    gone = Consumer(unassigned=True)  # the new assignment is in: nothing of the old one is committed
    async with w.handling([Rec("docs", 0, 2)], gone) as kept:  # type: ignore[arg-type]
        assert kept == []
