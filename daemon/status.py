"""What operators see: readiness checks, consumer lag, the stale queue over time, query latency.

The sampler keeps small in-memory histories (bounded) for the status page; everything it
measures also goes to Prometheus gauges.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from consumers.kafka_clients import cluster_metadata
from consumers.topic_names import read_for
from daemon.lost_logs import log_ends
from daemon.settings import Settings
from daemon.teardown import bounded
from graph import TenantGraphs
from memory.errors import MemdError
from memory.index import ChunkIndex
from memory.metrics import CONSUMER_LAG, INDEX_CHUNKS, INDEX_WRITES_PER_CHUNK, STALE_DEPTH, STALE_OLDEST
from memory.retrying import pause

log = structlog.get_logger()

#: Samples of the stale queue's depth kept for the charts (an hour at the default 5 s).
HISTORY_SAMPLES = 720


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of values by nearest rank; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def oldest_age_s(marked_at: Sequence[float], now: float) -> float:
    """Age of the oldest mark; 0 for none. Never negative: a mark stamped by another host's
    clock (several daemons share the queue) may lie a little in this one's future."""
    return max(0.0, now - min(marked_at, default=now))


@dataclass
class StatusState:
    """The latest measurements, shared by the sampler and the HTTP handlers."""

    started_at: float = field(default_factory=time.time)
    ready: bool = False
    assigned: dict[str, int] = field(default_factory=dict)  # consumer -> partitions, while assigned
    consumers: tuple[str, ...] = ()  # every consumer that must hold an assignment to be ready
    stopped_consumers: Callable[[], list[str]] = field(default=lambda: [])  # those whose loop stopped
    lag: dict[str, dict[str, int]] = field(default_factory=dict)  # group -> "topic/partition" -> lag
    lag_error: str | None = None
    past_end: dict[str, list[str]] = field(default_factory=dict)  # group -> partitions committed past the end
    lag_measured_at: float = 0.0
    # "topic/partition" -> what its running lane applies (consumers.lanes.Lanes.now)
    lanes: Callable[[], dict[str, str]] = field(default=lambda: {})
    dlq_records: int | None = None
    chunks: int | None = None
    stale: dict[str, dict[str, Any]] = field(default_factory=dict)  # tenant -> {depth, oldest_age_s, items}
    depth_history: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=HISTORY_SAMPLES))
    # tenant -> the same history for that tenant alone (what a tenant's explorer charts)
    tenant_history: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)
    query_ms: deque[float] = field(default_factory=lambda: deque(maxlen=1000))
    query_errors: int = 0  # the daemon failed to answer (unavailable, internal)
    query_refused: int = 0  # an asker's bad or too old request

    def record_query(self, seconds: float, outcome: str) -> None:
        """Called by the query subscriber after each reply (``outcome``: ok, invalid, expired, error)."""
        self.query_ms.append(seconds * 1000)
        if outcome == "error":
            self.query_errors += 1
        elif outcome != "ok":
            self.query_refused += 1


@dataclass(frozen=True)
class LagReport:
    """Every consumer group's lag per partition, the DLQ's record count, and the partitions a
    group committed past the end of (a broker that lost its log: tansu restarted empty)."""

    lag: dict[str, dict[str, int]]
    dlq: int
    past_end: dict[str, list[str]]


def past_end_text(past_end: dict[str, list[str]]) -> str:
    """``LagReport.past_end`` in one line, as /readyz and doctor show it."""
    return "; ".join(f"{g}: {', '.join(parts)}" for g, parts in sorted(past_end.items()))


#: Groups whose committed offsets were read partition by partition once (logged once).
_FELL_BACK: set[str] = set()


async def _committed(
    settings: Settings, admin: AIOKafkaAdminClient, group: str, tps: list[TopicPartition], opts: dict[str, Any]
) -> dict[TopicPartition, int]:
    """``group``'s committed offset of each of ``tps`` (0 where it has none)."""
    try:
        # One request for the whole group: one per partition took seconds with a few
        # thousand partitions (hundreds of tenant topics), past the sampler's bound.
        found = await admin.list_consumer_group_offsets(group, partitions=tps)
        # A group-level error (its coordinator loading or moved) comes back as no partitions
        # at all, unraised: read as "nothing committed" it would show the whole log as lag.
        if all(tp in found for tp in tps):
            return {tp: max(found[tp].offset, 0) for tp in tps}
        why = f"{len(tps) - sum(tp in found for tp in tps)} partition(s) missing from the answer"
    except KafkaError as exc:
        why = f"{type(exc).__name__}: {exc}"
    if group not in _FELL_BACK:  # once per group: a broker that refuses it refuses every sample
        _FELL_BACK.add(group)
        log.info("status.offset_fetch_fell_back", group=group, error=why)
    reader = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=group,
        enable_auto_commit=False,
        request_timeout_ms=5000,
        **opts,
    )
    try:
        await reader.start()
        return {tp: max(await reader.committed(tp) or 0, 0) for tp in tps}
    finally:
        await bounded("stop the lag reader", reader.stop())


async def group_members(settings: Settings, groups: Sequence[str]) -> dict[str, int]:
    """How many members each consumer group has now (a daemon killed less than its session
    timeout ago still counts).

    Raises:
        KafkaError, OSError, TimeoutError: the broker could not be asked.
        MemdError: the broker could not describe a group (not authorized, a coordinator
            loading or moving): that says nothing of its members.
    """
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=5000, **settings.kafka_security.aiokafka_kwargs()
    )
    try:
        await asyncio.wait_for(admin.start(), timeout=15)
        # One group a request: tansu closes the connection on a request naming several.
        replies = [await asyncio.wait_for(admin.describe_consumer_groups([g]), timeout=15) for g in groups]
    finally:
        await bounded("stop the groups probe", admin.close())
    # Each group as (error_code, group_id, state, protocol_type, protocol, members).
    described = [(name, g) for name, reply in zip(groups, replies, strict=True) for r in reply for g in r.groups]
    failed = {name: g[0] for name, g in described if g[0] != 0}
    if failed:
        said = ", ".join(f"{name}: error {code}" for name, code in sorted(failed.items()))
        raise MemdError(f"cannot describe {said}")
    return {name: len(g[5]) for name, g in described}


async def measure_lag(settings: Settings) -> LagReport:
    """Lag of every consumer group of this deployment, and the number of DLQ records ever written.

    Committed offsets are read with the admin API's OffsetFetch, one request per group; a
    broker that does not understand it is asked with a group-bound consumer that never
    subscribes (so it never joins or disturbs the group), one partition at a time.

    Raises:
        KafkaError: the broker cannot be asked.
    """
    opts = settings.kafka_security.aiokafka_kwargs()
    t = settings.topics
    bases = t.read()
    # It fetches once at each log's end for the watermark (see log_ends): a short wait, and
    # small fetches, since the records it may get are thrown away.
    probe = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        request_timeout_ms=5000,
        fetch_max_wait_ms=5,
        max_partition_fetch_bytes=4096,
        **opts,
    )
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=5000, **opts)
    # start() inside the try: a start that fails or is cancelled (the sampler's timeout) has
    # opened connections already, and each sample would leak a client while the broker hangs.
    try:
        await probe.start()
        await admin.start()
        # Not the probe's own metadata: a topic missing there read as lag 0, a DLQ of 0.
        cluster = await cluster_metadata(probe)
        all_topics = cluster.topics()
        groups: dict[str, list[TopicPartition]] = {
            settings.consumer.group(role): [
                TopicPartition(topic, p)
                for topic in sorted(all_topics)
                if read_for(topic, base, settings.consumer.tenancy)
                for p in sorted(cluster.partitions_for_topic(topic) or ())
            ]
            for role, base in bases.items()
        }
        dlq_tps = [TopicPartition(t.dlq, p) for p in sorted(cluster.partitions_for_topic(t.dlq) or ())]
        every = list(dict.fromkeys([*(tp for tps in groups.values() for tp in tps), *dlq_tps]))
        ends = await log_ends(probe, every) if every else {}
        lag: dict[str, dict[str, int]] = {}
        past_end: dict[str, list[str]] = {}
        for group, tps in groups.items():
            if not tps:
                lag[group] = {}
                continue
            committed = await _committed(settings, admin, group, tps, opts)
            lag[group] = {f"{tp.topic}/{tp.partition}": max(0, ends[tp] - committed[tp]) for tp in tps}
            # Not lag 0: a group past the end waits for offsets the log may never reach.
            if beyond := [
                f"{tp.topic}/{tp.partition} ({committed[tp]} > {ends[tp]})" for tp in tps if committed[tp] > ends[tp]
            ]:
                past_end[group] = beyond
        dlq = sum(ends[tp] for tp in dlq_tps)
        return LagReport(lag, int(dlq), past_end)
    finally:
        await bounded("stop the lag admin", admin.close())
        await bounded("stop the lag probe", probe.stop())


class Sampler:
    """Refreshes StatusState (and the gauges) every ``interval_s``."""

    def __init__(
        self,
        *,
        settings: Settings,
        state: StatusState,
        index: ChunkIndex,
        graph: TenantGraphs | None,
        interval_s: float,
    ) -> None:
        self._settings = settings
        self._state = state
        self._index = index
        self._graph = graph
        self._interval = interval_s

    async def sample_once(self) -> None:
        """One round of measurements; failures are recorded, never raised."""
        s = self._state
        try:
            # A coordinator that is still coming back can stall offset reads: bound them.
            report = await asyncio.wait_for(measure_lag(self._settings), timeout=10)
            s.lag, s.dlq_records, s.past_end = report.lag, report.dlq, report.past_end
            s.lag_error = None
            s.lag_measured_at = time.time()
            for group, parts in s.lag.items():
                for tp, value in parts.items():
                    topic, _, partition = tp.rpartition("/")
                    CONSUMER_LAG.labels(group, topic, partition).set(value)
        except (TimeoutError, KafkaError, OSError) as exc:
            s.lag_error = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(MemdError):
            s.chunks, writes = await self._index.counts()
            INDEX_CHUNKS.set(s.chunks)
            INDEX_WRITES_PER_CHUNK.set(0 if writes is None else writes)  # 0: an empty index
        if self._graph is not None:
            total = 0
            with contextlib.suppress(MemdError):
                tenants = await self._graph.tenants()
                for gone in set(s.stale) - set(tenants):  # erased: its queue and series go with it
                    s.stale.pop(gone, None)
                    s.tenant_history.pop(gone, None)
                    with contextlib.suppress(KeyError):
                        STALE_DEPTH.remove(gone)
                        STALE_OLDEST.remove(gone)
                for tenant in tenants:
                    depth, items = await self._graph.store(tenant).stale(limit=10)
                    oldest = oldest_age_s([i.first_marked_at for i in items], time.time())
                    s.stale[tenant] = {"depth": depth, "oldest_age_s": oldest, "items": items}
                    history = s.tenant_history.setdefault(tenant, deque(maxlen=HISTORY_SAMPLES))
                    history.append((time.time(), depth))
                    STALE_DEPTH.labels(tenant).set(depth)
                    STALE_OLDEST.labels(tenant).set(oldest)
                    total += depth
                s.depth_history.append((time.time(), total))

    async def run(self, stop: asyncio.Event) -> None:
        """Sample until stopped."""
        while not stop.is_set():
            try:
                await self.sample_once()
            except Exception:  # a monitoring loop must outlive whatever it measures
                log.exception("status.sample_failed")
            await pause(stop, self._interval)
