"""Chunks, embeddings, the Redis index, hybrid retrieval and RRF. Imports nothing above it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memory.imports import lazy_exports

if TYPE_CHECKING:
    from memory.activity import IngestActivity, background_wait
    from memory.change_hook import ChangeHook
    from memory.chunking import ChunkSpan, chunk_id, chunk_spans
    from memory.config import ChunkingConfig, EmbeddingConfig, IndexConfig, IngestConfig, RetrievalConfig
    from memory.embedder import Embedder, SentenceTransformerEmbedder
    from memory.errors import BackendUnavailable, InvalidEvent, InvalidRequest, MemdError, NotFound
    from memory.filters import BASE_FILTER_KEYS, build_filter
    from memory.fusion import Fused, fuse_rrf
    from memory.index import ChunkIndex
    from memory.ingest import Ingestor
    from memory.ingest_report import IngestReport
    from memory.records import ApplyResult, ChunkRecord, MemoryItem, StoredChunk
    from memory.retrieval import Retriever
    from memory.search_results import SearchHit, SearchOutcome
    from memory.search_spec import SearchSpec

# Names load on first use, so importing one light piece (the client, a config model) does not
# pull in the rest (the model, Redis search, FastStream).
_HOMES: dict[str, str] = {
    "ApplyResult": "memory.records",
    "BASE_FILTER_KEYS": "memory.filters",
    "BackendUnavailable": "memory.errors",
    "ChangeHook": "memory.change_hook",
    "ChunkIndex": "memory.index",
    "ChunkRecord": "memory.records",
    "ChunkSpan": "memory.chunking",
    "ChunkingConfig": "memory.config",
    "Embedder": "memory.embedder",
    "EmbeddingConfig": "memory.config",
    "Fused": "memory.fusion",
    "IndexConfig": "memory.config",
    "IngestActivity": "memory.activity",
    "IngestConfig": "memory.config",
    "IngestReport": "memory.ingest_report",
    "Ingestor": "memory.ingest",
    "InvalidEvent": "memory.errors",
    "InvalidRequest": "memory.errors",
    "MemdError": "memory.errors",
    "MemoryItem": "memory.records",
    "NotFound": "memory.errors",
    "RetrievalConfig": "memory.config",
    "Retriever": "memory.retrieval",
    "SearchHit": "memory.search_results",
    "SearchOutcome": "memory.search_results",
    "SearchSpec": "memory.search_spec",
    "SentenceTransformerEmbedder": "memory.embedder",
    "StoredChunk": "memory.records",
    "background_wait": "memory.activity",
    "build_filter": "memory.filters",
    "chunk_id": "memory.chunking",
    "chunk_spans": "memory.chunking",
    "fuse_rrf": "memory.fusion",
}


__getattr__ = lazy_exports(__name__, _HOMES, globals())


__all__ = [
    "BASE_FILTER_KEYS",
    "ApplyResult",
    "BackendUnavailable",
    "ChangeHook",
    "ChunkIndex",
    "ChunkRecord",
    "ChunkSpan",
    "ChunkingConfig",
    "Embedder",
    "EmbeddingConfig",
    "Fused",
    "IndexConfig",
    "IngestActivity",
    "IngestConfig",
    "IngestReport",
    "Ingestor",
    "InvalidEvent",
    "InvalidRequest",
    "MemdError",
    "MemoryItem",
    "NotFound",
    "RetrievalConfig",
    "Retriever",
    "SearchHit",
    "SearchOutcome",
    "SearchSpec",
    "SentenceTransformerEmbedder",
    "StoredChunk",
    "background_wait",
    "build_filter",
    "chunk_id",
    "chunk_spans",
    "fuse_rrf",
]
