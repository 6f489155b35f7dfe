"""The vectors of a batch's chunks: those stored under their ``vector_key`` (same tenant) read
back, each other distinct key embedded once, and a text that crashes the model told apart
from an outage of its worker."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from memory.config import IngestConfig
from memory.conversation import VECTOR_CONTEXT_MAX_CHARS, vector_text
from memory.embedder import Embedder
from memory.errors import InputCrashesWorker, WorkerCrashed
from memory.index import ChunkIndex
from memory.ingest_report import IngestReport
from memory.records import ChunkRecord
from memory.retrying import Retrying


def record_vector_text(rec: ChunkRecord) -> str:
    """What a chunk record is embedded from: a document chunk read after its headings whatever
    its length (the worker keeps the nearest of them that fit the model's window), a turn after
    its previous turns only while it is short (``memory.conversation``)."""
    limit = None if rec.kind == "document" else VECTOR_CONTEXT_MAX_CHARS
    return vector_text(rec.text, rec.context_vec, max_chars=limit)


class ChunkVectors:
    """Reads or embeds the vectors of chunk records, waiting out Redis and worker outages."""

    def __init__(self, *, index: ChunkIndex, embedder: Embedder, cfg: IngestConfig, retrying: Retrying) -> None:
        self._index = index
        self._embedder = embedder
        self._cfg = cfg
        self._retrying = retrying

    async def embed(self, texts: list[str]) -> np.ndarray:
        """Embed texts, waiting out worker outages like Redis outages.

        Raises:
            InputCrashesWorker: the worker crashed under this very input ``embed_crash_limit``
                times (by a crash signal, with no query in the worker at the time). That is
                not an outage but the input: a text that crashes native code would never get
                through, and waiting for it would block its partition forever.
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

    async def of(self, records: Sequence[ChunkRecord], report: IngestReport) -> np.ndarray:
        """One vector per record, in order (shape ``(len(records), dims)``); ``report`` counts
        the chunks embedded and reused, and the embedded ones per doc."""
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
                key = c.vector_key or record_vector_text(c)
                if key not in todo:
                    todo[key] = record_vector_text(c)
                    first.append((c.tenant, c.doc_id))
        fresh = dict(zip(todo, await self.embed(list(todo.values())), strict=True)) if todo else {}
        for doc in first:
            report.embedded_by_doc[doc] = report.embedded_by_doc.get(doc, 0) + 1
        report.chunks_embedded += len(todo)
        report.chunks_reused += len(records) - len(todo)
        rows = [
            found[(c.tenant, c.vector_key)]
            if (c.tenant, c.vector_key) in found
            else fresh[c.vector_key or record_vector_text(c)]
            for c in records
        ]
        return np.stack(rows).astype(np.float32, copy=False) if rows else np.zeros((0, self._embedder.dims), np.float32)
