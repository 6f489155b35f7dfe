"""Applying document and transcript changes: chunk, embed in large groups, write per doc.

The :class:`Ingestor` runs a batch through its parts: ``batch_plan`` (one item per doc, the
embedding groups), ``forgets`` (a forget's deletes), ``session_context`` (a turn's session
context), ``group_write`` (a group's docs stored and handed to the ``change_hook``) and
``retrying`` (Redis outages waited out). What it returns is an ``ingest_report``.
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
from memory.chunking import chunk_id, span_gaps, span_tail, spans_for
from memory.config import ChunkingConfig, IngestConfig
from memory.conversation import vector_text
from memory.embedder import Embedder
from memory.errors import InputCrashesWorker, InvalidEvent, MemdError, WorkerCrashed, WritesHeld
from memory.forgets import expand_forgets, fold_forgets
from memory.group_write import write_group
from memory.index import Analysis, ChunkIndex, analyze_records, vector_key
from memory.ingest_report import IngestReport, ItemOutcome
from memory.records import ApplyResult, ChunkRecord, MemoryItem, StoredChunk
from memory.replays import differs_from_stored
from memory.retrying import backoff_s, pause, retry_while_unavailable
from memory.session_context import SessionContext
from memory.speakers import turn_speakers

log = structlog.get_logger()

T = TypeVar("T")


class _SplitGroup(Exception):
    """An embedding group failed on some input of it: embed its docs one by one."""

    def __init__(self, cause: MemdError) -> None:
        super().__init__(str(cause))
        self.cause = cause


#: Documents up to this many tokens are chunked on the event loop (~6 ms at most); longer
#: ones in a thread, which costs a hop that short turns need not pay.
_INLINE_CHUNKING_TOKENS = 5_000


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
    ) -> None:
        self._index = index
        self._embedder = embedder
        self._chunking = chunking
        self._cfg = cfg
        self._hook = hook
        self.activity = activity if activity is not None else IngestActivity()
        self.stopping = asyncio.Event()
        self._context = SessionContext(
            index=index, embedder=embedder, embed=self._embed, retrying=self._retrying, cfg=cfg
        )

    async def _retrying(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Retry ``fn`` while Redis is unavailable, or refuses us, until the daemon is stopping."""
        return await retry_while_unavailable(what, fn, stopping=self.stopping, cfg=self._cfg)

    async def _chunks(self, item: MemoryItem, version: int) -> list[ChunkRecord]:
        offsets = await self._embedder.token_offsets(item.content)
        if len(offsets) <= _INLINE_CHUNKING_TOKENS:
            return self._records(item, version, offsets)
        # Pure Python: chunking took ~190 ms for a 167k-token document (measured), so a
        # maximum-size one (~1M tokens) would hold the event loop, and every query, ~0.3 s+.
        return await asyncio.to_thread(self._records, item, version, offsets)

    def _records(self, item: MemoryItem, version: int, offsets: list[tuple[int, int]]) -> list[ChunkRecord]:
        spans = spans_for(item.content, offsets, self._chunking)
        speaker = turn_speakers(item.content, item.metadata) if item.kind == "transcript" else ""
        gaps = span_gaps(item.content, spans)
        tail = span_tail(item.content, spans)
        return [
            ChunkRecord(
                chunk_id=chunk_id(item.doc_id, s.index),
                doc_id=item.doc_id,
                position=s.index,
                text=s.text,
                kind=item.kind,
                source=item.source,
                tags={**item.tags, "doc_id": item.doc_id, "kind": item.kind, "source": item.source},
                metadata=item.metadata,
                version=version,
                timestamp=item.timestamp,
                tenant=item.tenant,
                speaker=speaker,
                start=s.start,
                gap=gap,
                tail=tail if k == len(spans) - 1 else "",
            )
            for k, (s, gap) in enumerate(zip(spans, gaps, strict=True))
        ]

    async def _chunk_all(self, items: Sequence[MemoryItem]) -> list[list[ChunkRecord]]:
        """Chunks of each item (none for deletes); the tokenizer thread works through them back to back."""

        async def one(item: MemoryItem) -> list[ChunkRecord]:
            return await self._chunks(item, item.version or 0) if item.op == "upsert" else []

        return list(await asyncio.gather(*(one(i) for i in items)))

    async def _prepare(self, items: Sequence[MemoryItem], chunks: Sequence[list[ChunkRecord]]) -> Sequence[Any]:
        if self._hook is None or not items:
            return [None] * len(items)
        hook, changes = self._hook, list(zip(items, chunks, strict=True))
        prepared = await self._retrying("change hook", lambda: hook.prepare(changes))
        if len(prepared) != len(items):
            raise MemdError(f"change hook prepared {len(prepared)} results for {len(items)} changes")
        return prepared

    async def _embed(self, texts: list[str]) -> np.ndarray:
        """Embed a group's texts, waiting out worker outages like Redis outages.

        A worker that crashes under this very input ``embed_crash_limit`` times (by a crash
        signal, with no query in the worker at the time) is not an outage but the input: a
        text that crashes native code would never get through. Then ``InputCrashesWorker``,
        instead of blocking the partition forever.
        """
        crashes = 0

        async def once() -> np.ndarray:
            nonlocal crashes
            try:
                return await self._embedder.embed_documents(texts)
            except WorkerCrashed as exc:
                crashes += exc.attributable  # a kill or the OOM killer is an outage, not the input
                if crashes >= self._cfg.embed_crash_limit:
                    raise InputCrashesWorker(
                        f"the embedding worker crashed on this input {crashes} time(s) ({exc})"
                    ) from exc
                raise

        return await self._retrying("embedding", once)

    async def _vectors(self, records: Sequence[ChunkRecord], report: IngestReport) -> np.ndarray:
        """The records' vectors: those stored under their ``vector_key`` (same tenant) as they
        are, each other distinct key embedded once."""
        found: dict[tuple[str, str], np.ndarray] = {}
        if self._cfg.reuse_vectors:
            for tenant in sorted({c.tenant for c in records}):
                keys = [c.vector_key for c in records if c.tenant == tenant and c.vector_key]
                stored = await self._retrying(
                    "vector lookup",
                    lambda t=tenant, k=keys: self._index.stored_vectors(k, t),  # type: ignore[misc]
                )
                found.update({(tenant, k): v for k, v in stored.items()})
        todo: dict[str, str] = {}  # key (or, without one, the text itself) -> the text to embed
        first: list[tuple[str, str]] = []  # (tenant, doc id) of the first chunk of each key embedded
        for c in records:
            if (c.tenant, c.vector_key) not in found:
                key = c.vector_key or vector_text(c.text, c.context_vec)
                if key not in todo:
                    todo[key] = vector_text(c.text, c.context_vec)
                    first.append((c.tenant, c.doc_id))
        fresh = dict(zip(todo, await self._embed(list(todo.values())), strict=True)) if todo else {}
        for doc in first:
            report.embedded_by_doc[doc] = report.embedded_by_doc.get(doc, 0) + 1
        report.chunks_embedded += len(todo)
        report.chunks_reused += len(records) - len(todo)
        rows = [
            found[(c.tenant, c.vector_key)]
            if (c.tenant, c.vector_key) in found
            else fresh[c.vector_key or vector_text(c.text, c.context_vec)]
            for c in records
        ]
        return np.stack(rows).astype(np.float32, copy=False) if rows else np.zeros((0, self._embedder.dims), np.float32)

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
            self._vectors(records, report),
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
        report = await self._apply(items)
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
        fold_forgets(report, forgets, asked_forgets)
        return report

    async def _conflicts_apart(
        self, replays: list[MemoryItem], copies: Sequence[MemoryItem], report: IngestReport
    ) -> list[MemoryItem]:
        """``replays`` (their version is the stored one) without the document upserts that say
        something else than what is stored: another content, source or metadata under a version
        already written (a producer that reused a version). Those are acked ``ignored`` with
        the reason, never a silent "indexed", and not handed to the graph. A redelivery says
        what is stored, and is kept (decision 0057).

        ``copies``: the batch's other upserts of a replay's doc and version, which ``coalesce``
        passed over. Each is judged against what is stored too, as it would be alone: the
        batch ``[v5 B, v5 A]`` over a stored v5 A acks B ``ignored`` and A ``indexed``, and A
        goes to the graph in B's place."""
        upserts = [i for i in replays if i.op == "upsert" and i.kind == "document"]
        if not upserts:
            return replays
        docs = {(i.tenant, i.doc_id) for i in upserts}
        copies = [c for c in copies if c.op == "upsert" and c.kind == "document" and (c.tenant, c.doc_id) in docs]
        copied = {id(c) for c in copies}
        found: dict[tuple[str, str], list[StoredChunk]] = {}
        for tenant in sorted({i.tenant for i in upserts}):
            ids = [i.doc_id for i in upserts if i.tenant == tenant]
            read = await self._retrying(
                "replay read",
                lambda t=tenant, d=ids: self._index.as_written(d, t),  # type: ignore[misc]
            )
            found.update({(tenant, d): chunks for d, chunks in read.items()})
        kept: list[MemoryItem] = []
        kept_docs: set[tuple[str, str]] = set()
        compared = {id(i) for i in upserts} | copied
        for item in [*replays, *copies]:
            chunks = found.get((item.tenant, item.doc_id))
            if id(item) in compared and chunks and (why := differs_from_stored(item, chunks)) is not None:
                report.outcomes[id(item)] = ItemOutcome("ignored", stored_version=item.version, conflict=why)
                log.warning(
                    "ingest.version_conflict_ignored",
                    tenant=item.tenant,
                    doc_id=item.doc_id,
                    version=item.version,
                    differs=why,
                )
            elif id(item) in copied:
                report.outcomes[id(item)] = ItemOutcome("indexed", stored_version=item.version)
                if (item.tenant, item.doc_id) not in kept_docs:
                    kept.append(item)  # the doc's kept item conflicted: this one says what is stored
                    kept_docs.add((item.tenant, item.doc_id))
            else:
                kept.append(item)
                kept_docs.add((item.tenant, item.doc_id))
        return kept

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
            [dataclasses.replace(c, vector_key=vector_key(identity, vector_text(c.text, c.context_vec))) for c in cs]
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
