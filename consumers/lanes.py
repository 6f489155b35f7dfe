"""Lanes: a partition's large batch applied beside the poll, so the others go on.

An ingest subscriber applies a batch before it polls again, so a large document would hold
the writes of every partition it reads. A partition whose records in a batch weigh
``ingest_lane_min_bytes`` or more is applied in a task of its own instead (decision 0061):
the partition is paused and its position put back to the first of those records, so no
commit of the batches polled meanwhile passes them, and once they are applied its offset is
committed and the partition resumed. Order per partition, and so per key, is kept: nothing
more of the partition is fetched until its lane is done. A revocation waits for the lanes of
the partitions it takes (as for the batch in hand), and a stop waits ``shutdown_timeout_s``
for them, then cancels them, leaving their partitions paused: what a cancelled lane did not
commit is delivered again at the next start, as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from memory.metrics import INGEST_LANES
from memory.retrying import pause

log = structlog.get_logger()

#: A partition of a topic, as (topic, partition).
Place = tuple[str, int]

#: How long a lane that failed (an outage past the ingestor's own retries) waits before its
#: records are fetched again: FastStream's own redelivery of a failed batch is at once.
RETRY_S = 1.0


def split(
    records: Sequence[Any], *, min_bytes: int, room: int, busy: Collection[Place] = ()
) -> tuple[list[Any], dict[Place, list[Any]]]:
    """``records`` (one batch, in order) as (applied inline, by partition for a lane).

    A partition goes to a lane when its records weigh ``min_bytes`` or more (the bytes of their
    values), the heaviest first, ``room`` of them at most; ``busy`` partitions (a lane of theirs
    still running: records fetched before it paused them) are never given a second one, so
    their records stay inline. Each partition's records keep their order.
    """
    by_place: dict[Place, list[Any]] = {}
    for r in records:
        by_place.setdefault((r.topic, r.partition), []).append(r)
    weight = {p: sum(len(r.value or b"") for r in rs) for p, rs in by_place.items()}
    heavy = sorted((p for p, w in weight.items() if w >= min_bytes and p not in busy), key=lambda p: -weight[p])
    chosen = set(heavy[: max(room, 0)])
    inline = [r for r in records if (r.topic, r.partition) not in chosen]
    return inline, {p: by_place[p] for p in by_place if p in chosen}


@dataclass(frozen=True)
class _Lane:
    task: asyncio.Task[None]
    since: float  # wall clock
    records: int
    size: int  # the bytes of the records' values


class Lanes:
    """The lanes of one ingest subscriber (see the module's docstring)."""

    def __init__(self, role: str, *, min_bytes: int, most: int) -> None:
        self.role = role
        self.min_bytes = min_bytes
        self.most = most
        self._lanes: dict[Place, _Lane] = {}  # the running ones
        self._closed = asyncio.Event()

    @property
    def running(self) -> int:
        """Lanes not finished."""
        return len(self._lanes)

    def now(self) -> dict[str, str]:
        """What each running lane applies, for people, by ``topic/partition`` (the status page's
        lag table: a partition whose lag stands still while its lane runs is no stuck one)."""
        at = time.time()
        return {
            f"{topic}/{partition}": f"applying {lane.records} record(s), {lane.size / 1024:.0f} KiB, "
            f"for {at - lane.since:.0f} s"
            for (topic, partition), lane in list(self._lanes.items())
        }

    def split(self, records: Sequence[Any]) -> tuple[list[Any], dict[Place, list[Any]]]:
        """``split`` with this subscriber's settings and free lanes (none once closed)."""
        room = 0 if self._closed.is_set() else self.most - len(self._lanes)
        return split(records, min_bytes=self.min_bytes, room=room, busy=self._lanes.keys())

    def start(
        self, consumer: Any, place: Place, records: Sequence[Any], apply: Callable[[Sequence[Any]], Awaitable[None]]
    ) -> None:
        """Pause ``place`` on ``consumer`` at its first record of ``records`` and apply them in a
        task (records fetched for it meanwhile are dropped by the seek, and never returned)."""
        tp = TopicPartition(*place)
        consumer.pause(tp)
        consumer.seek(tp, records[0].offset)  # FastStream's commit after this batch stops here
        size = sum(len(r.value or b"") for r in records)
        log.info(
            "ingest.lane_started",
            subscriber=self.role,
            topic=place[0],
            partition=place[1],
            records=len(records),
            bytes=size,
        )
        task = asyncio.create_task(self._run(consumer, tp, records, apply), name=f"lane-{place[0]}-{place[1]}")
        task.add_done_callback(self._ended)
        self._lanes[place] = _Lane(task=task, since=time.time(), records=len(records), size=size)
        INGEST_LANES.labels(self.role).inc()

    async def _run(
        self,
        consumer: Any,
        tp: TopicPartition,
        records: Sequence[Any],
        apply: Callable[[Sequence[Any]], Awaitable[None]],
    ) -> None:
        after = records[-1].offset + 1
        try:
            await apply(records)
        except Exception as exc:
            # Left where it was paused: resumed below, the records are fetched and applied again.
            log.warning(
                "ingest.lane_failed",
                subscriber=self.role,
                topic=tp.topic,
                partition=tp.partition,
                error=f"{type(exc).__name__}: {exc}",
            )
            await pause(self._closed, RETRY_S)
        else:
            try:
                consumer.seek(tp, after)
                # Committed now, not with the next batch: there may be none for long, and
                # ``up``'s drain and the lag read what is committed.
                await consumer.commit({tp: after})
            except (KafkaError, IllegalStateError, AssertionError) as exc:
                # AssertionError: aiokafka's own check, when a pattern subscription found a new
                # topic (a tenant's) and the assignment is gone until the group rejoins.
                # Applied: a later batch's commit covers it, or it is delivered again and
                # found already written.
                log.warning(
                    "ingest.lane_commit_failed",
                    subscriber=self.role,
                    topic=tp.topic,
                    partition=tp.partition,
                    error=f"{type(exc).__name__}: {exc}",
                )
            log.info("ingest.lane_finished", subscriber=self.role, topic=tp.topic, partition=tp.partition)
        finally:
            self._lanes.pop((tp.topic, tp.partition), None)
            INGEST_LANES.labels(self.role).dec()
            # Not once closed: the daemon stops, and the poll, still running until the broker
            # stops, would fetch a cancelled lane's records again and apply them inline.
            if not self._closed.is_set():
                with contextlib.suppress(IllegalStateError, AssertionError):  # revoked meanwhile
                    consumer.resume(tp)

    def _ended(self, task: asyncio.Task[None]) -> None:
        # ``_run`` catches what it expects; anything else is a bug, and never silent.
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error(
                "ingest.lane_crashed", subscriber=self.role, task=task.get_name(), error=f"{type(exc).__name__}: {exc}"
            )

    async def settle(self, places: Collection[Place]) -> None:
        """Wait for the lanes of ``places`` (a revocation: they are applied before the
        partitions move to another daemon)."""
        tasks = [lane.task for p, lane in list(self._lanes.items()) if p in places]
        if tasks:
            log.info("ingest.lanes_awaited", subscriber=self.role, lanes=len(tasks))
            await asyncio.wait(tasks)

    async def close(self, timeout_s: float, cut: asyncio.Event | None = None) -> None:
        """Start no lane more; wait up to ``timeout_s`` (less once ``cut`` is set: ``up``'s
        second Ctrl-C) for those running, then cancel them (their records are delivered again)."""
        self._closed.set()
        tasks = [lane.task for lane in self._lanes.values()]
        if not tasks:
            return
        all_done: asyncio.Future[list[Any]] = asyncio.gather(*tasks, return_exceptions=True)
        cutting: asyncio.Future[Any] = asyncio.ensure_future((cut or asyncio.Event()).wait())
        try:
            await asyncio.wait([all_done, cutting], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cutting.cancel()
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            log.warning("ingest.lanes_cancelled", subscriber=self.role, lanes=len(pending))
            await asyncio.wait(pending)
