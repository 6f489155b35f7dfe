"""Wiring and lifecycle: open clients in dependency order, close them in reverse."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import os
import sys
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aredis
import structlog
from aiohttp import web
from faststream.kafka import KafkaBroker

from consumers.idle import FetchBackoff
from consumers.replies import PartitionCounts
from consumers.routers import build_router
from daemon.connections import kafka_options, redis_client
from daemon.explore import Access, Explorer, MemoryReads
from daemon.http import build_app, readiness_checks, start_http
from daemon.lost_logs import rewind_lost_logs
from daemon.settings import Settings
from daemon.status import Sampler, StatusState
from daemon.teardown import CLOSE_TIMEOUT_S, await_chain, bounded, cancel_and_wait
from daemon.topics import ensure_topics
from graph.compute import CommunityComputer, Offload, in_thread
from graph.ner import SpacyNer
from graph.search import ScopedSearch
from graph.tenants import TenantGraphs
from memory.activity import IngestActivity
from memory.attempts import AttemptCounter
from memory.embedder import POISON_MAX, Embedder, SentenceTransformerEmbedder
from memory.errors import BackendUnavailable, MemdError
from memory.generations import GenerationRegistry, index_spec
from memory.index import ChunkIndex, translate_errors
from memory.ingest import Ingestor
from memory.poison import SharedPoison
from memory.retrieval import Retriever
from memory.server_policies import unsafe_settings

log = structlog.get_logger()

SUBSCRIBERS = ("documents", "transcripts", "requests")


def offline_environment() -> None:
    """Models and tokenizers load from disk only; nothing may download at run time."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@dataclass
class Daemon:
    """A running daemon's parts, for shutdown and for tests."""

    settings: Settings
    redis: aredis.Redis
    embedder: SentenceTransformerEmbedder
    index: ChunkIndex
    ingestor: Ingestor
    retriever: Retriever
    broker: KafkaBroker
    graph: TenantGraphs | None = None
    search: ScopedSearch | None = None  # what the query subscriber asks (and the explorer)
    status: StatusState = field(default_factory=StatusState)
    http: web.AppRunner | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    assigned: dict[str, int] = field(default_factory=dict)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    # Set at shutdown: the background loops check it as well as being cancelled, because a
    # cancellation can be lost (on Python 3.11, asyncio.wait_for inside redis-py's command
    # send returns normally when the send completes as the cancellation arrives).
    halt: asyncio.Event = field(default_factory=asyncio.Event)
    stopped: bool = False
    partition_counts: PartitionCounts | None = None
    compute: CommunityComputer | None = None  # the graph's detection process (graph.compute)
    fetch_backoff: FetchBackoff | None = None  # idle subscribers' longer fetch waits (consumers.idle)
    # False for workers lent by start_daemon's caller: closing them is the caller's job.
    owns_embedder: bool = True
    owns_compute: bool = True

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run a background loop for the daemon's lifetime; its death is logged, never silent."""
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._task_ended)
        self.tasks.append(task)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        if self.stopped or task.cancelled():
            return
        exc = task.exception()
        # The loops catch what they expect; reaching here is a bug worth an operator's eyes.
        log.error("daemon.task_died", task=task.get_name(), error=f"{type(exc).__name__}: {exc}" if exc else "returned")

    async def stop(self) -> None:
        """Stop consuming (draining in-flight messages), then close clients in reverse order.

        A second call does nothing.
        """
        if self.stopped:
            return
        self.stopped = True
        self.status.ready = False  # /readyz fails from the start of a drain, not after it
        log.info("daemon.shutdown_started")
        self.ingestor.stopping.set()
        # FastStream gives in-flight handlers shutdown_timeout_s; the consumers' and the
        # producer's own closes (a final commit, a leave-group) get CLOSE_TIMEOUT_S beyond
        # that, so a broker gone silent cannot hold the shutdown.
        await bounded("kafka broker", self.broker.stop(), seconds=self.settings.shutdown_timeout_s + CLOSE_TIMEOUT_S)
        if self.partition_counts is not None:
            await bounded("partition counts", self.partition_counts.close())
        self.halt.set()
        if self.graph is not None:
            self.graph.stop.set()
        for task in await cancel_and_wait(self.tasks, seconds=15):
            log.warning("daemon.task_stuck", task=task.get_name(), awaiting=await_chain(task))
        await asyncio.gather(*(t for t in self.tasks if t.done()), return_exceptions=True)
        if self.http is not None:
            await bounded("http server", self.http.cleanup())
        await bounded("redis", self.redis.aclose())
        if self.owns_embedder:
            self.embedder.close()
        if self.compute is not None and self.owns_compute:
            self.compute.close()
        log.info("daemon.shutdown_finished")


def explorer(daemon: Daemon, *, access: Access | None = None) -> Explorer:
    """The explorer over a daemon's index, search, graph and status, behind ``access`` (by
    default the daemon's own tokens)."""
    stores = daemon.graph.store if daemon.graph is not None else None
    reads = MemoryReads(
        index=daemon.index,
        retriever=daemon.retriever,
        search=daemon.search or ScopedSearch(retriever=daemon.retriever, stores=stores),
        graph=daemon.graph,
        status=daemon.status,
        settings=daemon.settings,
    )
    return Explorer(reads=reads, access=access or daemon.settings.http_access())


async def _ensure_index(index: ChunkIndex, timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            await index.ensure()
            return
        except BackendUnavailable as exc:
            if asyncio.get_running_loop().time() > deadline:
                raise
            log.warning("daemon.redis_waited", error=str(exc))
            await asyncio.sleep(0.5)


async def _ensure_topics(settings: Settings, *, timeout_s: float) -> list[str]:
    """Create the contract's missing topics as configured; returns those created."""
    return await ensure_topics(
        settings.kafka_bootstrap,
        settings.topics.all(),
        partitions=settings.topic_partitions,
        replication=settings.topic_replication,
        timeout_s=timeout_s,
        options=kafka_options(settings),
        configs=settings.topics.configs(settings.ingest.max_content_bytes),
    )


async def _watch_topics(settings: Settings, halt: asyncio.Event) -> None:
    # A broker that comes back empty (tansu keeps its log in memory) has lost our topics;
    # recreating them lets the consumers rejoin by themselves. Real Kafka keeps them.
    while not halt.is_set():
        await asyncio.sleep(settings.topic_check_s)
        try:
            created = await _ensure_topics(settings, timeout_s=settings.topic_check_s)
        except BackendUnavailable as exc:
            log.warning("daemon.broker_unreachable", error=str(exc))
            continue
        if created:
            log.warning("daemon.topics_recreated", topics=created)


#: How often a daemon shares the query texts its embedding worker crashed on, and learns the
#: others' (memory.poison): a poison query costs each other daemon at most this long of exposure.
POISON_SYNC_S = 5.0


async def _sync_poison(shared: SharedPoison, embedder: SentenceTransformerEmbedder, halt: asyncio.Event) -> None:
    while not halt.is_set():
        try:
            pushed, learned = await shared.sync(embedder)
        except MemdError as exc:  # Redis away: the local list still refuses what this daemon found
            log.warning("embed.poison_sync_failed", error=str(exc))
        else:
            if pushed or learned:
                log.info("embed.poison_synced", pushed=pushed, learned=learned)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(halt.wait(), timeout=POISON_SYNC_S)


def _role(subscriber: Any) -> str:
    """A subscriber's role (``documents``, ``transcripts``, ``requests``): its group id's last part."""
    return str(getattr(subscriber, "group_id", "") or "?").rsplit(".", 1)[-1]


async def _start_broker(broker: KafkaBroker) -> None:
    # FastStream's broker.start() starts subscribers one after another, and aiokafka's
    # consumer start waits for its group join (~5 s on tansu): three subscribers would
    # take 15 s. Starting them together takes one join's time. Same steps otherwise.
    await broker.connect()
    await asyncio.gather(*(sub.start() for sub in broker.subscribers))
    for pub in broker.publishers:
        await pub.start()
    broker.running = True


async def load_ner(settings: Settings) -> SpacyNer | None:
    """The graph's entity recognizer, or None when no spaCy model is configured."""
    return await SpacyNer.load(settings.graph.spacy_model) if settings.graph.spacy_model else None


def build_graph(
    settings: Settings,
    *,
    redis: aredis.Redis,
    index: ChunkIndex,
    embedder: Embedder | None,
    ner: SpacyNer | None,
    activity: IngestActivity | None = None,
    offload: Offload = in_thread,
) -> TenantGraphs:
    """The graph layer over ``index``: one service per tenant, as the daemon, the CLI's graph
    commands and a reindex's re-pointing all wire it."""
    return TenantGraphs(
        client=redis,
        name=settings.index.name,
        index=index,
        embedder=embedder,
        ner=ner,
        cfg=settings.graph,
        activity=activity,
        offload=offload,
    )


async def active_index(settings: Settings, redis: aredis.Redis) -> ChunkIndex:
    """The index as the active generation was built, for commands that load no model.

    A placeholder spec (no model, 0 dims) fails the settings check of every write, so a
    `graph rebuild` that removed a community failed deleting its summary chunk, after its
    communities were already committed.

    Raises:
        MemdError: the active generation could not be read from Redis.
    """
    async with translate_errors("generation read"):
        state = await GenerationRegistry(redis, settings.index.name).state()
    dims = state.spec.dims if state.spec is not None else 0
    return ChunkIndex(client=redis, cfg=settings.index, dims=dims, spec=state.spec)


async def start_daemon(
    settings: Settings,
    *,
    ready_timeout_s: float = 120.0,
    embedder: SentenceTransformerEmbedder | None = None,
    compute: CommunityComputer | None = None,
) -> Daemon:
    """Start everything and return once every subscriber has joined its group.

    ``embedder`` and ``compute`` are workers the caller started and lends to this daemon (it
    never closes them): daemons in one process, such as a test suite's, then share one model
    process and one detection process instead of starting their own (seconds each).

    Raises:
        BackendUnavailable: Redis or Kafka did not come up in time.
        ValueError: a lent embedder was loaded with other embedding settings.
    """
    offline_environment()
    if embedder is not None:
        embedder.check_lent_to(settings.embedding, "daemon's")
    owns_embedder, owns_compute = embedder is None, compute is None
    redis = redis_client(settings)
    if not settings.graph.enabled:
        compute = None
    elif compute is None:
        compute = CommunityComputer()
    # The graph layer's compute process imports cdlib while the embedding worker loads its model.
    warming = asyncio.create_task(compute.start()) if compute is not None and owns_compute else None
    try:
        if embedder is None:
            embedder = await SentenceTransformerEmbedder.load(settings.embedding)
    except BaseException:
        if compute is not None and owns_compute:
            compute.close()
        raise
    finally:
        if warming is not None:
            await warming
    # Until the Daemon exists, nothing else would stop the workers on a failure.
    try:
        spec = index_spec(
            settings.index, model=settings.embedding.model, dims=embedder.dims, chunking=settings.chunking
        )
        index = ChunkIndex(client=redis, cfg=settings.index, dims=embedder.dims, spec=spec, recreate=True)
        await _ensure_index(index, ready_timeout_s)
        for setting, value, fix in await unsafe_settings(redis):
            # Not refused: managed Redis may not let these be changed. Loud, and doctor fails.
            log.warning("daemon.redis_unsafe_setting", setting=setting, value=value, fix=fix)
        if settings.create_topics:
            await _ensure_topics(settings, timeout_s=ready_timeout_s)
        # Ingestion marks its batches here; the graph's summarizer waits for quiet moments.
        activity = IngestActivity()
        graph: TenantGraphs | None = None
        if settings.graph.enabled:
            graph = build_graph(
                settings,
                redis=redis,
                index=index,
                embedder=embedder,
                ner=await load_ner(settings),
                activity=activity,
                offload=compute if compute is not None else in_thread,
            )
        ingestor = Ingestor(
            index=index,
            embedder=embedder,
            chunking=settings.chunking,
            cfg=settings.ingest,
            hook=graph,
            activity=activity,
        )
        retrieval_cfg = settings.retrieval.model_copy(
            update={
                "engine_tenant_filter": settings.retrieval.engine_tenant_filter or settings.consumer.tenancy == "topic"
            }
        )
        retriever = Retriever(index=index, embedder=embedder, cfg=retrieval_cfg)
        search = ScopedSearch(retriever=retriever, stores=graph.store if graph is not None else None)
        broker = KafkaBroker(
            settings.kafka_bootstrap,
            metadata_max_age_ms=settings.consumer.metadata_max_age_ms,
            security=settings.kafka_security.faststream_security(),
            acks="all",
            graceful_timeout=settings.shutdown_timeout_s,
            logger=None,
        )
        partition_counts = PartitionCounts(
            settings.kafka_bootstrap,
            settings.kafka_security.aiokafka_kwargs(),
            metadata_max_age_ms=settings.consumer.metadata_max_age_ms,
        )
        daemon = Daemon(
            settings,
            redis,
            embedder,
            index,
            ingestor,
            retriever,
            broker,
            graph,
            search,
            partition_counts=partition_counts,
            compute=compute,
            owns_embedder=owns_embedder,
            owns_compute=owns_compute,
        )
    except BaseException:
        if owns_embedder:
            embedder.close()
        if compute is not None and owns_compute:
            compute.close()
        raise
    status = daemon.status
    # From here the Daemon owns what it started: a failure stops it all (its owned workers too).
    try:
        if settings.http_port:
            checks = readiness_checks(index=index, state=status, stale_after_s=max(30.0, 4 * settings.status_sample_s))
            try:
                app = build_app(
                    state=status,
                    ready_check=checks,
                    access=settings.http_access(),
                    host=settings.http_host,
                    explorer=explorer(daemon) if settings.explore.enabled else None,
                )
                daemon.http = await start_http(app, settings.http_host, settings.http_port)
                log.info("daemon.http_started", host=settings.http_host, port=settings.http_port)
            except OSError as exc:
                # Memory keeps working without its status page; say so loudly instead of dying.
                log.error("daemon.http_failed", host=settings.http_host, port=settings.http_port, error=str(exc))

        def on_assigned(name: str, partitions: int) -> None:
            daemon.assigned[name] = partitions
            if all(s in daemon.assigned for s in SUBSCRIBERS) and not daemon.ready.is_set():
                daemon.ready.set()

        def on_revoked(name: str) -> None:
            daemon.assigned.pop(name, None)  # /readyz says so until the next assignment

        backoff = daemon.fetch_backoff = FetchBackoff(
            idle_after_s=settings.consumer.idle_after_s, idle_ms=settings.consumer.idle_fetch_max_wait_ms
        )

        broker.include_router(
            build_router(
                ingestor=ingestor,
                search=search,
                topics=settings.topics,
                cfg=settings.consumer,
                filter_keys=settings.index.filter_keys,
                ingest_cfg=settings.ingest,
                stopping=ingestor.stopping,
                on_assigned=on_assigned,
                on_revoked=on_revoked,
                publish_reply=lambda body, topic, cid, partition: broker.publish(
                    body, topic=topic, correlation_id=cid, partition=partition
                ),
                partition_counts=partition_counts,
                on_query_done=status.record_query,
                seen=backoff.seen,
                attempts_counter=AttemptCounter(client=redis, name=settings.index.name),
            )
        )
        try:
            await asyncio.wait_for(_start_broker(broker), timeout=ready_timeout_s)
        except TimeoutError as exc:
            # A consumer's group join that never ends (seen on tansu, with a group left stuck
            # by killed members) held start-up for ever, before the readiness timeout below.
            raise BackendUnavailable(
                f"consumers did not join their groups within {ready_timeout_s:.0f}s; if the broker "
                "keeps a group stuck (tansu, after members were killed), restart it or set another "
                "AGENTMEM_CONSUMER__GROUP_ID"
            ) from exc
    except BaseException:
        await daemon.stop()
        raise
    try:
        await asyncio.wait_for(daemon.ready.wait(), timeout=ready_timeout_s)
    except TimeoutError as exc:
        await daemon.stop()
        raise BackendUnavailable(f"consumers not assigned within {ready_timeout_s}s") from exc
    if settings.create_topics:
        daemon.spawn(_watch_topics(settings, daemon.halt), "topic-watch")
    consumer_cfg = settings.consumer
    for sub in broker.subscribers:
        role = _role(sub)
        own = consumer_cfg.query_fetch_max_wait_ms if role == "requests" else consumer_cfg.ingest_fetch_max_wait_ms
        backoff.watch(role, functools.partial(getattr, sub, "consumer", None), own)
    daemon.spawn(backoff.run(daemon.halt), "fetch-backoff")
    daemon.spawn(rewind_lost_logs(broker, settings.topic_check_s, daemon.halt), "rewind-lost-logs")
    shared_poison = SharedPoison(client=redis, name=settings.index.name, limit=POISON_MAX)
    daemon.spawn(_sync_poison(shared_poison, embedder, daemon.halt), "poison-sync")
    if graph is not None:
        daemon.spawn(graph.run_recompute(), "graph-recompute")
        daemon.spawn(graph.run_queue_log(), "graph-queue-log")
        for i in range(settings.graph.summarizer_concurrency):
            daemon.spawn(graph.run_worker(), f"graph-summarizer-{i}")
    status.ready = True
    status.assigned = daemon.assigned
    status.consumers = SUBSCRIBERS

    def stopped_consumers() -> list[str]:
        # A stopped consumer gets no revocation callback (aiokafka calls it only when it
        # rejoins), so its subscriber's own flag is read too. Named by group role.
        return [_role(sub) for sub in broker.subscribers if not getattr(sub, "running", True)]

    status.stopped_consumers = stopped_consumers
    sampler = Sampler(settings=settings, state=status, index=index, graph=graph, interval_s=settings.status_sample_s)
    daemon.spawn(sampler.run(daemon.halt), "status-sampler")
    # Everything loaded so far (models, tokenizers, spaCy, libraries) lives as long as the
    # daemon: move it out of the collector's view, or every full collection walks it
    # (measured: 8 gen-2 collections of up to 190 ms in 1,500 queries, the whole p99 tail).
    gc.collect()  # garbage frozen now could never be freed
    gc.freeze()
    log.info("daemon.ready", assigned=daemon.assigned, index=settings.index.name, kafka=settings.kafka_bootstrap)
    print(f"agentmemd ready: consuming {', '.join(settings.topics.all()[:3])}", file=sys.stdout, flush=True)
    return daemon


async def run_until_stopped(settings: Settings, stop: asyncio.Event) -> None:
    """Run the daemon until ``stop`` is set (by a signal handler), which also ends a start-up
    still in progress (an operator found a daemon whose group join hung deaf to SIGTERM)."""
    starting = asyncio.create_task(start_daemon(settings), name="daemon-start")
    stopping = asyncio.create_task(stop.wait(), name="stop-signal")
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        log.info("daemon.start_abandoned", reason="stop requested during start-up")
        starting.cancel()  # start_daemon stops whatever it had started
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        return
    stopping.cancel()
    daemon = starting.result()
    try:
        await stop.wait()
    finally:
        await daemon.stop()
