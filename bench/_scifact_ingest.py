"""SciFact's ingestion: the on-disk chunk-embedding cache and the loop through the real Ingestor."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (the offline environment and sys.path, before any project module)
import numpy as np

from memory.embedder import SentenceTransformerEmbedder
from memory.ingest import Ingestor
from memory.records import MemoryItem


class CachedEmbedder:
    """The real embedder, with document embeddings kept on disk by (model, chunk text).

    Implements the ``memory.embedder.Embedder`` protocol, so the real ``Ingestor`` and
    ``Retriever`` use it unchanged; only repeated chunk texts skip the model.
    """

    def __init__(self, inner: SentenceTransformerEmbedder, path: Path, model: str) -> None:
        self.inner = inner
        self.path = path
        self.model = model
        self.vectors: dict[str, np.ndarray] = {}
        self.hits = self.misses = 0
        self._dirty = False
        if path.exists():
            with np.load(path, allow_pickle=False) as data:
                if str(data["model"]) == model and data["vectors"].shape[1:] == (inner.dims,):
                    vectors = data["vectors"].astype(np.float32)
                    self.vectors = dict(zip(data["keys"].tolist(), vectors, strict=True))

    @property
    def dims(self) -> int:
        return self.inner.dims

    @property
    def identity(self) -> str:
        return str(self.inner.identity)

    def _key(self, text: str) -> str:
        return hashlib.sha1(text.encode("utf-8")).hexdigest()

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        keys = [self._key(t) for t in texts]
        todo = [i for i, k in enumerate(keys) if k not in self.vectors]
        self.hits += len(texts) - len(todo)
        self.misses += len(todo)
        if todo:
            fresh = await self.inner.embed_documents([texts[i] for i in todo])
            for i, vec in zip(todo, fresh, strict=True):
                self.vectors[keys[i]] = vec
            self._dirty = True
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        return np.stack([self.vectors[k] for k in keys]).astype(np.float32)

    async def embed_query(self, text: str) -> np.ndarray:
        return await self.inner.embed_query(text)

    async def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return await self.inner.token_offsets(text)

    def save(self) -> None:
        if not self._dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp.npz")
        keys = list(self.vectors)
        vectors = np.stack([self.vectors[k] for k in keys]) if keys else np.zeros((0, self.dims), np.float32)
        np.savez(tmp, model=np.array(self.model), keys=np.array(keys), vectors=vectors)
        tmp.replace(self.path)
        self._dirty = False


async def ingest_all(
    ingestor: Ingestor, embedder: CachedEmbedder, corpus: dict[str, str], wanted: list[str], batch: int
) -> dict[str, Any]:
    """Every wanted doc through the real Ingestor into the (fresh) index, saving embeddings as it goes."""
    t0 = time.perf_counter()
    last = last_save = t0
    done = chunks = 0
    for i in range(0, len(wanted), batch):
        ids = wanted[i : i + batch]
        items = [MemoryItem(op="upsert", doc_id=d, version=1, content=corpus[d], source=d) for d in ids]
        report = await ingestor.apply(items)
        if report.failed:
            raise RuntimeError(f"ingest failed: {[(it.doc_id, str(e)) for it, e in report.failed][:3]}")
        done += len(ids)
        chunks += report.chunks_written
        now = time.perf_counter()
        if now - last_save > 30:
            embedder.save()
            last_save = now
        if now - last > 10 or done == len(wanted):
            rate = done / (now - t0)
            eta = (len(wanted) - done) / rate
            print(
                f"  ingested {done}/{len(wanted)} docs ({rate:.1f} docs/s, ~{eta / 60:.1f} min left; "
                f"{embedder.hits} chunk embeddings from the cache, {embedder.misses} computed)",
                flush=True,
            )
            last = now
    embedder.save()
    seconds = time.perf_counter() - t0
    return {
        "docs": done,
        "chunks_written": chunks,
        "seconds": round(seconds, 1),
        "docs_per_s": round(done / seconds, 2),
        "embeddings_from_cache": embedder.hits,
        "embeddings_computed": embedder.misses,
    }
