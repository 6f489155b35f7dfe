"""Erasing a tenant (topic tenancy): every memory, graph and summary of it in Redis, and its
place on the tenant list, for a customer who leaves (a deletion request); with
``delete_topics``, its topics too, with the events they hold.

The erase is marked in Redis first (``TenantRegistry.erase``): from then on daemons neither
apply an event of the tenant (its writer is acked ``ignored``) nor record it again, so they
do not recreate its topics, and a reindex does not replay it. A batch a daemon read before it
saw the mark may still be writing: the keys are deleted once the mark has been seen
(``ERASED_READ_TTL_S``), then swept again, at most ``SWEEP_EVERY_S`` apart, for ``sweep_for_s``
(longer than an LLM summary's call, ``graph.llm_timeout_s``); a summary checks the mark
again before it writes. Creating the tenant's topics again (``agentmemd topics --tenant``)
lifts the mark, for a new start.

Topics are deleted only while no daemon consumes: a consumer whose pattern subscription held
a topic deleted under it retried committing offsets for it without end (aiokafka treats the
broker's "unknown topic" as retryable), and stopped answering every tenant (decision 0059).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiokafka.errors import KafkaError

from consumers.config import ROLES
from consumers.spelling import near_name
from consumers.topic_names import tenant_topic
from daemon.dlq_marks import tenant_marks
from daemon.settings import Settings
from daemon.status import group_members
from daemon.topics import delete_tenant_topics, existing_tenant_topics, tenant_topics
from memory import keys
from memory.errors import BackendUnavailable, InvalidRequest
from memory.index import translate_errors
from memory.schema import as_str
from memory.tenants import ERASED_READ_TTL_S, TenantRegistry

log = structlog.get_logger()

#: Keys deleted per command.
_BATCH = 500
#: Longest pause between two sweeps (each reads the index's keys once).
SWEEP_EVERY_S = 10.0


@dataclass
class EraseReport:
    """What an erase removed."""

    tenant: str
    erased_at: float  # Redis's clock
    topics: list[str] = field(default_factory=list)  # deleted with their events
    keys: int = 0  # Redis keys deleted at first
    late_keys: int = 0  # deleted by the sweeps after: written by batches read before the mark
    swept_s: float = 0.0
    quiet: bool = True  # the last two sweeps found nothing (else: run it again)


async def tenant_keys(client: Any, name: str, tenant: str, topics: Sequence[str] = (), *, delete: bool = True) -> int:
    """Delete every Redis key of ``tenant`` under index ``name`` (each generation's, its
    graph's, the delivery counts and dead-letter marks of its ``topics``' records, and the marks
    of its dead letters sent again) and its
    write markers' listing; returns how many keys were deleted (``delete=False``: how many
    there are, deleting nothing). Reads the index's keys once (``SCAN``), and the others'."""
    owned = keys.tenant_key(name, tenant)
    patterns: list[tuple[str, re.Pattern[str] | None]] = [
        (keys.generation_pattern(name), owned),
        (keys.graph_pattern(name, tenant), None),
        *((p, None) for topic in topics for p in keys.attempt_patterns(name, topic)),
    ]
    found = 0
    async with translate_errors("tenant erase"):
        for pattern, mine in patterns:
            batch: list[Any] = []
            async for key in client.scan_iter(match=pattern, count=1000):
                if mine is None or mine.fullmatch(as_str(key)):
                    batch.append(key)
                if len(batch) >= _BATCH:
                    found += int(await client.unlink(*batch)) if delete else len(batch)
                    batch = []
            if batch:
                found += int(await client.unlink(*batch)) if delete else len(batch)
        if not delete:
            return found
        await tenant_marks(client, name, topics)  # entries of one hash: no key to count
        writing = keys.writing_key(name)
        markers = [m async for m in client.sscan_iter(writing) if owned.fullmatch(as_str(m))]
        for i in range(0, len(markers), _BATCH):
            await client.srem(writing, *markers[i : i + _BATCH])
    return found


def delivery_topics(settings: Settings, tenant: str) -> list[str]:
    """The tenant's topics whose records' deliveries are counted in Redis: the ingest ones
    (each erase sweep scans the keys once per topic and kind)."""
    return [tenant_topic(base, tenant) for base in (settings.topics.documents, settings.topics.transcripts)]


async def check_known(settings: Settings, client: Any, tenant: str) -> None:
    """Refuse a ``tenant`` that no daemon has seen, nobody erased and that has no topic on the
    broker: a misspelt name would be reported erased, with nothing deleted, and a deletion
    request would look done.

    Raises:
        InvalidRequest: ``tenant`` is not known here (naming the one it nearly spells).
        BackendUnavailable: Redis cannot be reached.
    """
    registry = TenantRegistry(client=client, name=settings.index.name)
    seen = await registry.all()
    if tenant in seen or tenant in await registry.erased():
        return
    try:
        # Its topics created, its events maybe sent, but no daemon has read them yet.
        if await existing_tenant_topics(settings, tenant):
            return
        unasked = ""
    except BackendUnavailable as exc:
        unasked = f"; the broker could not be asked for its topics ({exc})"
    near = near_name(tenant, seen)
    raise InvalidRequest(
        f"no tenant {tenant!r} is known here: no daemon has read an event of it, it was never erased"
        + (" and it has no topics" if not unasked else "")
        + unasked
        + (f"; did you mean {near!r}?" if near else "")
        + " (`agentmemd tenants` lists those read)"
    )


async def erase_tenant(
    settings: Settings,
    client: Any,
    tenant: str,
    *,
    delete_topics: bool = False,
    sweep_for_s: float = 90.0,
    topic_timeout_s: float = 30.0,
) -> EraseReport:
    """Erase ``tenant`` (see the module's docstring).

    Raises:
        InvalidRequest: ``tenant`` is no valid tenant name, or no tenant known here, or
            ``delete_topics`` while a daemon consumes (nothing is erased then).
        BackendUnavailable: Redis or the broker cannot be reached (run it again: each step
            is idempotent).
    """
    name = settings.index.name
    tenant_topics(settings, tenant)  # a name that is no tenant's fails before anything is erased
    await check_known(settings, client, tenant)
    if delete_topics:
        groups = [settings.consumer.group(role) for role in ROLES]
        try:
            busy = {g: n for g, n in (await group_members(settings, groups)).items() if n}
        except (KafkaError, OSError, TimeoutError) as exc:
            raise BackendUnavailable(f"kafka at {settings.kafka_bootstrap}: consumer groups unread: {exc}") from exc
        if busy:
            raise InvalidRequest(
                f"daemons consume ({', '.join(f'{g}: {n} member(s)' for g, n in sorted(busy.items()))}): deleting "
                "a topic under a running daemon stalls its consumers for every tenant. Erase without "
                "--delete-topics now, and delete the topics once the daemons are stopped (one stopped less than "
                "consumer.session_timeout_ms ago may still count), or let retention remove their events"
            )
    registry = TenantRegistry(client=client, name=name)
    report = EraseReport(tenant=tenant, erased_at=await registry.erase(tenant))
    log.info("tenant.erase_marked", tenant=tenant)
    if delete_topics:
        report.topics = await delete_tenant_topics(settings, tenant, timeout_s=topic_timeout_s)
    await asyncio.sleep(ERASED_READ_TTL_S * 2)  # every daemon's next batch sees the mark
    marked = delivery_topics(settings, tenant)
    report.keys = await tenant_keys(client, name, tenant, marked)
    # The whole window, not until a first quiet pair of sweeps: a summary's LLM call or a
    # large document's batch may write nothing for a minute, then write.
    started, quiet = time.monotonic(), 0
    every = min(SWEEP_EVERY_S, sweep_for_s / 3)  # at least three sweeps: the last two say it is quiet
    while time.monotonic() - started < sweep_for_s:
        await asyncio.sleep(every)
        late = await tenant_keys(client, name, tenant, marked)
        report.late_keys += late
        quiet = quiet + 1 if late == 0 else 0
    report.swept_s = time.monotonic() - started
    report.quiet = quiet >= 2
    log.info("tenant.data_erased", tenant=tenant, topics=report.topics, keys=report.keys, late_keys=report.late_keys)
    return report
