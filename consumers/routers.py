"""FastStream subscribers: they translate records and call into memory/, nothing more.

No ``from __future__ import annotations`` here: FastStream resolves handler annotations
at runtime, and string annotations would be looked up in callers' frames, where a name
like ``KafkaBroker`` may mean something else.
"""

import asyncio
import dataclasses
import re
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import structlog
from aiokafka import ConsumerRecord
from faststream import AckPolicy
from faststream.kafka import KafkaRouter

from consumers.assignment import AssignmentWatcher
from consumers.config import INGEST_ROLES, ConsumerConfig, Topics
from consumers.errors import TenantErased
from consumers.expiry import ExpiryLog
from consumers.ingestion import Ingestion
from consumers.lanes import Lanes
from consumers.queries import scope_of
from consumers.query_handling import PublishReply, QueryHandling, send_reply
from consumers.replies import (
    PartitionCounts,
)
from consumers.requests import ErrorReply
from consumers.topic_names import tenant_from_topic
from graph import ScopedSearch
from memory.attempts import AttemptCounter
from memory.config import IngestConfig
from memory.errors import MemdError
from memory.ingest import Ingestor
from memory.metrics import QUERY_SECONDS, TENANT_QUERIES, TENANT_QUERY_SECONDS
from memory.tenants import ErasedTenants, none_erased

log = structlog.get_logger()


def _safe_headers(record: ConsumerRecord[Any, Any]) -> ConsumerRecord[Any, Any]:
    # FastStream decodes header values as strict UTF-8; a garbage header must not kill
    # the whole poll, so values are made valid UTF-8 first.
    headers = [(k, (v or b"").decode("utf-8", errors="replace").encode()) for k, v in (record.headers or ())]
    return dataclasses.replace(record, headers=headers)


async def _parser_one(msg: ConsumerRecord[Any, Any], original: Callable[..., Any]) -> Any:
    return await original(_safe_headers(msg))


async def _parser_batch(msgs: tuple[ConsumerRecord[Any, Any], ...], original: Callable[..., Any]) -> Any:
    return await original(tuple(_safe_headers(m) for m in msgs))


async def _message_as_body(msg: Any) -> Any:
    # Handlers read the raw records themselves (they need offsets and original bytes), so
    # the "body" is FastStream's message. Taking it as the body instead of injecting it
    # (``message: KafkaMessage``) matters: FastStream resolves injected context fields
    # with a thread-pool hop per message, which under 16 askers cost ~9% of the event
    # loop's samples, contending for the GIL with the embedding thread.
    return msg


def tenant_pattern(base: str) -> str:
    """The FastStream pattern of ``<base>.<tenant>`` topics, and of the bare ``<base>``.

    The bare topic names no tenant: read with the tenants' ones, an event published there is
    dead-lettered and a request answered with an error, each saying why. The pattern is a
    regular expression with no FastStream path parameter (the handlers read the tenant from the
    topic themselves), handed to the client as written: the base's dots escaped match dots
    only (``memoryXrequestsYz``, where a reply_to could point our replies, is not read as
    requests), and the end anchored (``memory.requests-x`` neither).
    """
    return re.escape(base) + r"(?:\..+)?\Z"


def _records(raw: Any) -> tuple[ConsumerRecord[Any, Any], ...]:
    return raw if isinstance(raw, tuple) else (raw,)


def _source(cfg: ConsumerConfig, base: str) -> tuple[str, ...]:
    return (base,) if cfg.tenancy == "single" else ()


def _pattern(cfg: ConsumerConfig, base: str) -> dict[str, Any]:
    # Topic tenancy: one subscription per kind over every <base>.<tenant> topic and <base>.
    return {} if cfg.tenancy == "single" else {"pattern": tenant_pattern(base)}


def _ingest_kwargs(cfg: ConsumerConfig) -> dict[str, Any]:
    """The subscriber options the documents and transcripts subscribers share."""
    return {
        "batch": True,
        "max_records": cfg.ingest_max_records,
        "batch_timeout_ms": cfg.ingest_batch_timeout_ms,
        "fetch_max_wait_ms": cfg.ingest_fetch_max_wait_ms,
        "max_poll_interval_ms": cfg.ingest_max_poll_interval_ms,
        "session_timeout_ms": cfg.session_timeout_ms,
        "heartbeat_interval_ms": cfg.heartbeat_ms,
        # aiokafka's default rebalance timeout is the session timeout: a batch in hand when a
        # rebalance starts (AssignmentWatcher holds the revocation for it) may take as long as
        # any batch may, or the member is dropped and its late write undoes the new owner's.
        "rebalance_timeout_ms": cfg.ingest_max_poll_interval_ms,
        "auto_offset_reset": "earliest",
        # The handler commits (consumers.lanes): a partition with a lane is committed no further
        # than the lane's first record while records after it are applied.
        "ack_policy": AckPolicy.MANUAL,
        # Events are not requests: never publish anything to a reply_to they may carry.
        "no_reply": True,
        "parser": _parser_batch,
        "decoder": _message_as_body,
    }


#: What each batched event subscriber is for (its handler's docstring), by kind.
_EVENT_DOCS = {
    "document": "Document change events (upsert/delete, versioned).",
    "transcript": "Agent transcript turns (idempotent per agent, session and turn).",
}


#: A query's outcome (the ``outcome`` label of ``agentmemd_query_seconds``) by its error code:
#: an asker's bad request, a request too old to answer or of an erased tenant is no failure of
#: the daemon's.
_OUTCOMES = {"invalid_request": "invalid", "expired": "expired", TenantErased.code: "invalid"}

#: Records a tenant seen on its topics (``memory.tenants.TenantRegistry.saw``).
SawTenant = Callable[[str], Awaitable[None]]


async def _no_registry(_tenant: str) -> None:
    return None


async def _note_tenants(saw: SawTenant, names: Iterable[str], base: str, cfg: ConsumerConfig) -> None:
    """Record the tenants whose event topics (under ``base``) ``names`` are, so their topics
    come back if the broker loses them (single tenancy's ``default`` too: a move to topic
    tenancy reads its memory through ``memory.*.default``); a failure is logged, never the
    record's. Only a tenant that wrote is recorded: a question to a mistyped tenant is not.
    A known tenant costs a set lookup (``TenantRegistry.saw``)."""
    for tenant in {tenant_from_topic(name, base, cfg.tenancy) for name in names}:
        if tenant is None:
            continue
        try:
            await saw(tenant)
        except MemdError as exc:
            log.warning("consumer.tenant_unrecorded", tenant=tenant, error=str(exc))


def _subscribe_events(
    router: KafkaRouter,
    ingestion: Ingestion,
    *,
    kind: str,
    base: str,
    cfg: ConsumerConfig,
    watch: AssignmentWatcher,
    lanes: Lanes,
    seen: Callable[[str], None],
    saw_tenant: SawTenant,
) -> None:
    """Add the batched subscriber of ``kind`` ("document" or "transcript") events on ``base``
    (``on_documents`` or ``on_transcripts``, by ``watch.name``) to ``router``; ``lanes``
    applies and commits its batches."""

    async def apply(records: Sequence[ConsumerRecord[Any, Any]]) -> None:
        await ingestion.ingest(records, kind)
        seen(watch.name)  # a batch longer than idle_after_s is no idleness

    async def handler(message: Any) -> None:
        seen(watch.name)
        async with watch.handling(_records(message.raw_message), message.consumer) as records:
            if records:
                await _note_tenants(saw_tenant, {r.topic for r in records}, base, cfg)
                await lanes.apply(message.consumer, records, apply)

    handler.__name__ = handler.__qualname__ = f"on_{watch.name}"
    handler.__doc__ = _EVENT_DOCS[kind]
    router.subscriber(
        *_source(cfg, base),
        group_id=cfg.group(watch.name),
        **_pattern(cfg, base),
        listener=watch,
        **_ingest_kwargs(cfg),
    )(handler)


def _subscribe_queries(
    router: KafkaRouter,
    *,
    search: ScopedSearch,
    topics: Topics,
    cfg: ConsumerConfig,
    watch: AssignmentWatcher,
    publish_reply: PublishReply,
    partition_counts: PartitionCounts,
    on_query_done: Callable[[float, str], None],
    seen: Callable[[str], None],
    erased_tenants: ErasedTenants,
) -> None:
    """Add the queries subscriber to ``router``: each request answered on its reply topic."""
    handling = QueryHandling(
        search=search,
        topics=topics,
        cfg=cfg,
        partition_counts=partition_counts,
        inputs=topics.inputs(),
        expiries=ExpiryLog(),
        erased_tenants=erased_tenants,
    )

    @router.subscriber(  # type: ignore[untyped-decorator]
        *_source(cfg, topics.requests),
        group_id=cfg.group("requests"),
        **_pattern(cfg, topics.requests),
        max_workers=cfg.query_workers,
        fetch_max_wait_ms=cfg.query_fetch_max_wait_ms,
        session_timeout_ms=cfg.session_timeout_ms,
        heartbeat_interval_ms=cfg.heartbeat_ms,
        # A new tenant topic (or partition) has no offset of the group yet: "latest" would skip
        # every request sent before the pattern subscription found it. From the beginning,
        # with old requests skipped by age (query_max_age_ms), answers those.
        auto_offset_reset="earliest",
        no_reply=True,
        parser=_parser_one,
        decoder=_message_as_body,
        listener=watch,
    )
    async def on_query(message: Any) -> None:
        """Memory queries; the reply goes to the reply_to header's topic (default: replies)."""
        seen(watch.name)
        record = message.raw_message
        assert isinstance(record, ConsumerRecord)
        t0 = time.monotonic()
        answered = await handling.answer(record, message.reply_to, time.time() * 1000)
        elapsed = time.monotonic() - t0
        await send_reply(publish_reply, answered, message.correlation_id)
        # After the reply: whatever the accounting does, the asker has its answer.
        reply, tenant = answered.reply, answered.tenant
        outcome = "ok" if not isinstance(reply, ErrorReply) else _OUTCOMES.get(reply.error.code, "error")
        QUERY_SECONDS.labels(scope_of(record.value), outcome).observe(elapsed)
        # A topic that names no valid tenant is answered with an error, and counted apart.
        TENANT_QUERIES.labels(tenant or "", outcome).inc()
        TENANT_QUERY_SECONDS.labels(tenant or "").inc(elapsed)
        on_query_done(elapsed, outcome)


def build_router(
    *,
    ingestor: Ingestor,
    search: ScopedSearch,
    topics: Topics,
    cfg: ConsumerConfig,
    filter_keys: Collection[str],
    ingest_cfg: IngestConfig,
    stopping: asyncio.Event,
    on_assigned: Callable[[str, int], None],
    on_revoked: Callable[[str], None] | None = None,
    attempts_counter: AttemptCounter,
    publish_reply: PublishReply,
    partition_counts: PartitionCounts,
    on_query_done: Callable[[float, str], None] = lambda _s, _o: None,
    seen: Callable[[str], None] = lambda _role: None,
    saw_tenant: SawTenant = _no_registry,
    erased_tenants: ErasedTenants = none_erased,
    lanes: Mapping[str, Lanes] | None = None,
) -> KafkaRouter:
    """The daemon's three subscribers: documents, transcripts (batched) and queries.

    ``publish_reply(body, topic, correlation_id, partition)`` publishes a reply (the broker's
    publish; partition None: the default partitioner); ``partition_counts`` checks the
    partition an asker names (see consumers.replies). ``seen(role)`` is called as each
    subscriber's records arrive (``consumers.idle``). ``lanes``: the documents' and
    transcripts' subscribers' lanes by role (``lanes_for``), which the daemon closes as it stops.
    """
    router = KafkaRouter()
    dlq = router.publisher(topics.dlq, title="dlq", description="Rejected events with the reason.")
    ingestion = Ingestion(
        ingestor=ingestor,
        topics=topics,
        cfg=cfg,
        filter_keys=filter_keys,
        ingest_cfg=ingest_cfg,
        stopping=stopping,
        attempts_counter=attempts_counter,
        dlq=dlq,
        publish_reply=publish_reply,
        partition_counts=partition_counts,
        input_topics=topics.inputs(),
        erased_tenants=erased_tenants,
    )
    lanes = lanes if lanes is not None else lanes_for(cfg)
    events = (("documents", "document", topics.documents), ("transcripts", "transcript", topics.transcripts))
    for role, kind, base in events:
        own = lanes[role]
        watch = AssignmentWatcher(role, on_assigned, on_revoked, lanes=own)
        _subscribe_events(
            router,
            ingestion,
            kind=kind,
            base=base,
            cfg=cfg,
            watch=watch,
            lanes=own,
            seen=seen,
            saw_tenant=saw_tenant,
        )
    _subscribe_queries(
        router,
        search=search,
        topics=topics,
        cfg=cfg,
        watch=AssignmentWatcher("requests", on_assigned, on_revoked),
        publish_reply=publish_reply,
        partition_counts=partition_counts,
        on_query_done=on_query_done,
        seen=seen,
        erased_tenants=erased_tenants,
    )
    return router


def lanes_for(cfg: ConsumerConfig) -> dict[str, Lanes]:
    """The lanes of the documents and transcripts subscribers, by role."""
    return {role: Lanes(role, min_bytes=cfg.ingest_lane_min_bytes, most=cfg.ingest_lanes) for role in INGEST_ROLES}
