"""Lanes: a partition's large batch applied beside the poll, so the other writes go on.

An ingest subscriber applies a batch before it polls again, so a large document would hold
every write after it. A partition whose records in a batch weigh ``ingest_lane_min_bytes`` or
more is applied in a task of its own instead (decisions 0061 and 0063), and the partition goes
on being read. A later record of it is applied at once unless it must keep its order behind
the lane's: a record of one of the lane's keys (for transcripts, of one of its agents), a
record without a key, or a large batch of its own. The partition is then held (paused, and
put back to that record) until the lane is done.

Kafka keeps one committed offset per partition. While a lane runs, its partition is committed
up to the lane's first record and no further, so a crash delivers again the lane and what was
applied after it (found written, acked again, nothing written twice). Once the lane is written,
its partition is committed past everything applied meanwhile. So these subscribers commit their
own offsets (FastStream's manual ack policy): after each batch, and on a failure they put each
of its partitions back to its first record of the batch, as FastStream's nack does.

A revocation waits for the lanes of the partitions it takes (as for the batch in hand), and a
stop waits ``shutdown_timeout_s`` for them, then cancels them and pauses their partitions:
what a cancelled lane did not commit is delivered again at the next start, as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from memory.embed_order import in_background
from memory.metrics import INGEST_LANES
from memory.retrying import pause

log = structlog.get_logger()

#: A partition of a topic, as (topic, partition).
Place = tuple[str, int]

#: What a record keeps its order with, from its Kafka key (``None``: with everything).
Owner = Callable[[bytes | None], bytes | None]

#: In a heavy batch, a record of at most ``min_bytes`` / this is small (4 KiB at the default,
#: half a second of embedding here), and small records of at most ``min_bytes`` / the next in
#: all (16 KiB) are applied inline: a small write that came in with a bulk load does not wait
#: for its lane, and the poll is held for a second or two at most.
INLINE_RECORD_SHARE = 32
INLINE_BATCH_SHARE = 8

#: How long a lane that failed (an outage past the ingestor's own retries) waits before its
#: records are fetched again: FastStream's own redelivery of a failed batch is at once.
RETRY_S = 1.0

#: What a commit may fail with: a rebalance (KafkaError), or an assignment aiokafka dropped
#: while a pattern subscription found a new topic (a tenant's), which it asserts.
_COMMIT_ERRORS = (KafkaError, IllegalStateError, AssertionError)


def _whole_key(key: bytes | None) -> bytes | None:
    return key


def _agent_of(key: bytes | None) -> bytes | None:
    # A turn is keyed ``agent_id/session_id`` and an agent-wide forget ``agent_id``: the forget
    # must wait for the turns of every session of its agent that a lane still writes.
    return None if key is None else key.split(b"/", 1)[0]


def owner_for(role: str) -> Owner:
    """What the records of an ingest subscriber (by role) keep their order with."""
    return _agent_of if role == "transcripts" else _whole_key


def _place(record: Any) -> Place:
    return (record.topic, record.partition)


@dataclass(frozen=True)
class Plan:
    """What one batch's records become: applied inline, lanes to start, partitions to hold."""

    inline: list[Any]
    lanes: dict[Place, list[Any]]
    holds: dict[Place, int]  # the partition is paused and put back to this offset


def plan(
    records: Sequence[Any],
    *,
    min_bytes: int,
    room: int,
    running: Mapping[Place, Collection[bytes | None]] | None = None,
    owner: Owner = _whole_key,
) -> Plan:
    """``records`` (one batch, in order) as inline records, new lanes and holds.

    A batch whose records weigh less than ``min_bytes`` (the bytes of their values) is applied
    inline. A heavier one (one large document, or a bulk load spread over every partition) is
    applied in lanes, a partition each, the heaviest first, ``room`` of them at most; past them
    inline. Its small records (at most ``min_bytes / INLINE_RECORD_SHARE`` each, ``min_bytes /
    INLINE_BATCH_SHARE`` in all, in order) are applied inline all the same, unless their owner
    (``owner`` of their key) has a record bound to a lane before them, or they have no key: a
    small write that came with a bulk load does not wait for it.

    A partition with a lane ``running`` (its owners) gets no second one: it is held from its
    first record that would go to a lane (in a light batch: of an owner of the running lane's,
    or without a key), and its records before that are inline. Each key's records keep their
    order, and a keyless record its order with all of its partition's.
    """
    running = running or {}
    heavy = sum(len(r.value or b"") for r in records) >= min_bytes
    budget, small = min_bytes // INLINE_BATCH_SHARE, min_bytes // INLINE_RECORD_SHARE
    owners: dict[Place, set[bytes | None]] = {}
    everything: set[Place] = set()  # a keyless record was bound: the rest of its partition follows
    bound: dict[Place, list[Any]] = {}
    for r in records:
        p, size, k = _place(r), len(r.value or b""), owner(r.key)
        mine = owners.setdefault(p, set(running.get(p, ())))
        follows = p in everything or k is None or k in mine  # must keep its order behind a lane
        to_lane = (follows or size > min(small, budget)) if heavy else (p in running and follows)
        if to_lane:
            bound.setdefault(p, []).append(r)
            if k is None:
                everything.add(p)
            mine.add(k)
        elif heavy:
            budget -= size
    holds = {p: rs[0].offset for p, rs in bound.items() if p in running}
    new = sorted((p for p in bound if p not in running), key=lambda p: -sum(len(r.value or b"") for r in bound[p]))
    chosen = set(new[: max(room, 0)])
    laned = {p: bound[p] for p in bound if p in chosen}
    gone = {id(r) for p in chosen for r in bound[p]}
    inline = [r for r in records if r.offset < holds.get(_place(r), r.offset + 1) and id(r) not in gone]
    return Plan(inline=inline, lanes=laned, holds=holds)


@dataclass(frozen=True)
class _Lane:
    task: asyncio.Task[None]
    since: float  # wall clock
    records: int
    size: int  # the bytes of the records' values
    owners: frozenset[bytes | None]


class Lanes:
    """The lanes, holds and commits of one ingest subscriber (see the module's docstring)."""

    def __init__(self, role: str, *, min_bytes: int, most: int) -> None:
        self.role = role
        self.min_bytes = min_bytes
        self.most = most
        self._owner = owner_for(role)
        self._lanes: dict[Place, _Lane] = {}  # not finished (a failed one until it has waited)
        self._failed: set[Place] = set()  # of those, the ones that failed
        self._held: dict[Place, int] = {}  # paused until their lane is done, from this offset
        # Where each partition was put back to and has not been fetched from since: a later
        # seek never goes past it, so no put-back skips another's records.
        self._refetch: dict[Place, int] = {}
        # Commits of a partition stay at or below its floor: a running lane's first record, or
        # a failed lane's until its records are applied again.
        self._floors: dict[Place, int] = {}
        self._applied: dict[Place, int] = {}  # past what was applied inline above a running lane's floor
        self._committed: dict[Place, int] = {}
        self._commit_lock = asyncio.Lock()
        self._closed = asyncio.Event()

    @property
    def running(self) -> int:
        """Lanes not finished."""
        return len(self._lanes)

    def _running(self, place: Place) -> bool:
        return place in self._lanes and place not in self._failed

    def now(self) -> dict[str, str]:
        """What each running lane applies, for people, by ``topic/partition`` (the status page's
        lag table: a partition's committed offset stays at its lane's first record meanwhile)."""
        at = time.time()
        out: dict[str, str] = {}
        for place, lane in list(self._lanes.items()):
            said = f"applying {lane.records} record(s), {lane.size / 1024:.0f} KiB, for {at - lane.since:.0f} s"
            if place in self._failed:
                said += "; failed, fetched again shortly"
            elif (held := self._held.get(place)) is not None:
                said += f"; later records held from offset {held}"
            out[f"{place[0]}/{place[1]}"] = said
        return out

    def plan(self, records: Sequence[Any]) -> Plan:
        """``plan`` with this subscriber's settings, free lanes (none once closed) and running ones."""
        room = 0 if self._closed.is_set() else self.most - len(self._lanes)
        running = {p: lane.owners for p, lane in self._lanes.items()}
        return plan(records, min_bytes=self.min_bytes, room=room, running=running, owner=self._owner)

    async def apply(
        self, consumer: Any, records: Sequence[Any], apply: Callable[[Sequence[Any]], Awaitable[None]]
    ) -> None:
        """Apply one batch (records of partitions this consumer owns): hold the partitions that
        must wait for a lane, apply the inline records, then start the batch's lanes and commit.
        A failure puts each partition of the batch back to its first record of it (the lanes'
        records too: they are not started) and is raised."""
        for r in records:  # fetched from where a partition was put back: the mark is reached
            if r.offset <= self._refetch.get(_place(r), -1):
                del self._refetch[_place(r)]
        planned = self.plan(records)
        for place, offset in planned.holds.items():
            self._hold(consumer, place, offset)
        bound = [r for rs in planned.lanes.values() for r in rs]
        if planned.inline:
            # Before the lanes start: a small record of a key applied beside its lane could
            # land after the lane's later one, and a lane could commit past it as it fails.
            try:
                await apply(planned.inline)
            except BaseException:
                self._rewind(consumer, [*planned.inline, *bound])
                raise
        for place, theirs in planned.lanes.items():
            self.start(consumer, place, theirs, apply)
        if planned.inline:
            await self._commit_applied(consumer, planned.inline)

    def _seek(self, consumer: Any, place: Place, offset: int) -> None:
        offset = min(offset, self._refetch.get(place, offset))
        self._refetch[place] = offset
        if place in self._held:
            self._held[place] = min(offset, self._held[place])
        with contextlib.suppress(IllegalStateError, AssertionError):  # revoked meanwhile
            consumer.seek(TopicPartition(*place), offset)

    def _hold(self, consumer: Any, place: Place, offset: int) -> None:
        with contextlib.suppress(IllegalStateError, AssertionError):  # revoked meanwhile
            consumer.pause(TopicPartition(*place))
        self._held[place] = min(offset, self._held.get(place, offset))
        self._seek(consumer, place, offset)  # what was fetched past it is dropped, and fetched again on resume
        log.info("ingest.partition_held", subscriber=self.role, topic=place[0], partition=place[1], offset=offset)

    def _rewind(self, consumer: Any, records: Sequence[Any]) -> None:
        first: dict[Place, int] = {}
        for r in records:
            first[_place(r)] = min(r.offset, first.get(_place(r), r.offset))
        for place, offset in first.items():
            self._applied.pop(place, None)  # below it, nothing is known applied past the floor
            if not self._running(place) and (floor := self._floors.get(place)) is not None:
                offset = min(offset, floor)  # a failed lane's records come first
            self._seek(consumer, place, offset)

    async def _commit_applied(self, consumer: Any, records: Sequence[Any]) -> None:
        spans: dict[Place, tuple[int, int]] = {}
        for r in records:
            lo, hi = spans.get(_place(r), (r.offset, r.offset))
            spans[_place(r)] = (min(lo, r.offset), max(hi, r.offset))
        offsets: dict[Place, int] = {}
        for place, (lo, hi) in spans.items():
            floor = self._floors.get(place)
            if floor is not None and place not in self._lanes and lo <= floor:
                del self._floors[place]  # a failed lane's records, applied again
                floor = None
            if floor is None:
                offsets[place] = hi + 1
                continue
            if self._running(place):
                # What is applied past a failed lane's floor is not kept: it is fetched again.
                self._applied[place] = max(hi + 1, self._applied.get(place, 0))
            offsets[place] = floor
        await self._commit(consumer, offsets)

    async def _commit(self, consumer: Any, offsets: Mapping[Place, int]) -> None:
        async with self._commit_lock:
            # Never back: a lane's commit and a batch's may finish in either order.
            todo = {p: o for p, o in offsets.items() if o > self._committed.get(p, -1)}
            if not todo:
                return
            try:
                await consumer.commit({TopicPartition(*p): o for p, o in todo.items()})
            except _COMMIT_ERRORS as exc:
                # Applied: a later commit covers them, or they are delivered again and found written.
                log.warning("ingest.commit_failed", subscriber=self.role, error=f"{type(exc).__name__}: {exc}")
                return
            self._committed.update(todo)

    def start(
        self, consumer: Any, place: Place, records: Sequence[Any], apply: Callable[[Sequence[Any]], Awaitable[None]]
    ) -> None:
        """Apply ``records`` (one partition's, in order) in a task; the partition's commits stay
        at their first until they are written."""
        first = records[0].offset
        self._floors[place] = min(first, self._floors.get(place, first))
        self._applied.pop(place, None)
        size = sum(len(r.value or b"") for r in records)
        log.info(
            "ingest.lane_started",
            subscriber=self.role,
            topic=place[0],
            partition=place[1],
            records=len(records),
            bytes=size,
        )
        task = asyncio.create_task(self._run(consumer, place, records, apply), name=f"lane-{place[0]}-{place[1]}")
        task.add_done_callback(self._ended)
        owners = frozenset(self._owner(r.key) for r in records)
        self._lanes[place] = _Lane(task=task, since=time.time(), records=len(records), size=size, owners=owners)
        INGEST_LANES.labels(self.role).inc()

    async def _run(
        self, consumer: Any, place: Place, records: Sequence[Any], apply: Callable[[Sequence[Any]], Awaitable[None]]
    ) -> None:
        tp = TopicPartition(*place)
        first = records[0].offset
        try:
            with in_background():  # its embedding requests let the other writes' go first
                await apply(records)
        except Exception as exc:
            log.warning(
                "ingest.lane_failed",
                subscriber=self.role,
                topic=place[0],
                partition=place[1],
                error=f"{type(exc).__name__}: {exc}",
            )
            # Fetched again from its first record once the wait is over (the floor stays until
            # they are applied), and what followed it with them.
            self._failed.add(place)
            self._applied.pop(place, None)
            self._hold(consumer, place, first)
            await pause(self._closed, RETRY_S)
        else:
            self._floors.pop(place, None)
            # Past what was applied beside it (a batch in hand commits itself once applied).
            after = max(records[-1].offset + 1, self._applied.pop(place, 0))
            # Committed now, not with the next batch: there may be none for long, and ``up``'s
            # drain and the lag read what is committed.
            await self._commit(consumer, {place: after})
            log.info("ingest.lane_finished", subscriber=self.role, topic=place[0], partition=place[1])
        finally:
            self._lanes.pop(place, None)
            self._failed.discard(place)
            INGEST_LANES.labels(self.role).dec()
            held = self._held.pop(place, None)
            with contextlib.suppress(IllegalStateError, AssertionError):  # revoked meanwhile
                if self._closed.is_set():
                    # The daemon stops; the poll runs until the broker stops, and would apply a
                    # cancelled lane's later records inline.
                    consumer.pause(tp)
                elif held is not None:
                    consumer.resume(tp)

    def _ended(self, task: asyncio.Task[None]) -> None:
        # ``_run`` catches what it expects; anything else is a bug, and never silent.
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error(
                "ingest.lane_crashed", subscriber=self.role, task=task.get_name(), error=f"{type(exc).__name__}: {exc}"
            )

    async def settle(self, places: Collection[Place]) -> None:
        """Wait for the lanes of ``places`` and forget what was kept of them (a revocation: they
        are applied before the partitions move to another daemon)."""
        tasks = [lane.task for p, lane in list(self._lanes.items()) if p in places]
        if tasks:
            log.info("ingest.lanes_awaited", subscriber=self.role, lanes=len(tasks))
            await asyncio.wait(tasks)
        for p in places:
            for kept in (self._held, self._refetch, self._floors, self._applied, self._committed):
                kept.pop(p, None)

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
