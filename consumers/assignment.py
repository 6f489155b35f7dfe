"""Which partitions a subscriber holds, and a batch's hold on revoking them: the rebalance
listener of every subscriber (aiokafka calls it beside the handler, not after it)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from typing import Any

import structlog
from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import IllegalStateError

from consumers.lanes import Lanes

log = structlog.get_logger()


class AssignmentWatcher(ConsumerRebalanceListener):  # type: ignore[misc]
    """Notes which consumers hold an assignment, so the daemon can say whether it is ready:
    between a revocation (a rebalance, a lost group, a stop) and the next assignment a
    consumer takes nothing."""

    def __init__(
        self,
        name: str,
        on_assigned: Callable[[str, int], None],
        on_revoked: Callable[[str], None] | None = None,
        *,
        lanes: Lanes | None = None,
    ) -> None:
        self.name = name
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        # The subscriber's large batches applied beside the poll; a revocation waits for them too.
        self.lanes = lanes
        # Held by the subscriber's handler while it applies a batch (see ``handling``).
        self._busy = asyncio.Lock()
        self._owned: set[tuple[str, int]] = set()

    @contextlib.asynccontextmanager
    async def handling(
        self, records: Sequence[ConsumerRecord[Any, Any]], consumer: Any = None
    ) -> AsyncIterator[list[Any]]:
        """Hold off revocations while a batch is applied; yields the records of partitions
        this consumer still owns.

        Why: aiokafka runs a rebalance beside the handler, not after it. Without this, a
        daemon that lost a partition to a new member would go on writing its batch while the
        new owner replayed the partition from the last commit and applied what came next: a
        forgotten turn written back after its forget, a corrected turn overwritten by the old
        one, for good (turns carry no version to refuse them). So the revocation waits for the
        batch (the group's rebalance with it: within the rebalance timeout, the poll
        interval), and records fetched before a revocation but handled after it are left to
        their new owner (nothing of theirs is committed here: the consumer commits only
        partitions it holds).
        """
        async with self._busy:
            kept = [r for r in records if (r.topic, r.partition) in self._owned]
            if len(kept) < len(records):
                log.info("consumer.revoked_records_skipped", subscriber=self.name, records=len(records) - len(kept))
                if consumer is not None:
                    rewind(consumer, [r for r in records if (r.topic, r.partition) not in self._owned])
            yield kept

    async def on_partitions_revoked(self, revoked: Collection[Any]) -> None:
        """Give ``revoked`` up once the batch in hand is applied (aiokafka's rebalance callback)."""
        places = {(tp.topic, tp.partition) for tp in revoked}
        async with self._busy:  # the batch in hand is finished first, and the lanes of these partitions
            if self.lanes is not None:
                await self.lanes.settle(places)
            self._owned -= places
        log.info("consumer.partitions_revoked", subscriber=self.name, partitions=len(revoked))
        if self._on_revoked is not None:
            self._on_revoked(self.name)

    async def on_partitions_assigned(self, assigned: Collection[Any]) -> None:
        """Own ``assigned`` from now on (aiokafka's rebalance callback)."""
        self._owned |= {(tp.topic, tp.partition) for tp in assigned}
        log.info("consumer.partitions_assigned", subscriber=self.name, partitions=len(assigned))
        self._on_assigned(self.name, len(assigned))


def rewind(consumer: Any, skipped: Sequence[ConsumerRecord[Any, Any]]) -> None:
    """Put each partition of ``skipped`` (records left to their new owner) back to its first
    one: the commit after the batch reads the positions, and the old assignment, with them
    past these records, stands until the group has rejoined. Committed so, in the rebalance's
    first phase (a member of the current generation may still commit), the new owner would
    start after records nobody applied."""
    first: dict[tuple[str, int], int] = {}
    for r in skipped:
        first[(r.topic, r.partition)] = min(r.offset, first.get((r.topic, r.partition), r.offset))
    for (topic, partition), offset in first.items():
        # IllegalStateError / AssertionError: the assignment is gone already, and commits nothing.
        with contextlib.suppress(IllegalStateError, AssertionError):
            consumer.seek(TopicPartition(topic, partition), offset)
