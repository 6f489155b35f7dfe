"""One reindex run, its steps a method each (:class:`Reindex`); ``daemon.reindex.start`` starts one.

The steps stand on the run's parts: the build slot (``slot``), the replay (``replay``), the
summaries (``summaries``), the completeness check (``completeness``) and, once switched, the
old generation's handover to the new one (``handover``, whose methods are steps 6 and 7).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
from aiokafka.errors import KafkaError

from daemon.connections import redis_client
from daemon.reindex.completeness import (
    Carry,
    carry_mode,
    complete,
    fields_only_change,
    losses_refused,
    why_missing,
)
from daemon.reindex.handover import Handover
from daemon.reindex.replay import Replayer
from daemon.reindex.repoint import repoint_graph
from daemon.reindex.report import ReindexProgress, ReindexReport
from daemon.reindex.slot import BuildSlot
from daemon.reindex.summaries import sync_communities
from daemon.settings import Settings
from daemon.teardown import bounded
from memory.embedder import SentenceTransformerEmbedder
from memory.errors import BackendUnavailable
from memory.generations import index_spec
from memory.index import ChunkIndex, GenerationRegistry
from memory.ingest import Ingestor
from memory.tenants import TenantRegistry

log = structlog.get_logger()


class Reindex:
    """One rebuild of the index from Kafka into generation N+1, then the switch to it.

    :meth:`run` takes the steps in order, each a method of this class or, for 6 and 7, of its
    :class:`~daemon.reindex.handover.Handover` (``memory.generations`` has the model):

    1. :meth:`reserve`: reserve the build slot in Redis (one reindex at a time across the
       deployment; a build whose heartbeat stopped is taken over and its leftovers dropped)
       and create generation N+1 with *this process's* settings (a new model, chunking or
       schema).
    2. :meth:`replay`: replay the documents and transcripts topics from the earliest offset
       (or a timestamp) up to their end offsets, through the same decoding and ``Ingestor``
       the daemon uses, pinned to N+1. The live daemons keep consuming and writing to N, and
       queries keep going to N through the alias, the whole time.
    3. :meth:`copy_summaries`: copy community summaries (they come from the graph, not from
       Kafka) from N, re-embedded, at their fencing tokens, and the tombstones of removed ones.
    4. :meth:`check_completeness`: snapshot the docs N serves, catch up to end offsets read
       after the snapshot, and compare. A doc N+1 lacks (or holds at an older version) was not
       reproduced: its events are gone from Kafka (retention, a restarted in-memory broker,
       ``--since``), the new settings reject it, or it failed. With the same model and
       chunking it is copied over from N (with its BM25 terms and identifiers analyzed again
       when the text analysis changed, and its filter fields set again from its metadata when
       the index fields changed); otherwise the switch is refused unless losses are allowed.
    5. :meth:`switch`: one Redis script makes N+1 active and moves the alias. Writers read the
       active generation inside their WATCH transaction, so none can land in N afterwards.
    6. :meth:`Handover.catch_up <daemon.reindex.handover.Handover.catch_up>` (retried): replay
       again up to end offsets read *after* the switch, re-listing topics first (a tenant
       onboarded mid-build), and sync summaries again. Anything a live daemon wrote to N
       before the switch came from an event below those offsets.
    7. :meth:`Handover.drop_old <daemon.reindex.handover.Handover.drop_old>`: drop generation N
       (unless asked to keep it), but only if N+1 now covers every doc N holds: N takes no
       writes after the switch, so that check is exact. Otherwise N is kept and the report
       says why.
    8. :meth:`repoint`: after a chunking or model change, re-point the graph: every doc
       re-extracted from its new chunks, replaced at the same version (the graph is shared,
       not per generation).
    9. :meth:`release`: release the build slot (held to the end, so no second reindex drops
       what this one still works on).

    Invalid events are skipped and counted (the live daemons already dead-lettered them).
    Before the switch, any failure drops N+1 and releases the slot: queries never noticed.
    From the switch on, failures are reported (``ReindexReport.errors``), never rolled back.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        embedder: SentenceTransformerEmbedder,
        owns_embedder: bool,
        since_ms: int | None,
        keep_old: bool,
        allow_losses: bool,
        on_progress: Callable[[ReindexProgress], None],
        started: float,
    ) -> None:
        self._s = settings
        self._embedder = embedder
        self._owns_embedder = owns_embedder
        self._since_ms = since_ms
        self._keep_old = keep_old
        self._allow_losses = allow_losses
        self._on_progress = on_progress
        self._started = started
        self.progress = ReindexProgress()
        self._redis = redis_client(settings)
        self._spec = index_spec(
            settings.index, model=settings.embedding.model, dims=embedder.dims, chunking=settings.chunking
        )
        self._registry = GenerationRegistry(self._redis, settings.index.name)
        self._slot = BuildSlot(self._registry)
        # Set by reserve(): the generations, and what the old one's spec allows.
        self._old = self._gen = 0
        self._rechunked = False
        self._settings_changed = False
        self._carry: Carry | None = None
        self._source: ChunkIndex | None = None
        self._target: ChunkIndex | None = None
        self._replayer: Replayer | None = None
        self._errors: list[str] = []

    async def run(self) -> ReindexReport:
        """Take every step in order; :meth:`release` whatever happens."""
        try:
            await self.reserve()
            await self.replay()
            await self.copy_summaries()
            accepted = await self.check_completeness()
            await self.switch()
            handover = self._handover()
            await handover.catch_up()
            dropped = await handover.drop_old(accepted)
            await self.repoint()
            return await self._finish(dropped)
        finally:
            await self.release()

    def _report(self) -> None:
        self._on_progress(self.progress)

    def _indexes(self) -> tuple[ChunkIndex, ChunkIndex]:
        """The old generation's index and the new one's (from :meth:`reserve` on)."""
        assert self._source is not None and self._target is not None, "reserve() creates them"
        return self._source, self._target

    def _replaying(self) -> Replayer:
        """The replay consumer (from :meth:`replay` on)."""
        assert self._replayer is not None, "replay() creates it"
        return self._replayer

    def _handover(self) -> Handover:
        """Steps 6 and 7, after :meth:`switch`; what they do goes to this run's progress and errors."""
        source, target = self._indexes()
        return Handover(
            registry=self._registry,
            owner=self._slot.owner,
            source=source,
            target=target,
            replayer=self._replaying(),
            embedder=self._embedder,
            carry=self._carry,
            old=self._old,
            gen=self._gen,
            keep_old=self._keep_old,
            progress=self.progress,
            report=self._report,
            errors=self._errors,
        )

    # -- 1. reserve ----------------------------------------------------------------------

    async def reserve(self) -> None:
        """Take the build slot, drop an abandoned build's leftovers, start the heartbeat and
        create generation N+1.

        Raises:
            NotFound: the index has no generation yet.
            ReindexConflict: another reindex holds the slot.
        """
        state, abandoned = await self._slot.reserve()
        self._gen, self._old = self._slot.generation, state.active
        spec = self._spec
        # Chunk boundaries come from the model's tokenizer too.
        old = state.spec.known(spec) if state.spec is not None else None
        self._rechunked = old is None or old.chunks() != spec.chunks()
        # Daemons still running with the old generation's settings refuse the new one (an old
        # generation that recorded no spec refuses nobody).
        self._settings_changed = old is not None and old != spec
        self.progress.settings_changed = self._settings_changed
        self.progress.generation = self._gen
        log.info(
            "reindex.build_started",
            index=self._s.index.name,
            old_generation=self._old,
            generation=self._gen,
            owner=self._slot.owner,
        )
        dims = self._embedder.dims
        if abandoned and abandoned != self._old:
            left = ChunkIndex(client=self._redis, cfg=self._s.index, dims=dims, generation=abandoned)
            await self._slot.drop_abandoned(abandoned, left)
        self._slot.start_heartbeat()
        self._target = ChunkIndex(client=self._redis, cfg=self._s.index, dims=dims, spec=spec, generation=self._gen)
        self._source = ChunkIndex(client=self._redis, cfg=self._s.index, dims=dims, spec=spec, generation=self._old)
        # Same model and chunking: N's chunks and vectors are what a replay would write (with
        # their terms analyzed again, or their filter fields set again, where those changed).
        fields_only = False
        if old is not None and old.schema_digest != spec.schema_digest:
            old_keys = await self._source.built_with_keys(self._old)
            fields_only = fields_only_change(old, self._s.index, old_keys)
        self._carry = carry_mode(old, spec, fields_only=fields_only)
        await self._target.ensure()

    # -- 2. replay -----------------------------------------------------------------------

    async def replay(self) -> None:
        """Replay the source topics into N+1, up to their end offsets.

        Raises:
            BackendUnavailable: Kafka failed during the replay.
        """
        source, target = self._indexes()
        ingestor = Ingestor(
            index=target, embedder=self._embedder, chunking=self._s.chunking, cfg=self._s.ingest, earlier=source
        )
        erased = TenantRegistry(client=self._redis, name=self._s.index.name).erased
        self._replayer = Replayer(self._s, ingestor, self.progress, self._report, erased=erased)
        try:
            await self._replayer.start(self._since_ms)
            self.progress.phase = "replaying"
            await self._replayer.replay_to_end()
        except KafkaError as exc:
            raise BackendUnavailable(f"kafka failed during the replay: {exc}") from exc

    # -- 3. copy summaries ---------------------------------------------------------------

    async def copy_summaries(self) -> None:
        """Copy N's community summaries and their tombstones into N+1, at their fencing tokens.

        Raises:
            ReindexConflict: the build slot was lost meanwhile.
        """
        source, target = self._indexes()
        self.progress.phase = "copying summaries"
        self._report()
        self.progress.communities = await sync_communities(source, target, self._embedder)
        self._slot.check()  # raises if the slot was lost while replaying

    # -- 4. check completeness -----------------------------------------------------------

    async def check_completeness(self) -> set[tuple[str, str]]:
        """Every doc N serves must be in N+1 at its version or a later one; copy over what can be.

        The replay alone does not prove it: events may be gone from the topics, or be
        rejected by the new settings. Snapshot N first, then catch up to end offsets read
        after it: whatever a live daemon wrote to N came from an event below them.

        Returns:
            The docs N+1 may lack (losses allowed), for the check after the switch.

        Raises:
            BackendUnavailable: Kafka failed during the catch-up.
            ReindexWouldLose: N+1 lacks docs N serves, and losses are not allowed.
        """
        source, target = self._indexes()
        replayer = self._replaying()
        self.progress.phase = "checking"
        self._report()
        snapshot = await source.doc_versions()
        try:
            await replayer.replay_to_end()
        except KafkaError as exc:
            raise BackendUnavailable(f"kafka failed during the replay: {exc}") from exc
        missing, self.progress.carried = await complete(source, target, snapshot, self._carry)
        lost = why_missing(missing, replayer.failed)
        if lost and not self._allow_losses:
            raise losses_refused(lost, self._old, carried=self._carry is not None)
        if lost:
            log.warning("reindex.losses_allowed", lost=len(lost), docs=list(lost)[:50])
        return set(missing)

    # -- 5. switch -----------------------------------------------------------------------

    async def switch(self) -> None:
        """Make N+1 the active generation and move the alias to it (one Redis script).

        Raises:
            BackendUnavailable: Redis went away, and N+1 did not go live.
        """
        self.progress.phase = "switching"
        self._report()
        await self._slot.switch(self._spec)
        self._replaying().switched = True
        self.progress.phase = "switched"
        self._report()
        log.info(
            "reindex.generation_switched", index=self._s.index.name, old_generation=self._old, generation=self._gen
        )

    # -- 6. catch up, 7. drop the old generation: the Handover's -------------------------

    # -- 8. re-point the graph -----------------------------------------------------------

    async def repoint(self) -> None:
        """After a chunking or model change, re-extract the graph from N+1's chunks; failures are reported."""
        if not (self._rechunked and self._s.graph.enabled):
            return
        _, target = self._indexes()
        self.progress.phase = "re-pointing the graph"
        self._report()
        try:
            self.progress.graph_docs = await repoint_graph(self._s, self._redis, target, self._embedder)
        except Exception as exc:  # the switch is done: report, never leave the reindex half-told
            self._errors.append(
                f"the graph still points at the old chunks ({type(exc).__name__}: {exc}); "
                "run `agentmemd graph repoint` to retry"
            )
            log.error("reindex.graph_repoint_failed", error=str(exc))

    async def _finish(self, dropped: bool) -> ReindexReport:
        _, target = self._indexes()
        self.progress.phase = "done"
        self._report()
        try:
            chunks = await target.count()
        except Exception as exc:  # only a figure for the report
            log.warning("reindex.count_failed", error=str(exc))
            chunks = -1
        took = time.monotonic() - self._started
        p = self.progress
        log.info(
            "reindex.build_finished",
            index=self._s.index.name,
            generation=self._gen,
            records=p.done,
            applied=p.applied,
            invalid=p.invalid,
            chunks=chunks,
            took_s=round(took, 1),
        )
        return ReindexReport(self._old, self._gen, p, dropped, took, chunks, self._errors, self._settings_changed)

    # -- 9. release ----------------------------------------------------------------------

    async def release(self) -> None:
        """Stop the heartbeat, drop an unswitched build, release the slot and close the clients.

        Each step is bounded: the work is done (or has failed) and was reported, so a close
        hanging in a client library must not keep the command from returning.
        """
        await self._slot.release(self._target)
        if self._replayer is not None:
            await bounded("stop the replay consumer", self._replayer.consumer.stop())
        await bounded("close redis", self._redis.aclose())
        if self._owns_embedder:
            self._embedder.close()
