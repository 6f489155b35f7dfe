"""Start-up in dependency order: open clients, wire the components, join the groups, and run
until stopped (the running daemon and its shutdown in reverse are ``daemon.instance``'s)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import sys
from collections.abc import Awaitable, Callable

import structlog

from consumers.config import ROLES
from consumers.idle import FetchBackoff
from consumers.replies import PartitionCounts
from consumers.routers import build_router, lanes_for
from daemon.broker import build_broker, start_broker, subscriber_role
from daemon.components import build_graph, load_ner, offline_environment
from daemon.connections import redis_client
from daemon.http import build_app, readiness_checks, start_http
from daemon.instance import Daemon, explorer
from daemon.lost_logs import rewind_lost_logs
from daemon.poison_sync import sync_poison
from daemon.presence import Presence, refuse_beside
from daemon.settings import Settings
from daemon.status import Sampler
from daemon.topics import ensure_daemon_topics, watch_topics
from graph import CommunityComputer, ScopedSearch, TenantGraphs, in_thread
from graph.summary_records import record_summarizer
from memory.activity import IngestActivity
from memory.attempts import AttemptCounter
from memory.embedder import POISON_MAX, SentenceTransformerEmbedder
from memory.errors import BackendUnavailable, MemdError
from memory.generations import index_spec
from memory.index import ChunkIndex
from memory.ingest import Ingestor
from memory.poison import SharedPoison
from memory.retrieval import Retriever
from memory.server_policies import unsafe_settings
from memory.tenants import TenantRegistry

log = structlog.get_logger()


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
        embedder.check_chunks_fit(settings.chunking.max_tokens)
        spec = index_spec(
            settings.index, model=settings.embedding.model, dims=embedder.dims, chunking=settings.chunking
        )
        index = ChunkIndex(client=redis, cfg=settings.index, dims=embedder.dims, spec=spec, recreate=True)
        await _ensure_index(index, ready_timeout_s)
        for setting, value, fix in await unsafe_settings(redis):
            # Not refused: managed Redis may not let these be changed. Loud, and doctor fails.
            log.warning("daemon.redis_setting_flagged", setting=setting, value=value, fix=fix)
        tenants = TenantRegistry(client=redis, name=settings.index.name)
        if settings.create_topics:
            await ensure_daemon_topics(settings, tenants.with_topics, timeout_s=ready_timeout_s)
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
        broker = build_broker(settings)
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
            if all(s in daemon.assigned for s in ROLES) and not daemon.ready.is_set():
                daemon.ready.set()

        def on_revoked(name: str) -> None:
            daemon.assigned.pop(name, None)  # /readyz says so until the next assignment

        backoff = daemon.fetch_backoff = FetchBackoff(
            idle_after_s=settings.consumer.idle_after_s, idle_ms=settings.consumer.idle_fetch_max_wait_ms
        )

        daemon.lanes = lanes_for(settings.consumer)
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
                saw_tenant=tenants.saw,
                erased_tenants=tenants.erased,
                lanes=daemon.lanes,
                attempts_counter=AttemptCounter(client=redis, name=settings.index.name),
            )
        )
        # Before joining the groups: beside daemons that can use the index, one that cannot
        # would take partitions it could serve none of (daemon.presence).
        await refuse_beside(redis, settings.index.name, settings.consumer.group_id, await index.mismatch())
        await start_broker(broker, timeout_s=ready_timeout_s)
    except BaseException:
        await daemon.stop()
        raise
    try:
        await asyncio.wait_for(daemon.ready.wait(), timeout=ready_timeout_s)
    except TimeoutError as exc:
        await daemon.stop()
        raise BackendUnavailable(f"consumers not assigned within {ready_timeout_s}s") from exc
    if settings.create_topics:
        daemon.spawn(watch_topics(settings, tenants.with_topics, daemon.halt), "topic-watch")
    consumer_cfg = settings.consumer
    for sub in broker.subscribers:
        role = subscriber_role(sub)
        own = consumer_cfg.query_fetch_max_wait_ms if role == "requests" else consumer_cfg.ingest_fetch_max_wait_ms
        backoff.watch(role, functools.partial(getattr, sub, "consumer", None), own)
    daemon.spawn(backoff.run(daemon.halt), "fetch-backoff")
    daemon.spawn(rewind_lost_logs(broker, settings.topic_check_s, daemon.halt), "rewind-lost-logs")
    shared_poison = SharedPoison(client=redis, name=settings.index.name, limit=POISON_MAX)
    daemon.spawn(sync_poison(shared_poison, embedder, daemon.halt), "poison-sync")
    if graph is not None:
        daemon.spawn(graph.run_recompute(), "graph-recompute")
        daemon.spawn(graph.run_queue_log(), "graph-queue-log")
        if settings.graph.summarizer_concurrency:
            await record_summarizer(redis, settings.index.name, settings.graph.summarizer)
        for i in range(settings.graph.summarizer_concurrency):
            daemon.spawn(graph.run_worker(), f"graph-summarizer-{i}")
    status.ready = True
    status.assigned = daemon.assigned
    status.consumers = ROLES

    def stopped_consumers() -> list[str]:
        # A stopped consumer gets no revocation callback (aiokafka calls it only when it
        # rejoins), so its subscriber's own flag is read too. Named by group role.
        return [subscriber_role(sub) for sub in broker.subscribers if not getattr(sub, "running", True)]

    status.stopped_consumers = stopped_consumers
    status.lanes = lambda: {tp: said for lanes in daemon.lanes.values() for tp, said in lanes.now().items()}
    sampler = Sampler(settings=settings, state=status, index=index, graph=graph, interval_s=settings.status_sample_s)
    daemon.spawn(sampler.run(daemon.halt), "status-sampler")
    daemon.presence = Presence(
        client=redis, name=settings.index.name, group=settings.consumer.group_id, mismatch=index.mismatch
    )
    daemon.spawn(daemon.presence.run(daemon.halt), "presence")
    # Everything loaded so far (models, tokenizers, spaCy, libraries) lives as long as the
    # daemon: move it out of the collector's view, or every full collection walks it
    # (measured: 8 gen-2 collections of up to 190 ms in 1,500 queries, the whole p99 tail).
    gc.collect()  # garbage frozen now could never be freed
    gc.freeze()
    log.info(
        "daemon.startup_finished", assigned=daemon.assigned, index=settings.index.name, kafka=settings.kafka_bootstrap
    )
    where = ""
    if daemon.http is None and settings.http_port:  # it failed: said in the line a user reads
        where = (
            f"; no status page: port {settings.http_port} could not be opened (daemon.http_failed says why; "
            "AGENTMEM_HTTP_PORT picks another)"
        )
    if daemon.http is not None:  # the operators' page, where a new user would not guess it
        # Listening on every interface: the loopback one is an address a browser can open.
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(settings.http_host, settings.http_host)
        host = f"[{host}]" if ":" in host else host
        explore = ", explorer /explore" if settings.explore.enabled else ""
        where = f"; status page http://{host}:{settings.http_port}/{explore}"
    consumed = settings.topics.all()[:3]
    if settings.consumer.tenancy == "topic":  # pattern subscriptions: every tenant's topics
        consumed = [f"{t}.<tenant>" for t in consumed]
    consuming = f"consuming {', '.join(consumed)}{where}"
    try:
        refused = await index.mismatch()
    except MemdError:
        refused = None  # Redis blinked: /readyz and doctor say so; this line is only a greeting
    if refused is not None:
        # Started and consuming, but every query and write would wait on the index: a user
        # who just changed a setting must read why here, not find out from a timeout.
        log.error("daemon.index_refused", why=refused)
        print(
            f"agentmemd started but cannot use its index: {refused}. Until then queries answer "
            f"`unavailable` and writes wait in Kafka, unapplied (under `agentmemd up`, only while it runs: "
            f"keep it running and run `agentmemd reindex` in another shell){where}",
            file=sys.stdout,
            flush=True,
        )
        ready = f"agentmemd ready: the index is usable now, {consuming}"
        daemon.spawn(_say_when_usable(index, daemon.halt, ready), "index-watch", ends=True)
        return daemon
    print(f"agentmemd ready: {consuming}", file=sys.stdout, flush=True)
    return daemon


#: How often a daemon that cannot use its index looks again, to say when it can.
USABLE_POLL_S = 2.0


async def _say_when_usable(index: ChunkIndex, halt: asyncio.Event, ready: str) -> None:
    """Print ``ready`` once the index this daemon refused is usable (a reindex made a
    generation it may use): the last line a user read said it was not."""
    while not halt.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(halt.wait(), timeout=USABLE_POLL_S)
            return
        try:
            if await index.mismatch() is None:
                log.info("daemon.index_mismatch_cleared")
                print(ready, file=sys.stdout, flush=True)
                return
        except MemdError:
            continue  # Redis blinked: looked at again next time


async def run_until_stopped(
    settings: Settings, stop: asyncio.Event, *, before_stop: Callable[[Daemon], Awaitable[object]] | None = None
) -> None:
    """Run the daemon until ``stop`` is set (by a signal handler), which also ends a start-up
    still in progress (a group join that hangs must not make the daemon deaf to SIGTERM).
    ``before_stop``: awaited with the daemon once ``stop`` is set, while it still runs (``up``'s drain)."""
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
        if before_stop is not None:
            daemon.status.ready = False  # a stop has begun: /readyz fails while it drains, too
            await before_stop(daemon)
    finally:
        await daemon.stop()
