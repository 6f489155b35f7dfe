"""`agentmemd reindex`: rebuild the index from Kafka into a new generation, then switch.

The steps, and why each is there (``memory.generations`` has the model):

1. Claim the build slot in Redis (one reindex at a time across the deployment; a build
   whose heartbeat stopped is taken over and its leftovers dropped) and create generation
   N+1 with *this process's* settings (a new model, chunking or schema).
2. Replay the documents and transcripts topics from the earliest offset (or a timestamp)
   up to their end offsets, through the same decoding and ``Ingestor`` the daemon uses,
   pinned to N+1. The live daemons keep consuming and writing to N, and queries keep
   going to N through the alias, the whole time.
3. Copy community summaries (they come from the graph, not from Kafka) from N, re-embedded,
   at their fencing tokens, and the tombstones of removed ones.
4. Check completeness: snapshot the docs N serves, catch up to end offsets read after the
   snapshot, and compare. A doc N+1 lacks (or holds at an older version) was not
   reproduced: its events are gone from Kafka (retention, a restarted in-memory broker,
   ``--since``), the new settings reject it, or it failed. With an unchanged spec it is
   copied over verbatim from N (with its BM25 terms and identifiers analyzed again when only
   the text analysis changed); otherwise the switch is refused unless losses are allowed.
5. Switch: one Redis script makes N+1 active and moves the alias. Writers read the active
   generation inside their WATCH transaction, so none can land in N afterwards.
6. Catch up (retried): replay again up to end offsets read *after* the switch, re-listing
   topics first (a tenant onboarded mid-build), and sync summaries again. Anything a live
   daemon wrote to N before the switch came from an event below those offsets.
7. Drop generation N (unless asked to keep it), but only if N+1 now covers every doc N
   holds: N takes no writes after the switch, so that check is exact. Otherwise N is kept
   and the report says why.
8. After a chunking or model change, re-point the graph: every doc re-extracted from its new
   chunks, replaced at the same version (the graph is shared, not per generation).
9. Release the build slot (held to the end, so no second reindex drops what this one
   still works on).

Invalid events are skipped and counted (the live daemons already dead-lettered them).
Before the switch, any failure drops N+1 and releases the slot: queries never noticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from consumers.decoding import decode_records, tenant_from_topic
from daemon.connections import kafka_options, redis_client
from daemon.settings import Settings
from daemon.teardown import bounded, cancelled
from memory.embedder import EmbedderError, SentenceTransformerEmbedder, WorkerCrashed
from memory.errors import BackendUnavailable, NotFound
from memory.generations import GenerationRegistry, IndexSpec, ReindexConflict, ReindexWouldLose, index_spec
from memory.index import ChunkIndex, DocState, translate_errors
from memory.ingest import Ingestor
from memory.records import COMMUNITY_PREFIX, ChunkRecord
from memory.schema import generation_of, info_index_name, key_root

log = structlog.get_logger()

HEARTBEAT_S = 10.0
#: Seconds without a record before the replay re-reads end offsets (did the log shrink?).
REPLAY_STALL_S = 30.0
#: Seconds the drop of an unswitched build may take (a scan of the keyspace) before the
#: slot is left to go stale instead.
DROP_TIMEOUT_S = 600.0
#: Summaries embedded per request while they are copied into the new generation.
SUMMARY_BATCH = 64
#: Tries of the catch-up after the switch, before the old generation is kept for safety.
CATCH_UP_TRIES = 4
NOT_REPLAYED = (
    "not reproduced by the replay: its events are gone from the topics (retention, a restarted "
    "in-memory broker, --since) or the new settings reject them"
)


@dataclass
class ReindexProgress:
    """Where a reindex is: its phase, and records replayed out of those to replay."""

    phase: str = "starting"
    generation: int = 0
    total: int = 0
    done: int = 0
    applied: int = 0
    skipped: int = 0
    invalid: int = 0
    failed: int = 0
    communities: int = 0
    graph_docs: int = 0
    carried: int = 0  # docs copied from the old generation: the replay did not reproduce them


@dataclass
class ReindexReport:
    """The outcome: generations before and after, and what was replayed."""

    old_generation: int
    new_generation: int
    progress: ReindexProgress
    old_dropped: bool
    took_s: float
    chunks: int = 0
    errors: list[str] = field(default_factory=list)


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


class _Replayer:
    """Reads the source topics partition by partition and applies them to the new generation."""

    def __init__(self, settings: Settings, ingestor: Ingestor, progress: ReindexProgress, report: Callable[[], None]):
        self._s = settings
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
        await self.consumer.start()
        self._since_ms = since_ms
        await self._assign_new()

    async def _assign_new(self) -> None:
        """Assign every source topic partition not assigned yet, from the start (or the time).

        Run before each replay pass: a tenant onboarded, or a partition added, while the
        build ran was written to the old generation by the live daemons, and would be lost
        at the drop if only the first pass's partitions were replayed.
        """
        # The consumer's own metadata may not list topics created since it started; a fresh
        # read of the whole cluster's does (aiokafka has no public call returning partitions).
        cluster = await self.consumer._client.fetch_all_metadata()
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
        ends = await self.consumer.end_offsets(tps)
        positions = {tp: await self.consumer.position(tp) for tp in tps}
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
                    now = await self.consumer.end_offsets(tps)
                except KafkaError as exc:  # the broker is away: keep waiting, as getmany does
                    log.warning("reindex.replay_waiting", error=str(exc))
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

    async def _apply(self, topic: str, records: list[Any]) -> None:
        kind, base = self.sources[topic]
        good, dead = decode_records(
            records,
            kind=kind,
            filter_keys=self._s.index.filter_keys,
            max_content_bytes=self._s.ingest.max_content_bytes,
            tenant_of=lambda t: tenant_from_topic(t, base, self._s.consumer.tenancy),
        )
        self._p.invalid += len(dead)
        if not good:
            return
        rep = await self._ingestor.apply([d.item for d in good])
        self._p.applied += len(rep.applied)
        self._p.skipped += len(rep.skipped)
        self._p.failed += len(rep.failed)
        for item, exc in rep.failed:
            self.failed[(item.tenant, item.doc_id)] = f"{exc.code}: {exc}"
            if self.switched:
                self.failed_after_switch.add(f"{item.tenant}/{item.doc_id}")
            log.warning("reindex.item_failed", doc_id=item.doc_id, code=exc.code, error=str(exc))


def _is_summary(key: tuple[str, str]) -> bool:
    return key[1].startswith(COMMUNITY_PREFIX)


async def _sync_communities(
    source: ChunkIndex,
    target: ChunkIndex,
    embedder: SentenceTransformerEmbedder,
    held: dict[tuple[str, str], DocState] | None = None,
) -> int:
    """Bring the new generation's community summaries level with the old one's: each summary
    (or tombstone of a removed one) the new generation lacks at the old one's fencing token
    is written there at that token, re-embedded.

    Summaries come from the graph, not from Kafka. Copied with their tokens, a worker whose
    claim expired can no more overwrite a newer summary in the new generation than in the
    old, nor bring back one a recompute removed; a summary a live worker already wrote to
    the new generation (a later token) is left alone.
    """
    held = _summaries(await source.doc_versions() if held is None else held)  # a scan: reuse one
    todo = set(await target.behind(held))
    if not todo:
        return 0
    records = [r for r in await source.community_records() if (r.tenant, r.doc_id) in todo]
    for rec, vec in await _embedded(embedder, records):
        await target.apply(rec.doc_id, held[(rec.tenant, rec.doc_id)].version, [rec], vec[None, :], rec.tenant)
    tombstones = [k for k in todo if not held[k].has_chunks and held[k].version is not None]
    for tenant, doc_id in tombstones:
        await target.apply(doc_id, held[(tenant, doc_id)].version, [], np.zeros((0, 1), np.float32), tenant)
    return len(records) + len(tombstones)


async def _embedded(
    embedder: SentenceTransformerEmbedder, records: list[ChunkRecord]
) -> list[tuple[ChunkRecord, np.ndarray]]:
    """The summaries with their vectors, in batches. One the model fails on, or that crashes
    the worker alone, is left out and logged rather than ending the whole reindex: the new
    generation then lacks it, so the exact check after the switch keeps the old generation
    and says which. An outage (the worker killed, a crash not pinned on one summary) still
    ends the step, retried like any."""
    out: list[tuple[ChunkRecord, np.ndarray]] = []
    for start in range(0, len(records), SUMMARY_BATCH):
        part = records[start : start + SUMMARY_BATCH]
        try:  # an outage (EmbedderUnavailable) is not an EmbedderError: it ends the step
            out.extend(zip(part, await embedder.embed_documents([r.text for r in part]), strict=True))
            continue
        except EmbedderError:
            pass  # which one? each alone
        except WorkerCrashed as exc:
            if not exc.signalled:  # killed: an outage
                raise
        for rec in part:
            try:
                (vec,) = await embedder.embed_documents([rec.text])
            except (EmbedderError, WorkerCrashed) as exc:
                if isinstance(exc, WorkerCrashed) and not exc.attributable:
                    raise
                log.warning("reindex.summary_not_embedded", tenant=rec.tenant, doc_id=rec.doc_id, error=str(exc))
                continue
            out.append((rec, vec))
    return out


def _served(held: dict[tuple[str, str], DocState]) -> dict[tuple[str, str], DocState]:
    """The docs (not summaries) a generation serves: those with chunks."""
    return {k: st for k, st in held.items() if st.has_chunks and not _is_summary(k)}


def _tombstones(held: dict[tuple[str, str], DocState]) -> dict[tuple[str, str], DocState]:
    """Deleted docs (not summaries): a version and no chunks. Kept so that an older upsert,
    redelivered or re-sent, can never bring the doc back; they hold no vectors, so they are
    copied whatever the spec."""
    return {k: st for k, st in held.items() if not st.has_chunks and st.version is not None and not _is_summary(k)}


def _summaries(held: dict[tuple[str, str], DocState]) -> dict[tuple[str, str], DocState]:
    return {k: st for k, st in held.items() if _is_summary(k)}


def carry_mode(old: IndexSpec | None, new: IndexSpec) -> str | None:
    """How the docs a replay did not reproduce can come over from the old generation (pure).

    ``"verbatim"``: the same spec, so the stored chunks are what a replay would write.
    ``"reanalyze"``: only the text analysis changed (a release that bumps ANALYZER_VERSION),
    so chunk texts and vectors still are, and their BM25 terms and identifiers are computed
    again. Without it an upgrade on the embedded broker, whose log does not outlive a
    restart, could reindex nothing and would lose every doc. ``None``: another model,
    chunking or schema, which only a replay can produce.
    """
    if old is None:
        return None
    if old == new:
        return "verbatim"
    if old.only_analysis_differs(new):
        return "reanalyze"
    return None


async def _complete(
    source: ChunkIndex, target: ChunkIndex, held: dict[tuple[str, str], DocState], carry: str | None
) -> tuple[list[tuple[str, str]], int]:
    """Bring ``target`` level with the docs ``held`` from ``source`` where it can: tombstones
    always, served docs when ``carry`` (:func:`carry_mode`) allows. Returns the docs still
    missing (or older) in ``target``, and how many were copied."""
    copied = 0
    tombstones = _tombstones(held)
    if short := await target.behind(tombstones):
        copied += await _carry_over(source, target, short)
    served = _served(held)
    short = await target.behind(served)
    if short and carry is not None:
        copied += await _carry_over(source, target, short, reanalyze=carry == "reanalyze")
        short = await target.behind(served)
    return short + await target.behind(tombstones), copied


async def _carry_over(
    source: ChunkIndex, target: ChunkIndex, keys: list[tuple[str, str]], *, reanalyze: bool = False
) -> int:
    """Copy docs the rebuild did not reproduce from the old generation (see :func:`carry_mode`)."""
    assert source.pinned is not None
    copied = 0
    for tenant, doc_id in keys:
        copied += await target.copy_doc(source.pinned, tenant, doc_id, reanalyze=reanalyze)
    return copied


def _why_missing(keys: list[tuple[str, str]], failed: dict[tuple[str, str], str]) -> dict[str, str]:
    """``tenant/doc_id`` -> why the new generation lacks it."""
    return {f"{t}/{d}": failed.get((t, d), NOT_REPLAYED) for t, d in keys}


async def repoint_graph(settings: Settings, redis: Any, target: ChunkIndex, embedder: Any = None) -> int:
    """After a chunking change, every tenant's graph re-extracted from the new chunks: its
    entities' chunk references and co-occurrence edges would otherwise name the old ones.
    Every tenant is tried even if one fails; the first failure is raised at the end."""
    from graph.ner import SpacyNer
    from graph.registry import GraphRegistry

    ner = await SpacyNer.load(settings.graph.spacy_model) if settings.graph.spacy_model else None
    try:
        registry = GraphRegistry(
            client=redis, name=settings.index.name, index=target, embedder=embedder, ner=ner, cfg=settings.graph
        )
        done, failure = 0, None
        for tenant in await registry.tenants():
            try:
                done += await registry.service(tenant).repoint(target)
            except Exception as exc:
                log.error("reindex.graph_repoint_tenant_failed", tenant=tenant, error=str(exc))
                failure = failure or exc
        if failure is not None:
            raise failure
        return done
    finally:
        if ner is not None:
            ner.close()


async def reindex(
    settings: Settings,
    *,
    since_ms: int | None = None,
    keep_old: bool = False,
    allow_losses: bool = False,
    on_progress: Callable[[ReindexProgress], None] = lambda _p: None,
    embedder: SentenceTransformerEmbedder | None = None,
) -> ReindexReport:
    """Rebuild the index into a new generation from Kafka with ``settings`` and switch to it.

    Args:
        settings: the settings to build with (model, chunking, schema) and to reach Kafka/Redis.
        since_ms: replay from the first offsets at or after this Unix time in ms (None: earliest).
        keep_old: keep the old generation's index and keys after the switch.
        allow_losses: switch even if docs the old generation serves are not in the new one
            (and cannot be copied over: another spec).
        on_progress: called as the replay advances (from the event loop; keep it quick).
        embedder: a loaded embedder to borrow (never closed here; its settings must be
            ``settings.embedding``); by default the build loads its own.

    Raises:
        NotFound: there is no index to rebuild yet.
        ReindexConflict: another reindex is running.
        ReindexWouldLose: docs the old generation serves are not in the new one (and
            ``allow_losses`` is not set); nothing changed.
        BackendUnavailable: Redis or Kafka went away before the switch (nothing changed).
        ValueError: a lent embedder was loaded with other embedding settings.
    """
    from daemon.app import offline_environment

    t0 = time.monotonic()
    offline_environment()
    owner = f"reindex-{uuid.uuid4().hex[:8]}"
    progress = ReindexProgress()

    def report() -> None:
        on_progress(progress)

    if embedder is not None:
        embedder.check_lent_to(settings.embedding, "build's")
    owns_embedder = embedder is None
    if embedder is None:  # before the Redis client: a model that fails to load leaks nothing
        embedder = await SentenceTransformerEmbedder.load(settings.embedding)
    redis = redis_client(settings)
    spec = index_spec(settings.index, model=settings.embedding.model, dims=embedder.dims, chunking=settings.chunking)
    registry = GenerationRegistry(redis, settings.index.name)
    replayer: _Replayer | None = None
    heartbeat: asyncio.Task[None] | None = None
    stop_beating = asyncio.Event()
    switched = claimed = False
    target: ChunkIndex | None = None
    try:
        async with translate_errors("reindex start"):
            state = await registry.state()
        if state.active == 0:
            raise NotFound(f"index {settings.index.name!r} has no generation yet: start the daemon once to create it")
        async with translate_errors("reindex claim"):
            gen, abandoned = await registry.claim(owner)
        claimed = True
        async with translate_errors("reindex start"):  # a reindex may have switched meanwhile
            state = await registry.state()
        old = state.active
        # Chunk boundaries come from the model's tokenizer too.
        rechunked = state.spec is None or (state.spec.model, state.spec.max_tokens, state.spec.overlap) != (
            spec.model,
            spec.max_tokens,
            spec.overlap,
        )
        progress.generation = gen
        log.info("reindex.started", index=settings.index.name, old_generation=old, generation=gen, owner=owner)
        if abandoned and abandoned != old:
            # A reindex that died mid-build left its generation's index and keys behind
            # (one that died after its switch left the active one: that stays).
            log.warning("reindex.abandoned_build_dropped", generation=abandoned)
            with contextlib.suppress(ReindexConflict):  # only its notes: it is neither active nor building
                await registry.forget(abandoned)
            await ChunkIndex(client=redis, cfg=settings.index, dims=embedder.dims, generation=abandoned).drop()

        async def beat() -> None:
            # The flag as well as the cancellation: a cancellation swallowed somewhere in a
            # client library would otherwise leave this loop beating after the reindex ended.
            while not stop_beating.is_set():
                await asyncio.sleep(HEARTBEAT_S)
                if stop_beating.is_set():
                    return
                try:
                    async with translate_errors("reindex heartbeat"):
                        await registry.heartbeat(owner)
                except BackendUnavailable as exc:
                    # A blip must not end the build: the slot only goes stale after
                    # STALE_BUILD_S without a beat, and the next beat retries.
                    log.warning("reindex.heartbeat_failed", error=str(exc))

        heartbeat = asyncio.create_task(beat())
        target = ChunkIndex(client=redis, cfg=settings.index, dims=embedder.dims, spec=spec, generation=gen)
        source = ChunkIndex(client=redis, cfg=settings.index, dims=embedder.dims, spec=spec, generation=old)
        await target.ensure()
        ingestor = Ingestor(index=target, embedder=embedder, chunking=settings.chunking, cfg=settings.ingest)
        replayer = _Replayer(settings, ingestor, progress, report)
        try:
            await replayer.start(since_ms)
            progress.phase = "replaying"
            await replayer.replay_to_end()
        except KafkaError as exc:
            raise BackendUnavailable(f"kafka failed during the replay: {exc}") from exc

        progress.phase = "copying summaries"
        report()
        progress.communities = await _sync_communities(source, target, embedder)
        if heartbeat.done():  # the slot was lost while replaying
            heartbeat.result()

        # Completeness: every doc N serves must be in N+1 at its version or a later one.
        # The replay alone does not prove it: events may be gone from the topics, or be
        # rejected by the new settings. Snapshot N first, then catch up to end offsets read
        # after it: whatever a live daemon wrote to N came from an event below them.
        progress.phase = "checking"
        report()
        snapshot = await source.doc_versions()
        try:
            await replayer.replay_to_end()
        except KafkaError as exc:
            raise BackendUnavailable(f"kafka failed during the replay: {exc}") from exc
        # Same model, chunking and schema: N's chunks are what a replay would write (with
        # their terms analyzed again if only the analysis changed).
        carry = carry_mode(state.spec, spec)
        missing, progress.carried = await _complete(source, target, snapshot, carry)
        lost = _why_missing(missing, replayer.failed)
        if lost and not allow_losses:
            shown = "; ".join(f"{d} ({why})" for d, why in list(lost.items())[:10])
            raise ReindexWouldLose(
                f"{len(lost)} doc(s) served by generation {old} are not in the new build, so the switch would "
                f"lose them: {shown}{' ...' if len(lost) > 10 else ''}. Nothing was switched; republish, fix or "
                "delete them, or pass --allow-losses"
            )
        if lost:
            log.warning("reindex.losses_allowed", lost=len(lost), docs=list(lost)[:50])
        accepted = set(missing)

        progress.phase = "switching"
        report()
        try:
            async with translate_errors("reindex switch"):
                await registry.switch(owner, gen, spec)
        except BackendUnavailable:
            # The reply may be what was lost, not the switch: never treat the live
            # generation as an unswitched build (the finally block would drop it).
            if await _went_live(registry, gen) is not True:
                raise
        switched = replayer.switched = True
        log.info("reindex.switched", index=settings.index.name, old_generation=old, generation=gen)

        # From here on the new generation is live: failures are reported, not rolled back.
        errors: list[str] = []
        progress.phase = "catching up"
        report()
        for attempt in range(CATCH_UP_TRIES):
            try:
                await replayer.replay_to_end()
                break
            except (KafkaError, BackendUnavailable) as exc:
                log.warning("reindex.catch_up_retry", attempt=attempt + 1, error=str(exc))
                if attempt == CATCH_UP_TRIES - 1:
                    errors.append(f"catch-up after the switch failed: {exc}")
                    log.error("reindex.catch_up_failed", error=str(exc))
                else:
                    await asyncio.sleep(2.0**attempt)
            except Exception as exc:  # the switch is done: report it, and keep N (below)
                errors.append(f"catch-up after the switch failed: {type(exc).__name__}: {exc}")
                log.error("reindex.catch_up_failed", error=str(exc))
                break
        if replayer.failed_after_switch:
            errors.append(
                f"{len(replayer.failed_after_switch)} doc(s) failed in the catch-up after the switch: "
                + ", ".join(sorted(replayer.failed_after_switch)[:10])
            )
        # N takes no writes since the switch: this check is exact. N is dropped only if N+1
        # holds everything N does, summaries and tombstones included (but the losses allowed
        # above); what N+1 lacks is copied over first where it can be.
        short: list[tuple[str, str]] = []
        try:
            held = await source.doc_versions()
            for attempt in range(CATCH_UP_TRIES):
                try:
                    progress.communities += await _sync_communities(source, target, embedder, held)
                    break
                except (KafkaError, BackendUnavailable) as exc:
                    if attempt == CATCH_UP_TRIES - 1:
                        raise
                    log.warning("reindex.summary_sync_retry", attempt=attempt + 1, error=str(exc))
                    await asyncio.sleep(2.0**attempt)
            short, copied = await _complete(source, target, held, carry)
            progress.carried += copied
            short += await target.behind(_summaries(held))
        except Exception as exc:  # unknown is not complete: N stays
            errors.append(f"could not bring the new generation level with the old: {type(exc).__name__}: {exc}")
            log.error("reindex.final_check_failed", error=str(exc))
            short = [("?", "?")]
        unexpected = [k for k in short if k not in accepted]
        dropped = False
        if unexpected:
            shown = ", ".join(f"{t}/{d}" for t, d in unexpected[:10])
            why = (
                f"{len(unexpected)} doc(s) it holds are missing or older in generation {gen} ({shown}); they are "
                f"still in generation {old}'s keys"
            )
            errors.append(f"generation {old} was kept: {why}. Run `agentmemd reindex` again once the cause is fixed")
            log.error("reindex.old_generation_kept", generation=old, missing=len(unexpected))
            with contextlib.suppress(Exception):  # doctor shows it, and warns against dropping it
                await registry.mark_kept(old, why)
        else:
            try:
                async with translate_errors("reindex final check"):
                    await registry.unmark_kept(old)
                if not keep_old:
                    progress.phase = "dropping the old generation"
                    report()
                    # Its registry notes go with it, as drop-generation's do (an operator found a
                    # spec entry left behind by every reindex).
                    await registry.forget(old)
                    await source.drop()
                    dropped = True
            except Exception as exc:  # the switch is done: reported, never a failed command
                errors.append(
                    f"generation {old} could not be dropped ({type(exc).__name__}: {exc}); "
                    f"run `agentmemd drop-generation {old}`"
                )
                log.error("reindex.old_generation_drop_failed", generation=old, error=str(exc))
        if rechunked and settings.graph.enabled:
            progress.phase = "re-pointing the graph"
            report()
            try:
                progress.graph_docs = await repoint_graph(settings, redis, target, embedder)
            except Exception as exc:  # the switch is done: report, never leave the reindex half-told
                errors.append(
                    f"the graph still points at the old chunks ({type(exc).__name__}: {exc}); "
                    "run `agentmemd graph repoint` to retry"
                )
                log.error("reindex.graph_repoint_failed", error=str(exc))
        progress.phase = "done"
        report()
        try:
            chunks = await target.count()
        except Exception as exc:  # only a figure for the report
            log.warning("reindex.count_failed", error=str(exc))
            chunks = -1
        took = time.monotonic() - t0
        log.info(
            "reindex.finished",
            index=settings.index.name,
            generation=gen,
            records=progress.done,
            applied=progress.applied,
            invalid=progress.invalid,
            chunks=chunks,
            took_s=round(took, 1),
        )
        return ReindexReport(old, gen, progress, dropped, took, chunks, errors)
    finally:
        # Each step bounded: the work is done (or has failed) and was reported, so a close
        # hanging in a client library must not keep the command from returning.
        stop_beating.set()
        if heartbeat is not None:
            await cancelled("reindex heartbeat", heartbeat)
        build_left = False
        if not switched and target is not None:
            # Nothing was switched: leave no trace of the build. A drop that fails or runs
            # long keeps the slot: its heartbeat goes stale, and the next reindex's claim
            # reports the build as abandoned and drops it (never the active generation: when
            # it cannot be read whether the build went live after all, the slot is kept too).
            live = await _went_live(registry, gen)
            if live is None:
                build_left = True
            elif not live:
                build_left = not await bounded("drop the unswitched build", target.drop(), seconds=DROP_TIMEOUT_S)
        if claimed and not build_left:
            await bounded("release the build slot", registry.release(owner))
        if replayer is not None:
            await bounded("stop the replay consumer", replayer.consumer.stop())
        await bounded("close redis", redis.aclose())
        if owns_embedder:
            embedder.close()


async def _went_live(registry: GenerationRegistry, gen: int) -> bool | None:
    """Whether ``gen`` is the active generation (a switch whose reply was lost); ``None``
    when that cannot be read either."""
    try:
        async with translate_errors("reindex switch check"):
            return (await registry.state()).active == gen
    except Exception as exc:
        log.warning("reindex.switch_unknown", generation=gen, error=str(exc))
        return None


async def drop_generation(settings: Settings, redis: Any, generation: int, *, force: bool = False) -> int:
    """Drop a generation kept beside the active one (``--keep-old``, a reindex that kept it,
    one left by a reindex that died): its index, chunk hashes and bookkeeping keys. Returns
    how many keys went.

    Raises:
        ReindexConflict: it is the active generation, or a live reindex is building it.
        ReindexWouldLose: a reindex kept it because the active one lacks some of its docs
            (unless ``force``).
        NotFound: no such generation.
    """
    registry = GenerationRegistry(redis, settings.index.name)
    async with translate_errors("generation drop"):
        why = (await registry.kept()).get(generation)
        if why and not force:
            raise ReindexWouldLose(
                f"generation {generation} was kept by a reindex: {why}. Dropping it loses those docs; "
                "pass --force to drop it anyway"
            )
        alias = await registry.alias_info()
        if alias is not None and generation_of(settings.index.name, info_index_name(alias)) == generation:
            raise ReindexConflict(
                f"generation {generation} is the active one: the alias {settings.index.name!r} points at it"
            )
        root = key_root(settings.index.name, generation)
        keys = [k async for k in redis.scan_iter(match=root + "*", count=1000)]
        if generation not in await registry.listed() and not keys:
            raise NotFound(f"index {settings.index.name!r} has no generation {generation}")
        await registry.forget(generation)
    index = ChunkIndex(client=redis, cfg=settings.index, dims=1, generation=generation)
    await index.drop()
    log.info("reindex.generation_dropped", index=settings.index.name, generation=generation, keys=len(keys))
    return len(keys)
