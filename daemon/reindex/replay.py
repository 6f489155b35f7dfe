"""The replay: the documents and transcripts topics, read partition by partition into the new
generation through the daemon's own decoding and ``Ingestor``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from consumers.decoding import decode_records
from consumers.ingestion import erased_apart
from consumers.kafka_clients import cluster_metadata
from consumers.topic_names import tenant_from_topic
from daemon.connections import kafka_options
from daemon.lost_logs import log_ends
from daemon.reindex.report import ReindexProgress
from daemon.settings import Settings
from memory.ingest import Ingestor
from memory.tenants import ErasedTenants, none_erased

log = structlog.get_logger()

#: Seconds without a record before the replay re-reads end offsets (did the log shrink?).
REPLAY_STALL_S = 30.0


def source_topics(settings: Settings, topics: set[str]) -> dict[str, tuple[str, str]]:
    """Replayed topic -> (kind, base topic): documents and transcripts, per tenant in topic mode."""
    out: dict[str, tuple[str, str]] = {}
    for kind, base in (("document", settings.topics.documents), ("transcript", settings.topics.transcripts)):
        for topic in topics:
            if settings.consumer.tenancy == "single":
                if topic == base:
                    out[topic] = (kind, base)
            elif tenant_from_topic(topic, base, "topic") is not None:
                out[topic] = (kind, base)
    return out


class Replayer:
    """Reads the source topics partition by partition and applies them to the new generation."""

    def __init__(
        self,
        settings: Settings,
        ingestor: Ingestor,
        progress: ReindexProgress,
        report: Callable[[], None],
        *,
        erased: ErasedTenants = none_erased,
    ):
        self._s = settings
        self._erased = erased  # tenants erased: their events, still in the log, are not replayed
        self._ingestor = ingestor
        self._p = progress
        self._report = report
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.kafka_bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=settings.consumer.ingest_fetch_max_wait_ms,
            max_poll_records=settings.consumer.ingest_max_records,
            **kafka_options(settings),
        )
        self.sources: dict[str, tuple[str, str]] = {}
        self._since_ms: int | None = None
        # (tenant, doc_id) -> why it failed in the new generation (its last failure)
        self.failed: dict[tuple[str, str], str] = {}
        self.switched = False
        self.failed_after_switch: set[str] = set()

    async def start(self, since_ms: int | None) -> None:
        """Start the replay's consumer on every source partition, from ``since_ms`` (Unix
        milliseconds) or from each partition's start."""
        await self.consumer.start()
        self._since_ms = since_ms
        await self._assign_new()

    async def _assign_new(self) -> None:
        """Assign every source topic partition not assigned yet, from the start (or the time).

        Run before each replay pass: a tenant onboarded, or a partition added, while the
        build ran was written to the old generation by the live daemons, and would be lost
        at the drop if only the first pass's partitions were replayed.
        """
        # Topics created since the consumer started too.
        cluster = await cluster_metadata(self.consumer)
        self.sources = source_topics(self._s, cluster.topics())
        current = {tp: await self.consumer.position(tp) for tp in self.consumer.assignment()}
        every = [
            TopicPartition(t, p) for t in sorted(self.sources) for p in sorted(cluster.partitions_for_topic(t) or ())
        ]
        new = [tp for tp in every if tp not in current]
        if not new:
            return
        current = {tp: pos for tp, pos in current.items() if tp in every}  # a topic may be gone
        self.consumer.assign(every)  # a new assignment: positions must be set again
        for tp, position in current.items():
            self.consumer.seek(tp, position)
        if self._since_ms is None:
            await self.consumer.seek_to_beginning(*new)
            return
        found = await self.consumer.offsets_for_times(dict.fromkeys(new, self._since_ms))
        ends = await self.consumer.end_offsets(new)
        for tp in new:
            hit = found.get(tp)
            # No record at or after the time: Kafka answers none; tansu answers offset 0
            # with timestamp -1. Both mean "nothing to replay here".
            none = hit is None or hit.timestamp < 0
            self.consumer.seek(tp, ends[tp] if none else hit.offset)

    async def replay_to_end(self) -> None:
        """Apply every record below the end offsets as they are now (new partitions included)."""
        await self._assign_new()
        tps = sorted(self.consumer.assignment(), key=lambda tp: (tp.topic, tp.partition))
        if not tps:
            return
        positions = {tp: await self.consumer.position(tp) for tp in tps}
        ends = await self._log_ends(tps, positions)
        self._p.total += sum(max(0, ends[tp] - positions[tp]) for tp in tps)
        self._report()
        idle_since = time.monotonic()
        while any(positions[tp] < ends[tp] for tp in tps):
            batches = await self.consumer.getmany(timeout_ms=500, max_records=self._s.consumer.ingest_max_records)
            if any(batches.values()):
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > REPLAY_STALL_S:
                # The log shrank under the replay (a topic deleted and recreated, a broker
                # that lost its log): nothing will ever arrive below the old end offsets, so
                # the replay would wait forever. What was lost is the completeness check's.
                try:
                    now = await self._log_ends(tps, positions)
                except KafkaError as exc:  # the broker is away: keep waiting, as getmany does
                    log.warning("reindex.replay_waited", error=str(exc))
                    idle_since = time.monotonic()
                    continue
                shrunk = {f"{tp.topic}/{tp.partition}": now[tp] for tp in tps if now[tp] < ends[tp]}
                log.warning("reindex.replay_stalled", idle_s=REPLAY_STALL_S, shrunk=shrunk)
                ends = {tp: min(ends[tp], now[tp]) for tp in tps}
                idle_since = time.monotonic()
            for tp, records in batches.items():
                wanted = [r for r in records if r.offset < ends[tp]]
                if wanted:
                    await self._apply(tp.topic, wanted)
                self._p.done += len(wanted)
                if len(wanted) < len(records):  # read past the end: come back to it next time
                    self.consumer.seek(tp, ends[tp])
            for tp in tps:
                positions[tp] = await self.consumer.position(tp)
            self._report()

    async def _log_ends(
        self, tps: list[TopicPartition], positions: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Each partition's log end as its fetches give it (``log_ends``: tansu's end offset
        counts a batch as one record, and a replay that stopped there left the batch out),
        the consumer then put back where it stood."""
        ends = await log_ends(self.consumer, tps)
        for tp, position in positions.items():
            self.consumer.seek(tp, position)
        return ends

    async def _apply(self, topic: str, records: list[Any]) -> None:
        kind, base = self.sources[topic]
        good, dead = decode_records(
            records,
            kind=kind,
            filter_keys=self._s.index.filter_keys,
            max_content_bytes=self._s.ingest.max_content_bytes,
            max_future_s=self._s.ingest.max_future_s,
            tenant_of=lambda t: tenant_from_topic(t, base, self._s.consumer.tenancy),
        )
        self._p.invalid += len(dead)
        if good and self._s.consumer.tenancy == "topic" and (erased := await self._erased()):
            good, gone = erased_apart(good, erased, {(r.topic, r.partition, r.offset): r for r in records})
            self._p.erased += len(gone)
        if not good:
            return
        items = [d.item for d in good]
        rep = await self._ingestor.apply(items)
        # Counted per event, so that the counts add up to the records replayed: a forget is
        # one event (however many turns it deleted), and an event a later one of the same doc
        # replaced within the batch was superseded.
        failed = {id(item) for item, _ in rep.failed}
        for item in items:
            outcome = rep.outcomes.get(id(item))
            if id(item) in failed:
                self._p.failed += 1
            elif outcome is not None and outcome.status == "indexed":
                self._p.applied += 1
            else:
                self._p.skipped += 1
        for item, exc in rep.failed:
            self.failed[(item.tenant, item.doc_id)] = f"{exc.code}: {exc}"
            if self.switched:
                self.failed_after_switch.add(f"{item.tenant}/{item.doc_id}")
            log.warning("reindex.item_failed", doc_id=item.doc_id, code=exc.code, error=str(exc))
