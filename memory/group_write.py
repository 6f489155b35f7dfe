"""Writing an embedding group: its docs stored a few at a time, each handed to the change hook
in order once its own chunks are stored, and each item's outcome put in the batch's report."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import structlog

from memory.change_hook import ChangeHook
from memory.errors import MemdError
from memory.index import Analysis, ChunkIndex
from memory.index.history import Passed
from memory.ingest_report import IngestReport, ItemOutcome
from memory.records import ApplyResult, ChunkRecord, MemoryItem
from memory.retrying import Retrying

log = structlog.get_logger()


async def write_group(
    items: Sequence[MemoryItem],
    chunks: Sequence[list[ChunkRecord]],
    vectors: np.ndarray | MemdError,
    prepared: Sequence[Any],
    analyses: Sequence[Analysis],
    report: IngestReport,
    *,
    index: ChunkIndex,
    hook: ChangeHook[Any] | None,
    retrying: Retrying,
    concurrency: int,
    passed: Mapping[int, Sequence[MemoryItem]] | None = None,
) -> None:
    """Store the docs of a group, a few at a time, and hand each to the hook in order.

    Docs of one batch are distinct (``coalesce``), so their writes commute; writing
    them concurrently hides Redis round trips (six per doc) behind each other. The hook
    still sees doc after doc, each only once its own chunks are stored.

    Args:
        items: the group's items, one per doc.
        chunks: each item's chunks (none for a delete).
        vectors: the group's vectors, row by row in the order of its chunks; a failure of
            the model on this input instead, which fails every item of the group.
        prepared: the hook's prepared result of each item.
        analyses: the text analysis of each chunk, in the order of the vectors.
        report: the batch's report, which each item's outcome goes to.
        index: where the docs are written.
        hook: handed each doc written (or found already written at its version), if any.
        retrying: how a Redis call is run (retried while Redis is unavailable).
        concurrency: docs written at a time.
        passed: each item's earlier versions of its batch (by ``id``; ``batch_plan.passed_over``).

    Raises:
        MemdError: a write's retryable failure (only once the daemon is stopping); the
            hook's own errors propagate too.
    """
    if isinstance(vectors, MemdError):
        report.failed.extend((item, vectors) for item in items)
        return
    gate = asyncio.Semaphore(concurrency)

    async def store(
        item: MemoryItem, doc_chunks: list[ChunkRecord], vecs: np.ndarray, an: Sequence[Analysis]
    ) -> ApplyResult:
        said = [Passed.of(p) for p in (passed or {}).get(id(item), ())]
        async with gate:
            return await retrying(
                "chunk write",
                lambda: index.apply(item.doc_id, item.version, doc_chunks, vecs, item.tenant, an, passed=said),
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
                embedded=report.embedded_by_doc.get((item.tenant, item.doc_id), 0) if result.applied else None,
                removed=result.removed if result.applied and item.op == "delete" else None,
            )
            if result.applied:
                report.applied.append(result)
                report.chunks_written += result.chunks
                log.info(
                    "ingest.doc_applied", doc_id=item.doc_id, op=item.op, version=item.version, chunks=result.chunks
                )
            else:
                report.skipped.append(result)
                log.info("ingest.stale_skipped", doc_id=item.doc_id, version=item.version, stored=result.stored_version)
            # This very version found already stored is a write whose success went
            # unseen (a reply lost to a timeout, then retried; another daemon that
            # wrote it and died before its hook): its graph work may never have run,
            # so it is handed on too. The hook's own version check makes that a no-op
            # when it did.
            if hook is not None and (result.applied or same):
                await retrying("change hook", lambda item=item, ready=ready: hook.apply(item, ready))  # type: ignore[misc]
    finally:
        # On the way out with an error: no write of this group keeps running unobserved.
        for w in writes:
            w.cancel()
        await asyncio.gather(*writes, return_exceptions=True)
