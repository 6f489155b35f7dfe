"""Applying document and transcript changes: chunk, embed in large groups, write per doc."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
import structlog

from memory.activity import IngestActivity
from memory.chunking import chunk_id, spans_for
from memory.config import ChunkingConfig, IngestConfig
from memory.conversation import vector_text
from memory.embedder import Embedder
from memory.errors import BackendUnavailable, InputCrashesWorker, InvalidEvent, MemdError, Unauthorized, WorkerCrashed
from memory.index import Analysis, ChunkIndex, analyze_records, vector_key
from memory.records import ApplyResult, ChunkRecord, MemoryItem
from memory.session_context import SessionContext

log = structlog.get_logger()

T = TypeVar("T")
P = TypeVar("P")


@dataclass(frozen=True, slots=True)
class ItemOutcome:
    """What became of one item that did not fail: ``indexed`` (its version is the stored one:
    written now, or found already written by an earlier delivery) or ``ignored`` (an older
    version than the stored one)."""

    status: Literal["indexed", "ignored"]
    chunks: int | None = None  # written by this item (None: not written now)
    stored_version: int | None = None


@dataclass
class IngestReport:
    """Outcome of one batch: applied items, stale items skipped, chunks written, and each
    item's own outcome (``outcomes``, by ``id(item)``; an item of a doc that a later one of
    the batch superseded has none)."""

    applied: list[ApplyResult] = field(default_factory=list)
    skipped: list[ApplyResult] = field(default_factory=list)
    chunks_written: int = 0
    failed: list[tuple[MemoryItem, MemdError]] = field(default_factory=list)
    outcomes: dict[int, ItemOutcome] = field(default_factory=dict)
    chunks_embedded: int = 0  # sent to the model
    chunks_reused: int = 0  # kept a vector already stored (or embedded once for the whole batch)

    def add(self, other: IngestReport) -> None:
        """Fold another report of the same batch into this one."""
        self.applied += other.applied
        self.skipped += other.skipped
        self.chunks_written += other.chunks_written
        self.failed += other.failed
        self.outcomes.update(other.outcomes)
        self.chunks_embedded += other.chunks_embedded
        self.chunks_reused += other.chunks_reused


class _SplitGroup(Exception):
    """An embedding group failed on some input of it: embed its docs one by one."""

    def __init__(self, cause: MemdError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def coalesce(items: Sequence[MemoryItem]) -> list[MemoryItem]:
    """Keep one item per doc: the highest version, or the last one when unversioned.

    Only the final state of a doc matters, and a version at or below the stored one is
    ignored anyway, so earlier items of the same doc in a batch need no work at all.
    Order of first appearance is kept.
    """
    best: dict[tuple[str, str], MemoryItem] = {}
    for item in items:
        cur = best.get((item.tenant, item.doc_id))
        if cur is None or item.version is None or (cur.version is not None and item.version > cur.version):
            best[(item.tenant, item.doc_id)] = item
    return list(best.values())


#: Documents up to this many tokens are chunked on the event loop (~6 ms at most); longer
#: ones in a thread, which costs a hop that short turns need not pay.
_INLINE_CHUNKING_TOKENS = 5_000


def embedding_groups(sizes: Sequence[int], target: int) -> list[range]:
    """Split a batch's docs, in order, into groups of about ``target`` chunks each.

    A group is closed as soon as it holds ``target`` chunks or more, so a doc is never
    split and only the last group may be smaller. Docs without chunks (deletes) ride
    along with their neighbours.

    Args:
        sizes: the number of chunks of each doc.
        target: chunks per group (at least 1).

    Returns:
        Consecutive index ranges covering every doc; empty for an empty batch.
    """
    groups: list[range] = []
    start, chunks = 0, 0
    for i, n in enumerate(sizes):
        chunks += n
        if chunks >= max(target, 1):
            groups.append(range(start, i + 1))
            start, chunks = i + 1, 0
    if start < len(sizes):
        groups.append(range(start, len(sizes)))
    return groups


class ChangeHook(Protocol[P]):
    """Follow-up work on every applied change (the graph layer), in two steps.

    ``prepare`` is the CPU-heavy part (entity extraction) for a group of changes: the
    Ingestor runs it while the same group is being embedded, so the two models work on
    both cores at once instead of one after the other. ``apply`` writes one doc's result;
    it is called right after that doc's chunks are stored, and before the batch returns
    (so before its offsets are committed).
    """

    async def prepare(self, changes: Sequence[tuple[MemoryItem, Sequence[ChunkRecord]]]) -> Sequence[P]:
        """One result per change, in order; must not write anything."""
        ...

    async def apply(self, item: MemoryItem, prepared: P) -> object:
        """Write one change's prepared result (idempotent: it may be handed on again)."""
        ...


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
        """Retry ``fn`` with exponential backoff while Redis is unavailable, or refuses us.

        Gives up only when the daemon is stopping, so offsets are never committed past
        data that is not in Redis. A refusal (a password rotated, an ACL that lost a
        command, e.g. WATCH) is the deployment's, not the event's: waited out, loudly,
        instead of dead-lettering every event until an operator fixes it.
        """
        delay = self._cfg.retry_initial_s
        attempt = 0
        while True:
            try:
                return await fn()
            except (BackendUnavailable, Unauthorized) as exc:
                attempt += 1
                if self.stopping.is_set():
                    raise
                emit = log.error if isinstance(exc, Unauthorized) else log.warning
                emit("ingest.backend_retried", what=what, attempt=attempt, delay_s=delay, error=str(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), timeout=delay)
                delay = min(delay * 2, self._cfg.retry_max_s)

    async def _chunks(self, item: MemoryItem, version: int) -> list[ChunkRecord]:
        offsets = await self._embedder.token_offsets(item.content)
        if len(offsets) <= _INLINE_CHUNKING_TOKENS:
            return self._records(item, version, offsets)
        # Pure Python: chunking took ~190 ms for a 167k-token document (measured), so a
        # maximum-size one (~1M tokens) would hold the event loop, and every query, ~0.3 s+.
        return await asyncio.to_thread(self._records, item, version, offsets)

    def _records(self, item: MemoryItem, version: int, offsets: list[tuple[int, int]]) -> list[ChunkRecord]:
        spans = spans_for(item.content, offsets, self._chunking)
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
            )
            for s in spans
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
        for c in records:
            if (c.tenant, c.vector_key) not in found:
                todo.setdefault(c.vector_key or vector_text(c.text, c.context_vec), vector_text(c.text, c.context_vec))
        fresh = dict(zip(todo, await self._embed(list(todo.values())), strict=True)) if todo else {}
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

    async def _write(
        self,
        items: Sequence[MemoryItem],
        chunks: Sequence[list[ChunkRecord]],
        vectors: np.ndarray | MemdError,
        prepared: Sequence[Any],
        analyses: Sequence[Analysis],
        report: IngestReport,
    ) -> None:
        """Store the docs of a group, a few at a time, and hand each to the hook in order.

        Docs of one batch are distinct (``coalesce``), so their writes commute; writing
        them concurrently hides Redis round trips (six per doc) behind each other. The hook
        still sees doc after doc, each only once its own chunks are stored.
        """
        if isinstance(vectors, MemdError):
            report.failed.extend((item, vectors) for item in items)
            return
        hook = self._hook
        gate = asyncio.Semaphore(self._cfg.write_concurrency)

        async def store(
            item: MemoryItem, doc_chunks: list[ChunkRecord], vecs: np.ndarray, an: Sequence[Analysis]
        ) -> ApplyResult:
            async with gate:
                return await self._retrying(
                    "chunk write",
                    lambda: self._index.apply(item.doc_id, item.version, doc_chunks, vecs, item.tenant, an),
                )

        writes: list[asyncio.Future[ApplyResult]] = []
        offset = 0
        for item, doc_chunks in zip(items, chunks, strict=True):
            vecs = vectors[offset : offset + len(doc_chunks)] if doc_chunks else np.zeros((0, 1), np.float32)
            doc_analyses = analyses[offset : offset + len(doc_chunks)]
            offset += len(doc_chunks)
            writes.append(asyncio.ensure_future(store(item, doc_chunks, vecs, doc_analyses)))
        try:
            for item, write, ready in zip(items, writes, prepared, strict=True):
                try:
                    result = await write
                except MemdError as exc:
                    if exc.retryable:
                        raise
                    report.failed.append((item, exc))
                    log.error("ingest.doc_failed", doc_id=item.doc_id, code=exc.code, error=str(exc))
                    continue
                # The same version found already stored is indexed too (an earlier delivery wrote it).
                same = item.version is not None and result.stored_version == item.version
                report.outcomes[id(item)] = ItemOutcome(
                    "indexed" if result.applied or same else "ignored",
                    chunks=result.chunks if result.applied else None,
                    stored_version=result.stored_version,
                )
                if result.applied:
                    report.applied.append(result)
                    report.chunks_written += result.chunks
                    log.info(
                        "ingest.doc_applied", doc_id=item.doc_id, op=item.op, version=item.version, chunks=result.chunks
                    )
                else:
                    report.skipped.append(result)
                    log.info(
                        "ingest.stale_skipped", doc_id=item.doc_id, version=item.version, stored=result.stored_version
                    )
                # This very version found already stored is a write whose success went
                # unseen (a reply lost to a timeout, then retried; another daemon that
                # wrote it and died before its hook): its graph work may never have run,
                # so it is handed on too. The hook's own version check makes that a no-op
                # when it did.
                if hook is not None and (result.applied or same):
                    await self._retrying("change hook", lambda item=item, ready=ready: hook.apply(item, ready))  # type: ignore[misc]
        finally:
            # On the way out with an error: no write of this group keeps running unobserved.
            for w in writes:
                w.cancel()
            await asyncio.gather(*writes, return_exceptions=True)

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

        Raises:
            BackendUnavailable: only when stopping while Redis is down.
        """
        with self.activity.batch():
            asked_forgets = [i for i in items if i.op == "forget"]
            items, forgets = await self._expand_forgets(items)
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
            if forgets:
                # A delete a forget stood for failed: the forget (the event) failed, once.
                by_event: dict[int, tuple[MemoryItem, MemdError]] = {}
                for item, exc in report.failed:
                    origin = forgets.get(id(item), item)
                    by_event.setdefault(id(origin), (origin, exc))
                report.failed = list(by_event.values())
                for delete_id in forgets:
                    report.outcomes.pop(delete_id, None)
            # A forget that covered nothing (an empty session, a redelivery) did all it had to.
            failed_now = {id(i) for i, _ in report.failed}
            for forget in asked_forgets:
                if id(forget) not in failed_now:
                    report.outcomes[id(forget)] = ItemOutcome("indexed", chunks=0)
            return report

    async def _expand_forgets(self, items: Sequence[MemoryItem]) -> tuple[list[MemoryItem], dict[int, MemoryItem]]:
        """Each ``forget`` replaced, in its place, by a delete of every doc it covers: those
        stored (listed by their tags) and those earlier in this batch (not written yet).
        Returns the items and, for each delete made, the forget it stands for.

        A later item of a forgotten doc in the batch still applies after the delete, as
        the turn of a session that goes on after the forget.
        """
        if not any(i.op == "forget" for i in items):
            return list(items), {}
        out: list[MemoryItem] = []
        origin: dict[int, MemoryItem] = {}
        for item in items:
            if item.op != "forget":
                out.append(item)
                continue
            stored = await self._retrying(
                "forget listing",
                lambda item=item: self._index.doc_ids_where(item.tenant, item.tags),  # type: ignore[misc]
            )
            # Stored docs are matched by their tags (exactly, in doc_ids_where), not by the id
            # prefix: turns stored before ids were percent-encoded carry the same tags under
            # another id. The batch's own turns are not stored yet: matched by prefix.
            earlier = {i.doc_id for i in out if i.tenant == item.tenant and i.op == "upsert"}
            covered = sorted(stored | {d for d in earlier if d.startswith(item.doc_id)})
            log.info("ingest.forget", prefix=item.doc_id, docs=len(covered), tenant=item.tenant)
            for doc_id in covered:
                delete = MemoryItem(
                    op="delete", doc_id=doc_id, version=None, kind=item.kind, tags=item.tags, tenant=item.tenant
                )
                origin[id(delete)] = item
                out.append(delete)
        return out, origin

    async def _apply(self, items: Sequence[MemoryItem]) -> IngestReport:
        report = IngestReport()
        todo = coalesce(items)
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
            writing = asyncio.ensure_future(self._write(items_g, chunks_g, vectors, prepared, analyses, report))
        if writing is not None:
            await writing
        report.chunks_embedded += await self._context.reconcile(live)
        return report
