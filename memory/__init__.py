"""Chunks, embeddings, the Redis index, hybrid retrieval and RRF. Imports nothing above it."""

from memory.activity import IngestActivity, background_wait
from memory.chunking import ChunkSpan, chunk_id, chunk_spans
from memory.config import ChunkingConfig, EmbeddingConfig, IndexConfig, IngestConfig, RetrievalConfig
from memory.embedder import Embedder, SentenceTransformerEmbedder
from memory.errors import BackendUnavailable, InvalidEvent, InvalidRequest, MemdError, NotFound
from memory.filters import BASE_FILTER_KEYS, build_filter
from memory.fusion import Fused, fuse_rrf
from memory.index import ChunkIndex
from memory.ingest import ChangeHook, Ingestor, IngestReport
from memory.records import ApplyResult, ChunkRecord, MemoryItem, StoredChunk
from memory.retrieval import Retriever, SearchHit, SearchOutcome, SearchSpec

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
