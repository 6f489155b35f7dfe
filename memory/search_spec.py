"""A search request (``SearchSpec``) and what it resolves to under ``RetrievalConfig``: its
checks, the legs' weights and RRF k, how many candidates each leg fetches, transcript turns'
own weights, and the exact filter with the engine queries built from it. Pure."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from memory.config import RetrievalConfig
from memory.conversation import MAX_CONTEXT_TURNS
from memory.errors import InvalidRequest
from memory.filters import FilterSpec, TagFilter, conjoin, normalize_filter, time_clause
from memory.identifiers import identifiers, query_identifiers
from memory.index import LegHit
from memory.records import DEFAULT_TENANT


@dataclass(frozen=True, slots=True)
class SearchSpec:
    """A validated search: text, size, leg weights, RRF k and metadata filter."""

    text: str
    top_k: int
    # None: the retriever's configured default (RetrievalConfig).
    dense_weight: float | None = None
    sparse_weight: float | None = None
    identifier_weight: float | None = None
    recency_weight: float | None = None
    speaker_weight: float | None = None
    rrf_k: int | None = None
    metadata_filter: FilterSpec | None = None
    kinds: tuple[str, ...] | None = None  # restricts results to these kinds (the query's scope)
    tenant: str = DEFAULT_TENANT  # from the topic the request came on; never from its payload
    # Only chunks timestamped in [since, until] (epoch seconds; None leaves that end open).
    since: float | None = None
    until: float | None = None
    # For each transcript hit, also return this many turns before and after it in its session.
    context_turns: int = 0
    # The vector leg's floor of cosine similarity; None: the configured default.
    min_similarity: float | None = None
    # Results whose text repeats a better one's fold into it (``memory.repeats``).
    fold_repeats: bool = True
    # Most results of one document while others' remain (0: no limit); None: the configured default.
    max_per_doc: int | None = None


def max_vector_distance(spec: SearchSpec, cfg: RetrievalConfig) -> float | None:
    """The cosine distance past which the vector leg drops a candidate (None: none dropped)."""
    floor = cfg.min_similarity if spec.min_similarity is None else spec.min_similarity
    return None if floor is None else 1.0 - floor


def leg_weights(spec: SearchSpec, cfg: RetrievalConfig) -> tuple[dict[str, float], int]:
    """The legs' weights and the RRF k of ``spec``, the configured default for each it leaves out."""

    def pick(value: float | None, default: float) -> float:
        return default if value is None else value

    weights = {
        "dense": pick(spec.dense_weight, cfg.dense_weight),
        "sparse": pick(spec.sparse_weight, cfg.sparse_weight),
        "identifier": pick(spec.identifier_weight, cfg.identifier_weight),
        "recency": pick(spec.recency_weight, cfg.recency_weight),
        "speaker": pick(spec.speaker_weight, cfg.speaker_weight),
    }
    # A question that is only identifiers asks for exactly them: the model reads no meaning in
    # an opaque id, and the vector leg's nearest chunks (a table of contents, a list of ids)
    # filled the results under the one that names it, or answered an id stored nowhere.
    if (
        spec.dense_weight is None
        and (weights["sparse"] > 0 or weights["identifier"] > 0)
        and only_identifiers(spec.text)
    ):
        weights["dense"] = 0.0
    return weights, cfg.rrf_k if spec.rrf_k is None else spec.rrf_k


#: Most words a question that is only identifiers has (a longer one says more than ids).
MAX_IDENTIFIER_WORDS = 8


def only_identifiers(text: str) -> bool:
    """Whether every word of ``text`` is an opaque identifier (``INC-4411``,
    ``ERR_CONN_RESET_4F2A``, ``a3f9c2e``, ``CVE-2024-3094 OPS-125``), punctuation around a
    word aside. A name is not, with digits or capitals inside or not (``PTEN``, ``GitHub``,
    ``PoolTimeoutError``, ``GPT-4``, ``COVID-19``, ``node.js``): the model knows many."""
    words = [w.strip(",.;:!?()[]{}'\"`") for w in text.split()]
    words = [w for w in words if w]
    return 0 < len(words) <= MAX_IDENTIFIER_WORDS and all(_opaque(w) for w in words)


def exact_identifiers(spec: SearchSpec, weights: Mapping[str, float]) -> bool:
    """Whether only chunks that hold the question's identifiers answer it: a question of opaque
    identifiers alone, with the identifier leg running and neither text leg's weight set. The
    BM25 leg still ranks those chunks; what it finds by a piece of an id (``bash`` of
    ``BASH-1234``, stored nowhere) is no answer."""
    return (
        weights["dense"] == 0  # ``leg_weights`` left the vector leg out of such a question: read first
        and spec.dense_weight is None
        and spec.sparse_weight is None
        and weights["identifier"] > 0
        and only_identifiers(spec.text)
    )


def _opaque(word: str) -> bool:
    """An identifier with an underscore or three digits or more, as a document would be indexed
    with it: a word only the asker's side reads as one (``quokka-zebra-7731``, lower case) may
    be stored as plain words, which no identifier leg finds."""
    shaped = "_" in word or sum(c.isdigit() for c in word) >= 3
    return shaped and bool(identifiers(word, limit=1))


def validate_spec(spec: SearchSpec, weights: Mapping[str, float], cfg: RetrievalConfig) -> None:
    """Check ``spec`` (with its resolved ``weights``) against the configured limits.

    Raises:
        InvalidRequest: bad top_k, empty or over-long text, both text and vector weights 0
            (unless the identifier leg runs alone on a question naming an identifier),
            a non-finite or inverted time range, bad context_turns.
    """
    if not 1 <= spec.top_k <= cfg.max_top_k:
        raise InvalidRequest(f"top_k must be in 1..{cfg.max_top_k}, got {spec.top_k}")
    if not spec.text.strip():
        raise InvalidRequest("search_text is empty")
    if len(spec.text) > cfg.max_query_chars:
        raise InvalidRequest(f"search_text is longer than {cfg.max_query_chars} characters")
    # The identifier leg alone is an exact lookup: it needs an identifier to look up.
    if (
        weights["dense"] <= 0
        and weights["sparse"] <= 0
        and not (weights["identifier"] > 0 and query_identifiers(spec.text, limit=1))
    ):
        raise InvalidRequest(
            "at least one of dense_weight and sparse_weight must be > 0, "
            "or identifier_weight with a search_text that names an identifier (ERR_X_1, INC-4411, a3f9c2e)"
        )
    for bound in (spec.since, spec.until):
        if bound is not None and not math.isfinite(bound):
            raise InvalidRequest("time range bounds must be finite")
    if spec.since is not None and spec.until is not None and spec.since > spec.until:
        raise InvalidRequest("the time range's since is after its until")
    if spec.max_per_doc is not None and not 0 <= spec.max_per_doc <= cfg.max_top_k:
        raise InvalidRequest(f"max_per_doc must be in 0..{cfg.max_top_k}, got {spec.max_per_doc}")
    if not 0 <= spec.context_turns <= MAX_CONTEXT_TURNS:
        raise InvalidRequest(f"context_turns must be in 0..{MAX_CONTEXT_TURNS}, got {spec.context_turns}")


def per_doc_limit(spec: SearchSpec, cfg: RetrievalConfig) -> int:
    """Most results of one document while other documents' hits remain (0: no limit)."""
    return cfg.max_per_doc if spec.max_per_doc is None else spec.max_per_doc


def fetch_depth(top_k: int, cfg: RetrievalConfig) -> int:
    """Candidates each leg fetches: ``ceil(top_k * fetch_multiplier)``, at least ``min_candidates``."""
    return max(top_k, math.ceil(top_k * cfg.fetch_multiplier), cfg.min_candidates)


def kind_weights(
    spec: SearchSpec, weights: Mapping[str, float], hits: Mapping[str, LegHit], cfg: RetrievalConfig
) -> dict[str, dict[str, float]] | None:
    """Transcript turns' own leg weights, unless the request set a leg weight itself."""
    if spec.dense_weight is not None or spec.sparse_weight is not None:
        return None
    turn = {
        **weights,
        "dense": cfg.transcript_dense_weight if weights["dense"] > 0 else 0.0,
        "sparse": cfg.transcript_sparse_weight if weights["sparse"] > 0 else 0.0,
    }
    return {cid: turn for cid, h in hits.items() if h.kind == "transcript"} or None


def search_filter(spec: SearchSpec, allowed: Collection[str]) -> TagFilter:
    """The exact filter of ``spec``: its metadata filter, its tenant, and with a scope its
    kinds within that scope (none where the request's kind filter and its scope exclude
    each other).

    Raises:
        InvalidRequest: an unknown filter key or a bad value.
    """
    flt = normalize_filter(spec.metadata_filter, allowed=allowed).including("tenant", [spec.tenant])
    if spec.kinds:
        flt = flt.including("kind", [k for k in spec.kinds if flt.admits("kind", k)])
    return flt


def leg_queries(flt: TagFilter, spec: SearchSpec, *, engine_tenant_filter: bool) -> tuple[str, str]:
    """The engine's pre-filter of the text legs (the non-scoring hash form) and of the vector
    leg: ``flt`` and the time range of ``spec``."""
    # The tenant goes into the engine queries only where several tenants share the index
    # (see RetrievalConfig.engine_tenant_filter); `matches` re-checks it before fusion. In
    # the vector leg, a filter that every chunk passes still costs: 2.2 ms against 0.5 ms
    # per KNN over 20,000 vectors, measured here.
    engine_flt = flt if engine_tenant_filter else flt.without({"tenant"})
    # The time range is applied inside every leg too, before fusion, as the metadata is.
    in_range = time_clause(spec.since, spec.until)
    hash_query = conjoin(engine_flt.hash_query(), in_range)
    # Exact values in the vector leg too: see knn_clause (a TAG clause alone would never
    # match a value like "production ", which RediSearch trimmed when it indexed it).
    knn_query = conjoin(engine_flt.knn_query(), in_range)
    return hash_query, knn_query
