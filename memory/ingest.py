"""Applying document and transcript changes: chunk, embed in large groups, write per doc.

The :class:`Ingestor` runs a batch through its parts: ``batch_plan`` (one item per doc, the
embedding groups), ``forgets`` (a forget's deletes), ``replays`` (a redelivery told from a
conflict), ``chunk_records`` (an item's chunks), ``session_context`` (a turn's session
context), ``chunk_vectors`` (vectors reused or embedded), ``group_write`` (a group's docs
stored and handed to the ``change_hook``) and ``retrying`` (Redis outages waited out). What
it returns is an ``ingest_report``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import structlog

from memory.activity import IngestActivity
from memory.batch_plan import coalesce, embedding_groups, passed_over
from memory.change_hook import ChangeHook
from memory.chunk_records import chunk_items
from memory.chunk_vectors import ChunkVectors, record_vector_text
from memory.config import ChunkingConfig, IngestConfig
from memory.embedder import Embedder
from memory.errors import InvalidEvent, MemdError, WritesHeld
from memory.forgets import expand_forgets, fold_forgets
from memory.group_write import write_group
from memory.index import Analysis, ChunkIndex, analyze_records, vector_key
from memory.ingest_report import IngestReport, ItemOutcome
from memory.records import ApplyResult, ChunkRecord, MemoryItem, StoredChunk
from memory.replays import conflicts_apart, held_in
from memory.retrying import backoff_s, pause, retry_while_unavailable
from memory.session_context import SessionContext
from memory.turn_claims import TURN_TAKEN, claimed, claims_apart

log = structlog.get_logger()

T = TypeVar("T")


class _SplitGroup(Exception):
    """An embedding group failed on some input of it: embed its docs one by one."""

    def __init__(self, cause: MemdError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Ingestor:
    """Turns memory items into chunks in the index, at-least-once and version-safe."""

    def __init__(
        self,
        *,
        index: ChunkIndex,
        embedder: Embedder,
        chunking: ChunkingConfig,
        cfg: IngestConfig,
        hook: ChangeHook[Any] | None = None,
        activity: IngestActivity | None = None,
        earlier: ChunkIndex | None = None,
    ) -> None:
        self._index = index
        # A reindex's old generation: a claimed turn the new one lacks is judged by what it holds
        # there (the claim that took it first may be before the replay's start, or out of retention).
        self._earlier = earlier
        self._embedder = embedder
        self._chunking = chunking
        self._cfg = cfg
        self._hook = hook
        self.activity = activity if activity is not None else IngestActivity()
        self.stopping = asyncio.Event()
        self._vectors = ChunkVectors(index=index, embedder=embedder, cfg=cfg, retrying=self._retrying)
        self._context = SessionContext(
            index=index, embedder=embedder, embed=self._vectors.embed, retrying=self._retrying, cfg=cfg
        )

    async def _retrying(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Retry ``fn`` while Redis is unavailable, or refuses us, until the daemon is stopping."""
        return await retry_while_unavailable(what, fn, stopping=self.stopping, cfg=self._cfg)

    async def _chunk_all(self, items: Sequence[MemoryItem]) -> list[list[ChunkRecord]]:
        return await chunk_items(items, embedder=self._embedder, chunking=self._chunking)

    async def _prepare(self, items: Sequence[MemoryItem], chunks: Sequence[list[ChunkRecord]]) -> Sequence[Any]:
        if self._hook is None or not items:
            return [None] * len(items)
        hook, changes = self._hook, list(zip(items, chunks, strict=True))
        prepared = await self._retrying("change hook", lambda: hook.prepare(changes))
        if len(prepared) != len(items):
            raise MemdError(f"change hook prepared {len(prepared)} results for {len(items)} changes")
        return prepared

    async def _embed_and_prepare(
        self, items: Sequence[MemoryItem], chunks: Sequence[list[ChunkRecord]], report: IngestReport
    ) -> tuple[np.ndarray | MemdError, Sequence[Any], list[Analysis]]:
        """Embed a group while its text analysis and the hook's extraction run beside it.

        The model works in its own process, so the analysis (BM25 terms, identifiers) and
        the extraction (spaCy, a thread) take the other core instead of following it.
        A failure of the model on this input is returned (the group's docs fail); an outage
        (the worker died) and a hook failure are raised.
        """
        records = [c for cs in chunks for c in cs]
        vectors, prepared, analyses = await asyncio.gather(
            self._vectors.of(records, report),
            self._prepare(items, chunks),
            asyncio.to_thread(analyze_records, records),
            return_exceptions=True,
        )
        if isinstance(prepared, BaseException):
            raise prepared
        if isinstance(analyses, BaseException):
            raise analyses
        if isinstance(vectors, MemdError) and not vectors.retryable:
            if len(items) > 1:
                # Which doc is it? Raised, not returned: _apply then embeds the group's docs
                # one by one, and only the culprit fails (as the single doc of its own group).
                raise _SplitGroup(vectors)
            return vectors, prepared, analyses  # the input's fault: this doc fails
        if isinstance(vectors, BaseException):
            raise vectors
        return vectors, prepared, analyses

    async def apply(self, items: Sequence[MemoryItem]) -> IngestReport:
        """Apply a batch of items in order of their docs' first appearance.

        While it runs, ``activity`` counts it in flight (background work yields to it).

        Only each doc's final state is applied (``coalesce``). Should that item fail (it is
        in ``failed``, for the DLQ), the doc's next best item of the batch is applied in its
        place, as it would have been had the batch been polled one event at a time.

        The batch is embedded in groups of about ``embed_group_chunks`` chunks; a group's
        docs are written (and handed to the hook) while the next group is embedded, so
        the embedding thread never waits for Redis or the hook, and the first docs of a
        large batch become searchable after one group's embedding, not the whole batch's.

        A batch holding an unversioned item (a turn, a forget) waits while a reindex holds
        such writes (``WritesHeld``), and starts over once the hold ends: what it read before
        (a forget's turns, a turn's neighbours) may be the reindex replay's passing state.

        Raises:
            BackendUnavailable: only when stopping while Redis is down (or writes are held).
        """
        with self.activity.batch():
            waits = 0
            while True:
                try:
                    return await self._apply_batch(items)
                except WritesHeld as exc:
                    if self.stopping.is_set():
                        raise
                    waits += 1
                    delay = backoff_s(waits, self._cfg)
                    log.info("ingest.writes_held", items=len(items), delay_s=delay, reason=str(exc))
                    await pause(self.stopping, delay)

    async def _apply_batch(self, items: Sequence[MemoryItem]) -> IngestReport:
        """One try of :meth:`apply`.

        Raises:
            WritesHeld: a reindex holds unversioned writes, and the batch has some.
        """
        if any(i.version is None for i in items):
            await self._retrying("hold check", self._index.refuse_held_writes)
        asked_forgets = [i for i in items if i.op == "forget"]
        items, forgets = await expand_forgets(items, index=self._index, retrying=self._retrying, hook=self._hook)
        items, taken, unchanged = await self._claims_apart(items)
        report = await self._apply(items)
        for item, why in taken:
            report.outcomes[id(item)] = ItemOutcome("ignored", refused=(TURN_TAKEN, why))
        if taken:
            # Its writer hears of it only if it waits for the ack: said here for the rest.
            log.warning("ingest.turn_taken", docs=sorted({f"{i.tenant}/{i.doc_id}" for i, _ in taken}))
        tried = {id(i) for i in coalesce(items)}
        just_failed = report.failed
        while just_failed:
            # A doc whose forget failed falls back to nothing: its earlier upsert in the
            # batch would write the very turn the forget was to remove.
            failed = {(i.tenant, i.doc_id) for i, _ in just_failed if id(i) not in forgets}
            rest = [i for i in items if (i.tenant, i.doc_id) in failed and id(i) not in tried]
            if not rest:
                break
            # Each round tries at least one more item, so this ends; a doc whose
            # replacement was applied is not in the round's failures and stops there.
            tried |= {id(i) for i in coalesce(rest)}
            more = await self._apply(rest)
            report.add(more)
            just_failed = more.failed
        errors = {id(i): e for i, e in report.failed}
        for item, repeated in unchanged:  # a claim of what the turn holds, or of what an item here writes
            if repeated is None:
                report.outcomes[id(item)] = ItemOutcome("indexed")  # found written already
            elif (done := report.outcomes.get(id(repeated))) is not None:  # the earlier item's fate
                report.outcomes[id(item)] = ItemOutcome("indexed") if done.status == "indexed" else done
            elif id(repeated) in errors:
                report.failed.append((item, errors[id(repeated)]))
        fold_forgets(report, forgets, asked_forgets)
        return report

    async def _claims_apart(
        self, items: Sequence[MemoryItem]
    ) -> tuple[list[MemoryItem], list[tuple[MemoryItem, str]], list[tuple[MemoryItem, MemoryItem | None]]]:
        """``items`` without the claimed turns that hold another writer's, with why, or exactly
        what they claim (``memory.turn_claims.claims_apart``); the turns read here."""
        keys = claimed(items)
        if not keys:
            return list(items), [], []
        found = await self._as_written(self._index, keys, "claim read")
        elsewhere: set[tuple[str, str]] = set()
        if self._earlier is not None and (lacking := [k for k in keys if k not in found]):
            earlier = await self._as_written(self._earlier, lacking, "claim read")
            found.update(earlier)
            elsewhere = set(earlier)
        return claims_apart(items, {k: held_in(chunks) for k, chunks in found.items()}, elsewhere=elsewhere)

    async def _conflicts_apart(
        self, replays: list[MemoryItem], copies: Sequence[MemoryItem], report: IngestReport
    ) -> list[MemoryItem]:
        """``replays`` without the document upserts that conflict with what is stored
        (``memory.replays.conflicts_apart``), read here."""
        docs = list(dict.fromkeys((i.tenant, i.doc_id) for i in replays if i.op == "upsert" and i.kind == "document"))
        return conflicts_apart(replays, copies, await self._as_written(self._index, docs, "replay read"), report)

    async def _as_written(
        self, index: ChunkIndex, docs: Sequence[tuple[str, str]], what: str
    ) -> dict[tuple[str, str], list[StoredChunk]]:
        """The chunks as written of each of ``docs`` (tenant, doc id) that ``index`` holds, one
        read per tenant."""
        found: dict[tuple[str, str], list[StoredChunk]] = {}
        for tenant in sorted({t for t, _ in docs}):
            ids = [d for t, d in docs if t == tenant]
            read = await self._retrying(
                what,
                lambda t=tenant, d=ids: index.as_written(d, t),  # type: ignore[misc]
            )
            found.update({(tenant, d): chunks for d, chunks in read.items()})
        return found

    async def _apply(self, items: Sequence[MemoryItem]) -> IngestReport:
        report = IngestReport()
        todo = coalesce(items)
        passed = passed_over(items, todo)
        stored: dict[tuple[str, str], int] = {}
        for tenant in sorted({i.tenant for i in todo}):
            versioned = [i.doc_id for i in todo if i.version is not None and i.tenant == tenant]
            found = await self._retrying(
                "version read",
                lambda t=tenant, v=versioned: self._index.versions(v, t),  # type: ignore[misc]
            )
            stored.update({(tenant, d): v for d, v in found.items()})
        live: list[MemoryItem] = []
        replays: list[MemoryItem] = []
        for item in todo:
            have = stored.get((item.tenant, item.doc_id))
            if item.version is not None and have is not None and item.version <= have:
                report.skipped.append(ApplyResult(item.doc_id, applied=False, stored_version=have))
                report.outcomes[id(item)] = ItemOutcome(
                    "indexed" if item.version == have else "ignored", stored_version=have
                )
                log.info("ingest.stale_skipped", doc_id=item.doc_id, version=item.version, stored=have)
                if item.version == have:
                    replays.append(item)
            else:
                live.append(item)
        if replays:
            chosen, again = {id(i) for i in todo}, {(i.tenant, i.doc_id, i.version) for i in replays}
            copies = [i for i in items if id(i) not in chosen and (i.tenant, i.doc_id, i.version) in again]
            replays = await self._conflicts_apart(replays, copies, report)

        # A redelivery of the version already in the index may be one whose follow-up
        # work (the graph) was cut short by a crash: hand it on again. The hook has its
        # own version check, so a complete replay is a no-op there.
        if self._hook is not None and replays:
            hook = self._hook
            replay_chunks = await self._chunk_all(replays)
            prepared = await self._prepare(replays, replay_chunks)
            for item, ready in zip(replays, prepared, strict=True):
                await self._retrying("change hook", lambda item=item, ready=ready: hook.apply(item, ready))  # type: ignore[misc]

        per_item = await self._chunk_all(live)
        # Content with no token at all (only format or control characters: a zero-width
        # space, a BOM, NULs) chunks to nothing, and writing nothing would delete the doc
        # as if the upsert were a delete. It is the input's fault: dead-lettered, and the
        # doc's next item of the batch, if any, goes in its place.
        empty = {i for i, (item, c) in enumerate(zip(live, per_item, strict=True)) if item.op == "upsert" and not c}
        for i in sorted(empty):
            report.failed.append(
                (live[i], InvalidEvent("content has no tokens (only whitespace or control characters)"))
            )
        live = [item for i, item in enumerate(live) if i not in empty]
        per_item = [c for i, c in enumerate(per_item) if i not in empty]
        per_item = await self._context.attach(live, per_item)
        identity = self._embedder.identity
        per_item = [
            [dataclasses.replace(c, vector_key=vector_key(identity, record_vector_text(c))) for c in cs]
            for cs in per_item
        ]

        writing: asyncio.Task[None] | None = None
        todo_groups = [
            ([live[i] for i in group], [per_item[i] for i in group])
            for group in embedding_groups([len(c) for c in per_item], self._cfg.embed_group_chunks)
        ]
        while todo_groups:
            items_g, chunks_g = todo_groups.pop(0)
            work = asyncio.ensure_future(self._embed_and_prepare(items_g, chunks_g, report))
            if writing is not None:
                try:
                    await writing
                except BaseException:
                    work.cancel()
                    await asyncio.gather(work, return_exceptions=True)
                    raise
            try:
                vectors, prepared, analyses = await work
            except _SplitGroup as exc:
                log.warning("ingest.group_split", docs=len(items_g), error=str(exc.cause))
                todo_groups[:0] = [([item], [doc_chunks]) for item, doc_chunks in zip(items_g, chunks_g, strict=True)]
                continue
            writing = asyncio.ensure_future(
                write_group(
                    items_g,
                    chunks_g,
                    vectors,
                    prepared,
                    analyses,
                    report,
                    index=self._index,
                    hook=self._hook,
                    retrying=self._retrying,
                    concurrency=self._cfg.write_concurrency,
                    passed=passed,
                )
            )
        if writing is not None:
            await writing
        report.chunks_embedded += await self._context.reconcile(live)
        return report
