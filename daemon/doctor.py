"""`agentmemd doctor`: check settings, connections, the index schema, topics and consumer groups,
and say in words what is wrong and how to fix it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from daemon.connections import kafka_options, redis_client
from daemon.settings import Settings
from daemon.status import group_members, measure_lag, past_end_text
from daemon.teardown import bounded
from daemon.topics import tenant_topics
from memory.config import PACKAGED_DIMS
from memory.errors import MemdError, NotFound
from memory.generations import index_spec
from memory.index import MAX_PAGE, ChunkIndex, GenerationRegistry, redis_now, translate_errors
from memory.keys import generation_of, key_root, physical_name
from memory.schema import compare_schema, index_schema, info_attributes, info_index_name
from memory.server_policies import (
    EVICTION_FIX,
    GC_CLEAN_THRESHOLD,
    GC_FIX,
    SAFE_EVICTION,
    TIMEOUT_FIX,
    eviction_policy,
    gc_clean_threshold,
    search_timeout_policy,
)
from memory.tenants import TenantRegistry


@dataclass(frozen=True, slots=True)
class Finding:
    """One check: its name, whether it passed, what was seen, and how to fix it."""

    check: str
    ok: bool
    detail: str
    fix: str = ""


async def _check_redis(settings: Settings) -> list[Finding]:
    found: list[Finding] = []
    client = redis_client(settings)
    try:
        async with translate_errors("doctor"):
            await client.ping()
            modules = {
                (m.get(b"name") or m.get("name") or b"").decode().lower()
                if isinstance(m.get(b"name") or m.get("name"), bytes)
                else str(m.get(b"name") or m.get("name")).lower()
                for m in await client.module_list()
            }
        found.append(Finding("redis", True, f"reachable at {settings.redis_url}"))
        if "search" not in modules:
            found.append(
                Finding(
                    "redis search module",
                    False,
                    f"modules loaded: {sorted(modules) or 'none'}",
                    "use Redis 8 (query engine built in) or load redisearch.so (--loadmodule)",
                )
            )
            return found
        found.append(Finding("redis search module", True, "loaded"))
        if (timeout := await search_timeout_policy(client)) is not None:
            found.append(
                Finding(
                    "search timeout policy",
                    timeout == "fail",
                    f"ON_TIMEOUT {timeout}"
                    + ("" if timeout == "fail" else ": a slow query answers with partial results, silently"),
                    TIMEOUT_FIX,
                )
            )
        if (threshold := await gc_clean_threshold(client)) is not None:
            found.append(
                Finding(
                    "search GC threshold",
                    threshold <= GC_CLEAN_THRESHOLD,
                    f"FORK_GC_CLEAN_THRESHOLD {threshold}"
                    + (
                        ""
                        if threshold <= GC_CLEAN_THRESHOLD
                        else ": until that many chunks are rewritten, a word in most of them outranks every "
                        "other (its BM25 IDF overflows)"
                    ),
                    GC_FIX,
                )
            )
        if (eviction := await eviction_policy(client)) is not None:
            safe = eviction in SAFE_EVICTION
            found.append(
                Finding(
                    "eviction policy",
                    safe,
                    f"maxmemory-policy {eviction}"
                    + ("" if safe else ": a full Redis deletes memory (chunks, versions, graph) silently"),
                    EVICTION_FIX,
                )
            )
        name = settings.index.name
        try:
            async with translate_errors("doctor"):
                info = await client.ft(name).info()  # type: ignore[no-untyped-call]
        except MemdError as exc:
            found.append(
                Finding(
                    "index",
                    False,
                    f"index {name!r} not found ({exc})",
                    "start the daemon once (`agentmemd run`), it creates the index",
                )
            )
            return found
        dims = PACKAGED_DIMS if settings.embedding.model.startswith("packaged:") else None
        expected = index_schema(settings.index, dims=dims or PACKAGED_DIMS, generation=1)
        problems = compare_schema(expected, info_attributes(info))
        if dims is None:
            problems = [p for p in problems if "dims" not in p]
        if problems:
            found.append(
                Finding(
                    "index schema",
                    False,
                    "; ".join(problems),
                    "the index predates these settings or this version: rebuild it with "
                    "`agentmemd reindex` or drop it and replay from Kafka",
                )
            )
        else:
            entries = f"{info.get('num_docs', '?')} entries (chunks and community summaries)"
            found.append(Finding("index schema", True, f"{name!r} matches the settings, {entries}"))
        found.extend(await _check_generation(client, settings, dims))
        found.extend(await _check_unfinished_writes(client, settings, dims or PACKAGED_DIMS))
        found.extend(await _check_directory(client, settings, dims or PACKAGED_DIMS))
        if settings.graph.enabled:
            found.extend(await _check_summaries(client, settings))
    except MemdError as exc:
        fix = (
            "check AGENTMEM_REDIS_USERNAME / AGENTMEM_REDIS_PASSWORD"
            if exc.code == "unauthorized"
            else f"start Redis at {settings.redis_url} (`agentmemd servers` for a local one)"
        )
        found.append(Finding("redis", False, str(exc), fix))
    finally:
        await client.aclose()
    return found


async def _check_generation(client: Any, settings: Settings, dims: int | None) -> list[Finding]:
    """The active index generation against what these settings would build."""
    registry = GenerationRegistry(client, settings.index.name)
    async with translate_errors("doctor"):
        state = await registry.state()
        alias = await registry.alias_info() if state.active == 0 or state.spec is None else None
    if (state.active == 0 or state.spec is None) and alias is not None:
        aliased = generation_of(settings.index.name, info_index_name(alias))
        if aliased is not None:
            # The registry hash alone was lost (evicted, deleted): the index is intact, and a
            # daemon's start adopts the generation the alias points at. Dropping it would
            # throw away what a replay may no longer rebuild (tansu forgets its log).
            return [
                Finding(
                    "index generation",
                    False,
                    f"the generation registry of {settings.index.name!r} is missing, but the alias points at "
                    f"generation {aliased}",
                    "start a daemon (`agentmemd run` or `up`): it adopts that generation; do not drop the index",
                )
            ]
    if state.active == 0 or state.spec is None:
        return [
            Finding(
                "index generation",
                False,
                f"{settings.index.name!r} is not a generational index (it predates `agentmemd reindex`)",
                "drop it (FT.DROPINDEX <name> DD) and replay the topics from the earliest offset",
            )
        ]
    want = index_spec(
        settings.index, model=settings.embedding.model, dims=dims or state.spec.dims, chunking=settings.chunking
    )
    building = ""
    reindexing = False
    if state.building:
        now = await redis_now(client)  # heartbeats are Redis's clock
        idle = now - state.building_heartbeat
        reindexing = state.build_alive(now)
        if state.building == state.active:  # switched; catching up, dropping, re-pointing
            building = f"; {state.building_owner} is finishing its switch to it"
            if state.unversioned_held(now):
                building += " (its last catch-up holds live writes of transcript turns)"
            if not reindexing:
                building += f" (no heartbeat for {idle:.0f}s: it died; the next reindex takes the slot)"
        else:
            building = f"; generation {state.building} is being built by {state.building_owner}"
            if not reindexing:
                building += f" (abandoned: no heartbeat for {idle:.0f}s; the next reindex drops it)"
    found = await _check_leftover_generations(client, settings, state.active, state.building, reindexing)
    have = state.spec.known(want)
    if want != have:
        fix = have.fix_for(want)
        return [
            Finding(
                "index generation",
                False,
                f"generation {state.active} was built with {have.describe()}, "
                f"these settings build {want.describe()}{building}",
                fix,
            ),
            *found,
        ]
    adopted = (await GenerationRegistry(client, settings.index.name).adopted()).get(state.active)
    if adopted:
        # Not a fault: the spec was assumed when the registry was rebuilt from the alias.
        building += f" ({adopted}: if it was built with another model or chunking, reindex)"
    return [Finding("index generation", True, f"generation {state.active} matches the settings{building}"), *found]


async def _check_directory(client: Any, settings: Settings, dims: int) -> list[Finding]:
    """Whether the active generation keeps the explorer's directory (``memory.index.directory``):
    one created before it lists documents and agents by aggregating every chunk of a tenant.
    Not a fault: only those two listings are slower."""
    index = ChunkIndex(client=client, cfg=settings.index, dims=dims)
    try:
        if await index.has_directory():
            stored = {g.value for g in await index.groups("tenant", {}, limit=MAX_PAGE)}
            tenants = sorted(stored | await index.directory_tenants())
            drift = await index.directory_drift(tenants)
            if not drift:
                return [Finding("explorer directory", True, "each tenant's listings agree with its chunks")]
            return [
                Finding(
                    "explorer directory",
                    False,
                    f"the directory disagrees with the chunks ({'; '.join(drift[:5])}): a daemon of an older "
                    "release wrote into this generation; the explorer's agents and documents listings are off",
                    "run every daemon at this release, then `agentmemd reindex`",
                )
            ]
    except NotFound:
        return []  # no active generation: the generation check says so
    return [
        Finding(
            "explorer directory",
            True,
            "the active generation predates the directory: the explorer lists documents and agents by "
            "aggregating each tenant's chunks (slower as the tenant grows; nothing else is affected); "
            "`agentmemd reindex` builds a generation that keeps one",
        )
    ]


#: A sliced write with no progress for this long is reported as one whose writer died. A
#: writer of the same version takes it over sooner (``memory.visibility.TAKEOVER_AFTER_S``),
#: but only if one comes: this reports the ones nobody will.
STUCK_WRITE_S = 600.0


async def _check_summaries(client: Any, settings: Settings) -> list[Finding]:
    """Whether community summaries are being written: a summary that keeps failing (an LLM that
    is unreachable, refuses, or times out) leaves its community stale, and nothing else says so."""
    from daemon.components import active_index, build_graph

    graph = build_graph(settings, redis=client, index=await active_index(settings, client), embedder=None, ner=None)
    failing: list[tuple[str, int, str]] = []
    queued = 0
    for tenant in await TenantRegistry(client=client, name=settings.index.name).all():
        store = graph.service(tenant).store
        queued += (await store.stale(limit=1))[0]
        failing += [(tenant, attempts, why) for _, attempts, why in await store.failing()]
    if not failing:
        return [Finding("summaries", True, f"none failing; {queued} stale communit(ies) queued")]
    tenants = sorted({t for t, _, _ in failing})
    worst = max(failing, key=lambda f: f[1])
    detail = (
        f"{len(failing)} stale communit(ies) failed to be summarized (tenant(s) {', '.join(tenants[:5])}; "
        f"one failed {worst[1]} time(s): {worst[2] or '?'})"
    )
    fix = (
        "check graph.llm_model, graph.llm_api_base and graph.llm_api_key (docs/graph.md); "
        "`agentmemd stale` shows each community's last error"
    )
    return [Finding("summaries", False, detail, fix)]


async def _check_unfinished_writes(client: Any, settings: Settings, dims: int) -> list[Finding]:
    """Large documents whose sliced write (``memory.visibility``) began and never finished:
    queries show only part of their old version (nothing of a new document) until a write of
    the same or a later version finishes."""
    index = ChunkIndex(client=client, cfg=settings.index, dims=dims)
    try:
        unfinished = await index.unfinished_writes()
    except NotFound:
        return []  # no active generation: the generation check says so
    if not unfinished:
        return [Finding("large writes", True, "no document is being written in slices")]
    async with translate_errors("doctor"):
        now = await redis_now(client)  # the markers' clock: no host's counts
    stuck = {k: m for k, m in unfinished.items() if now - m.beat > STUCK_WRITE_S}
    if not stuck:
        return [Finding("large writes", True, f"{len(unfinished)} document(s) being written in slices")]
    names = ", ".join(
        f"{t}/{d} (version {m.writing}, showing {'version ' + str(m.shown) if m.shown is not None else 'nothing'}, "
        f"begun {(now - m.since) / 60:.0f} min ago, last progress {(now - m.beat) / 60:.0f} min ago)"
        for (t, d), m in sorted(stuck.items())[:10]
    )
    more = f" and {len(stuck) - 10} more" if len(stuck) > 10 else ""
    return [
        Finding(
            "large writes",
            False,
            f"{len(stuck)} document(s) left half-written by a writer that stopped: {names}{more}; queries show "
            "only part of each",
            "publish each document's latest version again (an upsert of that version or a later one finishes it)",
        )
    ]


async def _check_leftover_generations(
    client: Any, settings: Settings, active: int, building: int, reindexing: bool
) -> list[Finding]:
    """Generations beside the active one and the one being built: kept by ``--keep-old``, kept
    by a reindex because the new generation lacks some of their docs, or left marked by a
    reindex that died after its switch, before its final check. Not a fault, but memory an
    operator pays for."""
    registry = GenerationRegistry(client, settings.index.name)
    async with translate_errors("doctor"):
        listed = await registry.listed()
        kept = await registry.kept()
    left = sorted(g for g in listed if g not in (active, building))
    if not left:
        return []
    if reindexing:  # a running reindex still reads (and then drops) its old generation
        return [Finding("old generations", True, f"generation(s) {', '.join(map(str, left))}: a reindex is running")]
    found = []
    for g in left:
        if g in kept:
            detail = (
                f"generation {g} was kept by a reindex: {kept[g]}. Do not drop it before those docs are back "
                f"(then: `agentmemd drop-generation {g} --force`)"
            )
        else:
            detail = (
                f"generation {g} kept beside the active one (--keep-old); "
                f"when no longer wanted: `agentmemd drop-generation {g}` (FT.DROPINDEX "
                f"{physical_name(settings.index.name, g)} DD and its {key_root(settings.index.name, g)}* keys)"
            )
        found.append(Finding("old generations", True, detail))
    return found


async def _check_kafka(settings: Settings) -> list[Finding]:
    found: list[Finding] = []
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=5000, **kafka_options(settings)
    )
    try:
        await asyncio.wait_for(consumer.start(), timeout=15)
        topics = await consumer.topics()
    except (KafkaError, OSError, TimeoutError) as exc:
        with_fix = (
            f"start a broker at {settings.kafka_bootstrap} (`agentmemd servers` for a local one) "
            "or fix AGENTMEM_KAFKA_BOOTSTRAP / AGENTMEM_KAFKA_SECURITY__*"
        )
        return [
            Finding("kafka", False, f"cannot reach {settings.kafka_bootstrap}: {type(exc).__name__}: {exc}", with_fix)
        ]
    finally:
        await bounded("stop the kafka probe", consumer.stop())
    found.append(Finding("kafka", True, f"reachable at {settings.kafka_bootstrap}"))
    t = settings.topics
    wanted = [t.replies, t.dlq]
    tenants: list[str] = []
    if settings.consumer.tenancy == "single":
        wanted += [t.documents, t.transcripts, t.requests]
    else:
        tenants = await _seen_tenants(settings)
        wanted += [name for tenant in tenants for name in tenant_topics(settings, tenant)]
    missing = [name for name in wanted if name not in topics]
    if missing:
        lost = sorted({tenant for tenant in tenants if set(tenant_topics(settings, tenant)) - set(topics)})
        fix = (
            "start the daemon once (it creates them when AGENTMEM_CREATE_TOPICS is true) "
            "or create them with your Kafka tooling"
        )
        if lost:
            fix += f"; a tenant's: a running daemon recreates them, or `agentmemd topics --tenant {lost[0]}`"
        found.append(Finding("topics", False, f"missing: {', '.join(missing[:12])}", fix))
    elif settings.consumer.tenancy != "single" and not tenants:
        # Only the shared topics exist yet: "all present" would hide that no tenant is served.
        detail = f"the {len(wanted)} shared ones present ({t.replies}, {t.dlq}); no tenant yet"
        found.append(Finding("topics", True, detail + ": `agentmemd topics --tenant NAME` onboards one"))
    else:
        seen = f", {len(tenants)} tenants' included" if tenants else ""
        found.append(Finding("topics", True, f"all {len(wanted)} present{seen}"))
    try:
        report = await asyncio.wait_for(measure_lag(settings, bare=True), timeout=20)
        detail = ", ".join(f"{g}: lag {sum(p.values())}" for g, p in sorted(report.lag.items()))
        if report.past_end:
            beyond = past_end_text(report.past_end)
            found.append(
                Finding(
                    "consumer groups",
                    False,
                    f"committed past the end of the log (the broker lost it?): {beyond}",
                    "running daemons move their consumers back to the log's start within "
                    "AGENTMEM_TOPIC_CHECK_S; if this stays, restart them",
                )
            )
        else:
            found.append(Finding("consumer groups", True, f"{detail}; {report.dlq} DLQ records"))
        if report.unread_bare:
            said = ", ".join(f"{n} on {topic}" for topic, n in sorted(report.unread_bare.items()))
            found.append(
                Finding(
                    "bare topics",
                    False,
                    f"in topic tenancy no daemon reads the bare topics, and records wait there: {said}",
                    "publish on <topic>.<tenant> (the CLI's --tenant, the client's tenant=); the records "
                    "waiting belong to no tenant: publish them again on their tenant's topic",
                )
            )
        found.extend(await _check_daemons(settings, sorted(report.lag)))
    except (KafkaError, OSError, TimeoutError) as exc:
        found.append(
            Finding("consumer groups", False, f"cannot read offsets: {exc}", "check broker ACLs for the groups")
        )
    return found


async def _check_daemons(settings: Settings, groups: list[str]) -> list[Finding]:
    """Whether a daemon consumes: each group has a member. Lag alone cannot say: with no
    daemon running it stays where the last one left it, often 0, and all looked well."""
    try:
        members = await group_members(settings, groups)
    except (KafkaError, OSError, TimeoutError) as exc:
        return [Finding("daemons", False, f"cannot describe the groups: {exc}", "check broker ACLs for the groups")]
    except MemdError as exc:  # not authorized, a coordinator loading or moving: says nothing of members
        return [Finding("daemons", False, str(exc), "check broker ACLs for the groups, or retry")]
    idle = [g for g in groups if not members.get(g)]
    if not idle:
        return [Finding("daemons", True, ", ".join(f"{g}: {members[g]} member(s)" for g in groups))]
    start = "start one (`agentmemd run`, or `agentmemd up` on one machine); its log and /readyz say what it waits for"
    if len(idle) == len(groups):
        return [Finding("daemons", False, f"no daemon is consuming: no member in {', '.join(idle)}", start)]
    return [
        Finding(
            "daemons",
            False,
            f"no member in {', '.join(idle)}: their topics are not read",
            "a daemon that is still starting joins within moments; else " + start,
        )
    ]


async def _seen_tenants(settings: Settings) -> list[str]:
    """The tenants daemons have seen (topic tenancy), or none when Redis cannot say (its own finding says why)."""
    client = redis_client(settings)
    try:
        return await asyncio.wait_for(TenantRegistry(client=client, name=settings.index.name).with_topics(), timeout=10)
    except (MemdError, TimeoutError):
        return []
    finally:
        await client.aclose()


async def diagnose(settings: Settings) -> list[Finding]:
    """Every finding, Redis first, then Kafka."""
    redis_findings, kafka_findings = await asyncio.gather(_check_redis(settings), _check_kafka(settings))
    return [Finding("settings", True, "loaded"), *redis_findings, *kafka_findings]
