"""Applying document and transcript changes: chunk, embed in one batch, write per doc."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import structlog

from memory.chunking import chunk_id, chunk_spans
from memory.config import ChunkingConfig, IngestConfig
from memory.embedder import Embedder
from memory.errors import BackendUnavailable, MemdError
from memory.index import ChunkIndex
from memory.records import ApplyResult, ChunkRecord, MemoryItem

log = structlog.get_logger()

T = TypeVar("T")


@dataclass
class IngestReport:
    """Outcome of one batch: applied items, stale items skipped, chunks written."""

    applied: list[ApplyResult] = field(default_factory=list)
    skipped: list[ApplyResult] = field(default_factory=list)
    chunks_written: int = 0
    failed: list[tuple[MemoryItem, MemdError]] = field(default_factory=list)


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


class Ingestor:
    """Turns memory items into chunks in the index, at-least-once and version-safe."""

    def __init__(
        self,
        *,
        index: ChunkIndex,
        embedder: Embedder,
        chunking: ChunkingConfig,
        cfg: IngestConfig,
        on_applied: Callable[[MemoryItem, Sequence[ChunkRecord]], Awaitable[object]] | None = None,
    ) -> None:
        self._index = index
        self._embedder = embedder
        self._chunking = chunking
        self._cfg = cfg
        self._on_applied = on_applied
        self.stopping = asyncio.Event()

    async def _retrying(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Retry ``fn`` with exponential backoff while Redis is unavailable.

        Gives up only when the daemon is stopping, so offsets are never committed past
        data that is not in Redis.
        """
        delay = self._cfg.retry_initial_s
        attempt = 0
        while True:
            try:
                return await fn()
            except BackendUnavailable as exc:
                attempt += 1
                if self.stopping.is_set():
                    raise
                log.warning("ingest.backend_retried", what=what, attempt=attempt, delay_s=delay, error=str(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), timeout=delay)
                delay = min(delay * 2, self._cfg.retry_max_s)

    async def _hook(self, item: MemoryItem, chunks: Sequence[ChunkRecord]) -> None:
        assert self._on_applied is not None
        await self._on_applied(item, chunks)

    async def _chunks(self, item: MemoryItem, version: int) -> list[ChunkRecord]:
        offsets = await self._embedder.token_offsets(item.content)
        spans = chunk_spans(item.content, offsets, max_tokens=self._chunking.max_tokens, overlap=self._chunking.overlap)
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

    async def apply(self, items: Sequence[MemoryItem]) -> IngestReport:
        """Apply a batch of items in order of their docs' first appearance.

        Raises:
            BackendUnavailable: only when stopping while Redis is down.
        """
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
                log.info("ingest.stale_skipped", doc_id=item.doc_id, version=item.version, stored=have)
                if item.version == have:
                    replays.append(item)
            else:
                live.append(item)

        # A redelivery of the version already in the index may be one whose follow-up
        # work (the graph) was cut short by a crash: hand it on again. The hook has its
        # own version check, so a complete replay is a no-op there.
        if self._on_applied is not None:
            for item in replays:
                chunks = await self._chunks(item, item.version or 0) if item.op == "upsert" else []
                await self._retrying("change hook", lambda item=item, chunks=chunks: self._hook(item, chunks))  # type: ignore[misc]

        per_item: list[list[ChunkRecord]] = []
        for item in live:
            if item.op == "upsert":
                per_item.append(await self._chunks(item, item.version or 0))
            else:
                per_item.append([])
        texts = [c.text for chunks in per_item for c in chunks]
        try:
            vectors = await self._embedder.embed_documents(texts)
        except MemdError as exc:
            report.failed.extend((item, exc) for item in live)
            return report

        offset = 0
        for item, chunks in zip(live, per_item, strict=True):
            vecs = vectors[offset : offset + len(chunks)] if chunks else np.zeros((0, 1), np.float32)
            offset += len(chunks)
            try:
                result = await self._retrying(
                    "chunk write",
                    lambda item=item, chunks=chunks, vecs=vecs: self._index.apply(  # type: ignore[misc]
                        item.doc_id, item.version, chunks, vecs, item.tenant
                    ),
                )
            except MemdError as exc:
                if exc.retryable:
                    raise
                report.failed.append((item, exc))
                log.error("ingest.doc_failed", doc_id=item.doc_id, code=exc.code, error=str(exc))
                continue
            if result.applied:
                report.applied.append(result)
                report.chunks_written += result.chunks
                log.info(
                    "ingest.doc_applied", doc_id=item.doc_id, op=item.op, version=item.version, chunks=result.chunks
                )
                if self._on_applied is not None:
                    await self._retrying("change hook", lambda item=item, chunks=chunks: self._hook(item, chunks))  # type: ignore[misc]
            else:
                report.skipped.append(result)
                log.info("ingest.stale_skipped", doc_id=item.doc_id, version=item.version, stored=result.stored_version)
        return report
