"""doctor's checks of the index in Redis: its generation against the settings, its BM25
lengths, writes left unfinished, the explorer's directory, leftover generations, failing summaries and daemons that
cannot use the index."""

from __future__ import annotations

from typing import Any

from daemon.doctor_finding import Finding
from daemon.settings import Settings
from graph.config import EXTRACTIVE
from graph.summary_records import recorded_summarizer
from memory.errors import NotFound
from memory.generations import index_spec
from memory.index import MAX_PAGE, ChunkIndex, GenerationRegistry, redis_now, translate_errors
from memory.index.lifecycle import REFUSED_INDEX
from memory.keys import generation_of, key_root, physical_name
from memory.schema import info_index_name
from memory.server_policies import keeps_rewritten_lengths, writes_per_chunk
from memory.tenants import TenantRegistry


async def check_generation(client: Any, settings: Settings, dims: int | None) -> list[Finding]:
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


async def check_directory(client: Any, settings: Settings, dims: int) -> list[Finding]:
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


async def check_lengths(client: Any, name: str, info: Any) -> list[Finding]:
    """How far the average length BM25 divides by has drifted (``memory.server_policies``):
    never a fault, as measured (decision 0076), but why scores move when the index is built anew."""
    ratio = writes_per_chunk(info)
    if ratio is None:
        return []
    writes = f"{ratio:.1f} writes per chunk counted by the index"
    keeps = await keeps_rewritten_lengths(client, name)
    if keeps is None:
        said = f"{writes} (whether this RediSearch counts each in BM25's lengths could not be probed)"
    elif keeps:
        said = (
            f"{writes}; this RediSearch counts each in the average length BM25 divides by (about {ratio:.0f} "
            "times the chunks' own), so scores move a little when it is built anew (a reindex)"
        )
    else:
        said = f"{writes}; this RediSearch counts each chunk's length once"
    return [Finding("BM25 lengths", True, said)]


#: A sliced write with no progress for this long is reported as one whose writer died. A
#: writer of the same version takes it over sooner (``memory.visibility.TAKEOVER_AFTER_S``),
#: but only if one comes: this reports the ones nobody will.
STUCK_WRITE_S = 600.0


async def check_summaries(client: Any, settings: Settings) -> list[Finding]:
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
        return [Finding("summaries", True, f"none failing; {_communities(queued)} stale, queued")]
    tenants = sorted({t for t, _, _ in failing})
    worst = max(failing, key=lambda f: f[1])
    detail = (
        f"{_communities(len(failing))} failed to be summarized (tenant(s) {', '.join(tenants[:5])}; "
        f"one failed {worst[1]} time(s): {worst[2] or '?'})"
    )
    # The fix for what failed: an LLM's settings only where an LLM writes the summaries, as the
    # daemons recorded it (this shell's settings may not be theirs).
    recorded = await recorded_summarizer(client, settings.index.name)
    writer = recorded[0] if recorded is not None else settings.graph.summarizer
    if worst[2].startswith(REFUSED_INDEX):
        cause = "a daemon could not use the index (the index check says why); summaries are retried once it can"
    elif writer != EXTRACTIVE:
        cause = (
            f"the daemons write summaries with {writer}: check their graph.llm_model, graph.llm_api_base and "
            "graph.llm_api_key (docs/graph.md)"
        )
    else:
        cause = "the extractive summarizer failed: the daemon's log says why (graph.summary_failed)"
    fix = f"{cause}; `agentmemd stale` shows each community's last error"
    return [Finding("summaries", False, detail, fix)]


async def check_standings(client: Any, settings: Settings) -> list[Finding]:
    """Running daemons that cannot use the index (``daemon.presence``): started with other
    settings than the active generation's, they write nothing and answer ``unavailable`` for
    the partitions they hold, and the groups' members alone say nothing of it. None heard from:
    nothing to say (the Kafka checks say whether any consumes)."""
    from daemon.presence import standings

    running = await standings(client, settings.index.name)
    refused = [s for s in running if not s.usable]
    if not running:
        return []
    if not refused:
        return [Finding("daemon settings", True, f"{len(running)} daemon(s) running, each can use the index")]
    shown = "; ".join(f"{s.host} pid {s.pid} (groups {s.group}): {s.why}" for s in refused)
    detail = f"{len(refused)} of {len(running)} daemon(s) cannot use the index: {shown}"
    fix = (
        "their share of the partitions waits, and their questions answer `unavailable`: stop them, or start "
        "them again with the settings the active generation was built with (the same AGENTMEM_CONFIG_FILE and "
        "AGENTMEM_ variables as the others); to move every daemon to new settings, `agentmemd reindex` with "
        "them first (docs/reindex.md)"
    )
    return [Finding("daemon settings", False, detail, fix)]


async def check_unfinished_writes(client: Any, settings: Settings, dims: int) -> list[Finding]:
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


def _communities(n: int) -> str:
    return f"{n} community" if n == 1 else f"{n} communities"
