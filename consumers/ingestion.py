"""The ingest path that the documents and transcripts subscribers share.

A batch is decoded, what decodes is applied, the rest is dead-lettered, and each event that
asked for one gets its write ack; a batch that fails for an unexpected reason is retried event
by event, so one poison event cannot block the others.
"""

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any

import structlog
from aiokafka import ConsumerRecord
from faststream.kafka.publisher import DefaultPublisher

from consumers.acks import TENANT_ERASED, build_acks
from consumers.config import ConsumerConfig, Topics
from consumers.decoding import Decoded, dead_letter, decode_records, dlq_body
from consumers.errors import UnknownReplyTopic
from consumers.events import DlqRecord, WriteAck
from consumers.replies import PartitionCounts, own_reply_topic, reply_route, shared_replies
from consumers.topic_names import tenant_from_topic
from memory.attempts import AttemptCounter
from memory.config import IngestConfig
from memory.errors import InvalidRequest, MemdError
from memory.ingest import Ingestor
from memory.ingest_report import IngestReport, ItemOutcome
from memory.metrics import (
    ACKS_SENT,
    CHUNKS_EMBEDDED,
    CHUNKS_REUSED,
    EVENTS_CONSUMED,
    EVENTS_DEAD_LETTERED,
    EVENTS_FAILED,
    EVENTS_KEYED_APART,
)
from memory.retrying import backoff_s, pause
from memory.tenants import ErasedTenants, Erasure, none_erased, refused

log = structlog.get_logger()


def _at(record: DlqRecord) -> tuple[str, int, int]:
    return (record.topic, record.partition, record.offset)


def refused_by(erased: Mapping[str, Erasure], tenant: str | None, record: Any) -> bool:
    """Whether an erasure leaves ``record`` (of ``tenant``'s topic) unapplied, by its time."""
    return refused(erased, tenant, getattr(record, "timestamp", None))


def erased_apart(
    good: Sequence[Decoded], erased: Mapping[str, Erasure], raw: Mapping[tuple[str, int, int], Any]
) -> tuple[list[Decoded], list[Decoded]]:
    """``good`` as (kept, left out): the events an erasure refuses (``raw``: each one's record)."""
    kept: list[Decoded] = []
    gone: list[Decoded] = []
    for g in good:
        (gone if refused_by(erased, g.item.tenant, raw[(g.topic, g.partition, g.offset)]) else kept).append(g)
    return kept, gone


def _stamp(record: ConsumerRecord[Any, Any]) -> int:
    # With the position, tells a record from another one a lost log put at the same offset.
    return int(getattr(record, "timestamp", 0) or 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ingestion:
    """The path the documents and transcripts subscribers share: decode a batch, apply what
    decodes, dead-letter the rest, and isolate a batch that fails for an unexpected reason."""

    ingestor: Ingestor
    topics: Topics
    cfg: ConsumerConfig
    filter_keys: Collection[str]
    ingest_cfg: IngestConfig
    stopping: asyncio.Event
    attempts_counter: AttemptCounter
    dlq: DefaultPublisher
    publish_reply: Callable[[dict[str, Any], str, str | None, int | None], Awaitable[object]]
    partition_counts: PartitionCounts
    # Where a reply (an ack) must never go: the daemon's inputs.
    input_topics: tuple[str, ...]
    # In topic tenancy, the erased tenants (``TenantRegistry.erased``): their events are not applied.
    erased_tenants: ErasedTenants = dataclasses.field(default=none_erased)
    # Positions dead-lettered while their batch is handled, with (reason, code); the documents
    # and transcripts subscribers share this object, and their positions never collide.
    _dead: dict[tuple[str, int, int], tuple[str, str]] = dataclasses.field(default_factory=dict)

    async def ingest(self, records: Sequence[ConsumerRecord[Any, Any]], kind: str) -> None:
        """Apply one batch of ``kind`` ("document" or "transcript") records; dead-letter the
        records that do not decode and the items the ingestor reports failed."""
        base = self.topics.documents if kind == "document" else self.topics.transcripts
        for r in records:
            EVENTS_CONSUMED.labels(r.topic).inc()
        good, dead = decode_records(
            records,
            kind=kind,
            filter_keys=self.filter_keys,
            max_content_bytes=self.ingest_cfg.max_content_bytes,
            max_future_s=self.ingest_cfg.max_future_s,
            tenant_of=lambda topic: tenant_from_topic(topic, base, self.cfg.tenancy),
        )
        raw = {(r.topic, r.partition, r.offset): r for r in records}
        if apart := [g for g in good if g.keyed_apart is not None]:
            _keyed_apart(apart)
        try:
            await self._ingest(good, dead, raw, base)
        finally:
            for position in raw:
                self._dead.pop(position, None)

    async def _ingest(
        self, good: Sequence[Decoded], dead: Sequence[DlqRecord], raw: dict[tuple[str, int, int], Any], base: str
    ) -> None:
        erased = await self.erased_tenants() if self.cfg.tenancy == "topic" and (good or dead) else {}
        kept, gone = erased_apart(good, erased, raw)
        # An erased tenant's events that do not decode are not kept in the shared DLQ either.
        dead = [
            d for d in dead if not refused_by(erased, tenant_from_topic(d.topic, base, self.cfg.tenancy), raw[_at(d)])
        ]
        # Applied first, dead-lettered after: a batch that fails (an outage, a poison event
        # short of its attempts) is redelivered whole, and must not have published anything yet.
        report = await self._apply_isolated(kept, raw)
        for g in gone:
            why = (
                f"tenant {g.item.tenant!r} was erased (agentmemd erase-tenant): its events from before are never "
                f"applied, nor any until its topics are created again (agentmemd topics --tenant {g.item.tenant})"
            )
            report.outcomes[id(g.item)] = ItemOutcome("ignored", refused=(TENANT_ERASED, why))
        if gone:
            log.warning("ingest.erased_tenant_skipped", tenants=sorted({g.item.tenant for g in gone}), events=len(gone))
        # By the kind's topic (a tenant's own topic counts under it): the model's work, not a tenant's.
        CHUNKS_EMBEDDED.labels(base).inc(report.chunks_embedded)
        CHUNKS_REUSED.labels(base).inc(report.chunks_reused)
        for record in dead:
            await self._publish_dead(record, _stamp(raw[_at(record)]))
        # By the item itself: a batch may hold the same doc_id in two tenants (topic
        # tenancy) or in several versions, and the DLQ must get the record that failed.
        by_item: dict[int, Decoded] = {id(g.item): g for g in good}
        for item, exc in report.failed:
            d = by_item[id(item)]
            r = raw[(d.topic, d.partition, d.offset)]
            await self._publish_dead(dead_letter(r, str(exc), exc.code), _stamp(r))
        await self._send_acks(build_acks(raw, good, report, self._dead))

    def _own_replies(self, topic: str) -> str | None:
        """In topic tenancy, the reply topic of the tenant whose event topic ``topic`` is (its
        acks go there or under it); ``None`` in single tenancy."""
        for base in (self.topics.documents, self.topics.transcripts):
            if (tenant := tenant_from_topic(topic, base, self.cfg.tenancy)) is not None:
                return own_reply_topic(self.topics.replies, self.cfg.tenancy, tenant)
        return None

    async def _send_acks(self, acks: Sequence[tuple[Any, str, str, WriteAck]]) -> None:
        """Publish each ack to its writer's ``reply_to``, all at once and within
        ``ack_timeout_ms``: an ack never holds up ingestion for long. Where a query's error
        reply would go, so does an ack whose headers name nowhere it may go: a ``reply_to``
        that is no topic, an input or another tenant's goes to the default reply topic (the
        tenant's own), a ``reply_partition`` that does not exist to ``reply_to`` unpartitioned.
        One that still cannot go (a broker away) is logged, never retried."""
        if not acks:
            return

        async def one(record: Any, reply_to: str, cid: str, ack: WriteAck) -> None:
            own = self._own_replies(record.topic)
            try:
                try:
                    partition = await reply_route(
                        reply_to,
                        record.headers,
                        self.partition_counts,
                        named=True,
                        inputs=self.input_topics,
                        own=own,
                        replies=shared_replies(self.topics.replies, self.cfg.tenancy),
                    )
                except InvalidRequest as exc:
                    if isinstance(exc, UnknownReplyTopic):
                        reply_to = own or self.topics.replies
                    partition = None
                    log.warning(
                        "ingest.ack_rerouted", topic=record.topic, offset=record.offset, to=reply_to, why=str(exc)
                    )
                await self.publish_reply(ack.model_dump(mode="json"), reply_to, cid, partition)
            except Exception as exc:
                log.warning(
                    "ingest.ack_failed",
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    reply_to=reply_to,
                    error=f"{type(exc).__name__}: {exc}",
                )
            else:
                ACKS_SENT.labels(record.topic, ack.status).inc()

        sends = asyncio.gather(*(one(*a) for a in acks))
        try:
            await asyncio.wait_for(sends, timeout=self.cfg.ack_timeout_ms / 1000)
        except TimeoutError:
            log.warning("ingest.acks_timed_out", acks=len(acks), timeout_ms=self.cfg.ack_timeout_ms)

    async def _apply_isolated(self, good: Sequence[Decoded], raw: dict[tuple[str, int, int], Any]) -> IngestReport:
        # The batch is applied whole; only if it fails for an unexpected reason (a bug, not
        # an outage) are its events retried one by one, so one poison event cannot block
        # the others, and an event that keeps failing is dead-lettered after max_attempts.
        try:
            return await self.ingestor.apply([g.item for g in good])
        except MemdError as exc:
            if exc.retryable:
                raise
            first_error: Exception = exc
        except Exception as exc:
            first_error = exc
        log.warning("ingest.batch_isolated", events=len(good), error=repr(first_error))
        report = IngestReport()
        for g in good:
            try:
                one = await self.ingestor.apply([g.item])
                report.outcomes.update(one.outcomes)
                report.chunks_embedded += one.chunks_embedded
                report.chunks_reused += one.chunks_reused
            except MemdError as exc:
                if exc.retryable:
                    raise
                await self._poison(g, raw, exc)
                continue
            except Exception as exc:
                await self._poison(g, raw, exc)
                continue
            report.failed.extend(one.failed)
        # Applied one by one, an earlier version of a doc was indexed before a later one
        # replaced it: only each doc's last indexed outcome stands, the earlier were superseded.
        last: dict[tuple[str, str], int] = {}
        for g in good:
            outcome = report.outcomes.get(id(g.item))
            if outcome is not None and outcome.status == "indexed":
                if (prev := last.get((g.item.tenant, g.item.doc_id))) is not None:
                    report.outcomes.pop(prev, None)
                last[(g.item.tenant, g.item.doc_id)] = id(g.item)
        return report

    async def _poison(self, g: Decoded, raw: dict[tuple[str, int, int], Any], exc: Exception) -> None:
        EVENTS_FAILED.labels(g.topic).inc()
        record = raw[(g.topic, g.partition, g.offset)]
        stamp = _stamp(record)
        attempts = await self.attempts_counter.incr(g.topic, g.partition, g.offset, stamp)
        if attempts < self.ingest_cfg.max_attempts:
            log.warning(
                "ingest.event_failed", doc_id=g.item.doc_id, offset=g.offset, attempts=attempts, error=repr(exc)
            )
            # Redelivered at once otherwise: every attempt would be spent within milliseconds,
            # and a glitch of a second (a thread pool, a restarting dependency) would
            # dead-letter a good event. Cut short by a shutdown.
            await pause(self.stopping, backoff_s(attempts, self.ingest_cfg))
            raise exc  # not committed: redelivered, and the events before it are idempotent
        # The count is kept (it expires): if another event of this batch fails short of its
        # attempts, the batch comes back, and this one must go straight past, not start over.
        reason = f"handling failed {attempts} times: {type(exc).__name__}: {exc}"
        await self._publish_dead(dead_letter(record, reason, "poison", attempts=attempts), stamp)

    async def _publish_dead(self, record: DlqRecord, stamp: int) -> None:
        self._dead[(record.topic, record.partition, record.offset)] = (record.reason, record.error_code)
        position = (record.topic, record.partition, record.offset, stamp)
        if await self.attempts_counter.dead_lettered(*position):
            # A redelivered batch: this record's dead letter is already in the DLQ.
            log.info("ingest.dead_letter_skipped", topic=record.topic, partition=record.partition, offset=record.offset)
            return
        EVENTS_DEAD_LETTERED.labels(record.topic, record.error_code).inc()
        log.warning(
            "ingest.event_dead_lettered",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            reason=record.reason,
        )
        body, key = dlq_body(record, self.cfg.dlq_max_record_bytes)
        try:
            await self.dlq.publish(body, key=key, headers={"content-type": "application/json"})
        except Exception as exc:
            # Not swallowed (the batch is redelivered, nothing is lost), but never silent.
            log.error(
                "ingest.dead_letter_failed",
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                bytes=len(body),
                error=f"{type(exc).__name__}: {exc}",
            )
            raise
        await self.attempts_counter.mark_dead_lettered(*position)


def _keyed_apart(apart: Sequence[Decoded]) -> None:
    """Say that events came under another key than their own: applied, as any event, but in
    no order against their doc's (or session's) other events. Once per batch, not per event."""
    for g in apart:
        EVENTS_KEYED_APART.labels(g.topic).inc()
    first = apart[0]
    log.warning(
        "ingest.keyed_apart",
        events=len(apart),
        topic=first.topic,
        key=first.keyed_apart[:200] if first.keyed_apart else None,
        doc_id=first.item.doc_id,
        hint="publish a document under its doc_id, a turn or forget under agent_id/session_id",
    )
