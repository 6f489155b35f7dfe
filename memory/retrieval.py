"""Hybrid retrieval: BM25 and HNSW legs run concurrently, filtered in-engine, fused by RRF."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from memory.chunking import join_chunks
from memory.config import RetrievalConfig
from memory.conversation import MAX_CONTEXT_TURNS, parse_turn
from memory.embedder import Embedder
from memory.errors import InvalidRequest
from memory.filters import conjoin, hash_clause, in_time, knn_clause, matches, normalize_filter, time_clause
from memory.fusion import Fused, fuse_rrf, recency_ranks
from memory.identifiers import identifier_ranks, query_identifiers
from memory.index import ChunkIndex, LegHit
from memory.metrics import LEG_SECONDS
from memory.records import DEFAULT_TENANT, StoredChunk
from memory.text import bm25_query, content_terms, query_terms
from memory.visibility import WriteMarker, visible

log = structlog.get_logger()


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
    rrf_k: int | None = None
    metadata_filter: Mapping[str, str | Sequence[str]] | None = None
    kinds: tuple[str, ...] | None = None  # restricts results to these kinds (the query's scope)
    tenant: str = DEFAULT_TENANT  # from the topic the request came on; never from its payload
    # Only chunks timestamped in [since, until] (epoch seconds; None leaves that end open).
    since: float | None = None
    until: float | None = None
    # For each transcript hit, also return this many turns before and after it in its session.
    context_turns: int = 0


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One fused result with its score, per-leg ranks and stored fields."""

    chunk: StoredChunk
    score: float
    ranks: dict[str, int]
    # The turns around a transcript hit (``SearchSpec.context_turns``), in turn order, each
    # whole (its chunks joined); the hit itself is not among them.
    context: tuple[StoredChunk, ...] = ()


@dataclass(frozen=True, slots=True)
class LegTiming:
    """When a leg started and ended (monotonic seconds); ``embedded`` ends the embedding."""

    start: float
    end: float
    embedded: float | None = None


@dataclass(frozen=True, slots=True)
class Lookup:
    """A memory looked up by id: ``found`` with its chunks in order and its whole text, or not."""

    doc_id: str
    status: str  # "found" | "not_found" | "writing"
    chunks: tuple[StoredChunk, ...] = ()
    content: str = ""
    version: int | None = None


@dataclass
class SearchOutcome:
    """Fused hits, wall time, and per-leg timings (the legs overlap).

    ``ranked`` and ``candidates`` show why (the explorer reads them; replies do not carry
    them): each leg's own list as fusion read it (ids best first, or id -> rank for a leg of
    tied ranks; :func:`leg_order` reads either), after the exact checks, and every candidate
    of those lists by chunk id. Both are the search's own objects, not copies.
    """

    hits: list[SearchHit]
    took_ms: float
    legs: dict[str, LegTiming] = field(default_factory=dict)
    ranked: dict[str, list[str] | dict[str, int]] = field(default_factory=dict)
    candidates: dict[str, LegHit] = field(default_factory=dict)


def leg_order(ids: Sequence[str] | Mapping[str, int]) -> list[tuple[str, int]]:
    """A leg's list as ``(id, 1-based rank)`` best first; a leg of tied ranks (id -> rank) by
    rank, then id, as fusion breaks ties."""
    if isinstance(ids, Mapping):
        return sorted(ids.items(), key=lambda item: (item[1], item[0]))
    return [(d, r) for r, d in enumerate(ids, start=1)]


#: A leg whose candidates were crowded by chunks a sliced write hides is asked once more
#: for this many times as many (memory.visibility).
HIDDEN_REFETCH = 4


def _shown(hit: StoredChunk | LegHit, markers: Mapping[tuple[int, str, str], WriteMarker], tenant: str) -> bool:
    if hit.generation is None:
        return True
    return visible(hit.version, markers.get((hit.generation, tenant, hit.doc_id)))


def _same_version(stored: int | None, found: int | None) -> bool:
    # A leg reads the version as RediSearch returns a NUMERIC field, a double: one above 2**53
    # (the LangGraph store's nanosecond versions) comes back rounded, the hash holds it exact.
    if stored is None or found is None:
        return stored == found
    return stored == found or float(stored) == float(found)


class Retriever:
    """Answers a SearchSpec over one ChunkIndex."""

    def __init__(self, *, index: ChunkIndex, embedder: Embedder, cfg: RetrievalConfig) -> None:
        self._index = index
        self._embedder = embedder
        self._cfg = cfg

    def fetch_k(self, top_k: int) -> int:
        """Candidates each leg fetches: ``ceil(top_k * fetch_multiplier)``, at least ``min_candidates``."""
        return max(top_k, math.ceil(top_k * self._cfg.fetch_multiplier), self._cfg.min_candidates)

    def _validate(self, spec: SearchSpec, weights: dict[str, float]) -> None:
        if not 1 <= spec.top_k <= self._cfg.max_top_k:
            raise InvalidRequest(f"top_k must be in 1..{self._cfg.max_top_k}, got {spec.top_k}")
        if not spec.text.strip():
            raise InvalidRequest("search_text is empty")
        if len(spec.text) > self._cfg.max_query_chars:
            raise InvalidRequest(f"search_text is longer than {self._cfg.max_query_chars} characters")
        if weights["dense"] <= 0 and weights["sparse"] <= 0:
            raise InvalidRequest("at least one of dense_weight and sparse_weight must be > 0")
        for bound in (spec.since, spec.until):
            if bound is not None and not math.isfinite(bound):
                raise InvalidRequest("time range bounds must be finite")
        if spec.since is not None and spec.until is not None and spec.since > spec.until:
            raise InvalidRequest("the time range's since is after its until")
        if not 0 <= spec.context_turns <= MAX_CONTEXT_TURNS:
            raise InvalidRequest(f"context_turns must be in 0..{MAX_CONTEXT_TURNS}, got {spec.context_turns}")

    # Each leg returns LegHits carrying the filter's tags (``tags``: its keys), which the
    # exact re-check before fusion reads; the winners are read whole after fusion (_hydrated).
    async def _sparse(
        self, text: str, filter_query: str, k: int, tags: Sequence[str], timings: dict[str, LegTiming]
    ) -> list[LegHit]:
        # filter_query here is the non-scoring hash form (see memory.filters.hash_clause).
        start = time.monotonic()
        terms = content_terms(query_terms(text))
        hits = await self._index.rank_text(bm25_query(terms, within=filter_query), k=k, tag_keys=tags) if terms else []
        timings["sparse"] = LegTiming(start, time.monotonic())
        return hits

    async def _identifier(
        self, terms: list[str], filter_query: str, k: int, tags: Sequence[str], timings: dict[str, LegTiming]
    ) -> list[LegHit]:
        start = time.monotonic()
        query = bm25_query(terms, field="idents", within=filter_query)
        hits = await self._index.rank_text(query, k=k, tag_keys=tags, idents=True)
        timings["identifier"] = LegTiming(start, time.monotonic())
        return hits

    async def _dense(
        self, text: str, filter_query: str, k: int, tags: Sequence[str], timings: dict[str, LegTiming]
    ) -> list[LegHit]:
        start = time.monotonic()
        vector = await self._embedder.embed_query(text)
        embedded = time.monotonic()
        hits = await self._index.rank_vector(vector, filter_query=filter_query, k=k, tag_keys=tags)
        timings["dense"] = LegTiming(start, time.monotonic(), embedded)
        return hits

    def weights(self, spec: SearchSpec) -> tuple[dict[str, float], int]:
        """The legs' weights and the RRF k of ``spec``, the configured default for each it leaves out."""
        cfg = self._cfg

        def pick(value: float | None, default: float) -> float:
            return default if value is None else value

        weights = {
            "dense": pick(spec.dense_weight, cfg.dense_weight),
            "sparse": pick(spec.sparse_weight, cfg.sparse_weight),
            "identifier": pick(spec.identifier_weight, cfg.identifier_weight),
            "recency": pick(spec.recency_weight, cfg.recency_weight),
        }
        return weights, cfg.rrf_k if spec.rrf_k is None else spec.rrf_k

    async def lookup(
        self,
        doc_ids: Sequence[str],
        *,
        tenant: str = DEFAULT_TENANT,
        metadata_filter: Mapping[str, str | Sequence[str]] | None = None,
    ) -> list[Lookup]:
        """Each doc's current content (its stored chunks joined in order) and version.

        Visibility is a search's: only the tenant's own docs, only those matching the filter,
        and a doc being written in slices shows no mix of versions (``writing`` while the
        chunks stored are not all of the version its marker shows).

        Raises:
            InvalidRequest: an unknown filter key.
            BackendUnavailable: Redis is unreachable.
        """
        flt = normalize_filter(metadata_filter, allowed=self._index.cfg.filter_keys)
        flt["tenant"] = [tenant]
        wanted = list(dict.fromkeys(doc_ids))
        stored = await self._index.turns(wanted, tenant)
        markers = await self._markers(list(stored.values()), tenant)
        out: list[Lookup] = []
        for doc_id in wanted:
            chunks = stored.get(doc_id)
            if not chunks or not matches(chunks[0].tags, flt):
                out.append(Lookup(doc_id, "not_found"))
            elif markers and not all(_shown(c, markers, tenant) for c in chunks):
                shown = markers.get((chunks[0].generation or 0, tenant, doc_id))
                out.append(Lookup(doc_id, "writing" if shown is None or shown.shown is not None else "not_found"))
            else:
                text = join_chunks([c.text for c in chunks])
                out.append(Lookup(doc_id, "found", tuple(chunks), text, chunks[0].version))
        return out

    async def list_values(
        self, *, tenant: str, field: str, source_prefix: str = "", limit: int = 100, offset: int = 0
    ) -> list[str]:
        """The distinct doc ids or sources of the tenant's documents under a source prefix
        (``ChunkIndex.distinct_values``).

        Raises:
            BackendUnavailable: Redis is unreachable.
        """
        return await self._index.distinct_values(
            tenant=tenant, field=field, source_prefix=source_prefix, limit=limit, offset=offset
        )

    async def _with_turns(
        self, hits: list[SearchHit], spec: SearchSpec, flt: Mapping[str, Sequence[str]]
    ) -> list[SearchHit]:
        """Each transcript hit with the turns around it that the request may see (its tenant,
        filter and time range, as for the hits themselves)."""
        around: dict[str, list[str]] = {}
        for h in hits:
            ref = parse_turn(h.chunk.doc_id) if h.chunk.kind == "transcript" else None
            if ref is not None:
                n = spec.context_turns
                around[h.chunk.chunk_id] = [
                    ref.at(t).doc_id for t in range(max(0, ref.turn - n), ref.turn + n + 1) if t != ref.turn
                ]
        if not around:
            return hits
        wanted = sorted({d for ids in around.values() for d in ids})
        stored = await self._index.turns(wanted, spec.tenant)
        whole: dict[str, StoredChunk] = {}
        for doc_id, chunks in stored.items():
            first = chunks[0]
            if matches(first.tags, flt) and in_time(first.timestamp, spec.since, spec.until):
                whole[doc_id] = dataclasses.replace(first, text=join_chunks([c.text for c in chunks]))
        return [
            dataclasses.replace(h, context=tuple(whole[d] for d in around.get(h.chunk.chunk_id, ()) if d in whole))
            for h in hits
        ]

    def _kind_weights(
        self, spec: SearchSpec, weights: Mapping[str, float], hits: Mapping[str, LegHit]
    ) -> dict[str, dict[str, float]] | None:
        """Transcript turns' own leg weights, unless the request set a leg weight itself."""
        if spec.dense_weight is not None or spec.sparse_weight is not None:
            return None
        turn = {
            **weights,
            "dense": self._cfg.transcript_dense_weight if weights["dense"] > 0 else 0.0,
            "sparse": self._cfg.transcript_sparse_weight if weights["sparse"] > 0 else 0.0,
        }
        return {cid: turn for cid, h in hits.items() if h.kind == "transcript"} or None

    async def _markers(
        self, results: Sequence[Sequence[StoredChunk | LegHit]], tenant: str
    ) -> dict[tuple[int, str, str], WriteMarker]:
        # Read after the legs: whatever mix of a sliced write's chunks they returned, the
        # marker read last decides which version of that doc this answer shows. (A doc with
        # no marker was written in one transaction, as before.) Each hit's own generation:
        # the alias the legs searched may have moved since this process last read it.
        docs = {(h.generation, tenant, h.doc_id) for found in results for h in found if h.generation is not None}
        return await self._index.write_markers(sorted(docs))

    async def _hydrated(
        self,
        fused: Sequence[Fused],
        by_id: Mapping[str, LegHit],
        spec: SearchSpec,
        flt: Mapping[str, Sequence[str]],
        first: tuple[list[StoredChunk | None], Mapping[tuple[int, str, str], WriteMarker]] | None = None,
        *,
        last: bool = True,
    ) -> tuple[list[SearchHit], int]:
        """The first ``top_k`` fused hits, read whole (one round trip), that are still stored
        as their legs found them and still shown, and how many winners were rewritten since.

        Checked again on what was read, as the legs' hits were: the version (a chunk a
        write replaced or overwrote since is dropped, not shown with another version's
        text), the filter and time range, and the write markers, read with the chunks
        (``ChunkIndex.hydrate``). A dropped winner's place goes to the next fused hit.
        ``first``: the first ``top_k`` already read, with markers read with them. Unless
        ``last``, it stops at the first rewritten winner (the caller searches again).
        """
        out: list[SearchHit] = []
        dropped = rewritten = 0
        pos = 0
        while len(out) < spec.top_k and pos < len(fused) and (last or not rewritten):
            batch = fused[pos : pos + spec.top_k - len(out)]
            pos += len(batch)
            found = [by_id[f.id] for f in batch]
            if first is not None:
                (chunks, markers), first = first, None
            else:
                docs = sorted({(h.generation, spec.tenant, h.doc_id) for h in found if h.generation is not None})
                chunks, markers = await self._index.hydrate(found, docs)
            for f, leg, chunk in zip(batch, found, chunks, strict=True):
                if (
                    chunk is not None
                    and _same_version(chunk.version, leg.version)
                    and matches(chunk.tags, flt)
                    and in_time(chunk.timestamp, spec.since, spec.until)
                    and (not markers or _shown(chunk, markers, spec.tenant))
                ):
                    out.append(SearchHit(chunk=chunk, score=f.score, ranks=f.ranks))
                else:
                    dropped += 1
                    rewritten += chunk is not None and not _same_version(chunk.version, leg.version)
        if dropped:
            log.info("retrieve.winners_changed", dropped=dropped, rewritten=rewritten, top_k=spec.top_k)
        return out, rewritten

    def _lists(
        self,
        names: Sequence[str],
        results: Sequence[Sequence[LegHit]],
        spec: SearchSpec,
        flt: Mapping[str, Sequence[str]],
        idents: Sequence[str],
        markers: Mapping[tuple[int, str, str], WriteMarker],
    ) -> tuple[dict[str, list[str] | dict[str, int]], dict[str, LegHit]]:
        """Each leg's ranked ids of the hits that pass the exact checks (and ``markers``), and
        every such hit by id."""
        by_id: dict[str, LegHit] = {}
        legs: dict[str, list[str] | dict[str, int]] = {}
        for name, found in zip(names, results, strict=True):
            # A hash collision could let a text leg return a chunk outside the filter: every
            # hit is checked against the exact values (the tenant above all) before fusion.
            hits = [
                h
                for h in found
                if matches(h.tags, flt)
                and in_time(h.timestamp, spec.since, spec.until)
                and (not markers or _shown(h, markers, spec.tenant))
            ]
            if name == "identifier":
                # An exact identifier match says which chunks, not in what order: hits naming
                # as many of the query's identifiers tie, and the other legs order them.
                legs[name] = identifier_ranks([(h.chunk_id, h.idents) for h in hits], list(idents))
            else:
                legs[name] = [h.chunk_id for h in hits]
            for h in hits:
                by_id.setdefault(h.chunk_id, h)
        return legs, by_id

    async def search(self, spec: SearchSpec) -> SearchOutcome:
        """Run both legs concurrently and fuse them with weighted RRF.

        The BM25 leg never waits for the query embedding: both are started together.
        A leg with weight 0 is not run at all.

        Raises:
            InvalidRequest: bad top_k, empty text, unknown filter key, both weights 0.
            BackendUnavailable: Redis is unreachable.
        """
        t0 = time.monotonic()
        weights, rrf_k = self.weights(spec)
        self._validate(spec, weights)
        outcome = await self._search_once(spec, weights, rrf_k, t0, last=False)
        if outcome is None:
            # A winner was rewritten between the legs and the read: its new text was never
            # ranked, so the whole search runs once more rather than answer without it.
            log.info("retrieve.search_repeated", top_k=spec.top_k)
            outcome = await self._search_once(spec, weights, rrf_k, t0, last=True)
        assert outcome is not None  # the last run always answers
        return outcome

    async def _search_once(
        self, spec: SearchSpec, weights: dict[str, float], rrf_k: int, t0: float, *, last: bool
    ) -> SearchOutcome | None:
        """One run of the legs, fusion and hydration; None (unless ``last``) where a winner was
        rewritten since the legs read it (see ``_hydrated``)."""
        flt = normalize_filter(spec.metadata_filter, allowed=self._index.cfg.filter_keys)
        flt["tenant"] = [spec.tenant]
        if spec.kinds:
            flt["kind"] = [k for k in flt.get("kind", spec.kinds) if k in spec.kinds]
            if not flt["kind"]:  # the request's kind filter and its scope exclude each other
                return SearchOutcome(hits=[], took_ms=(time.monotonic() - t0) * 1000)
        # The tenant goes into the engine queries only where several tenants share the index
        # (see RetrievalConfig.engine_tenant_filter); `matches` below re-checks it. In the
        # vector leg, a filter that every chunk passes still costs: 2.2 ms against 0.5 ms
        # per KNN over 20,000 vectors, measured here.
        engine_flt = flt if self._cfg.engine_tenant_filter else {k: v for k, v in flt.items() if k != "tenant"}
        # The time range is applied inside every leg too, before fusion, as the metadata is.
        in_range = time_clause(spec.since, spec.until)
        hash_query = conjoin(hash_clause(engine_flt), in_range)
        # Exact values in the vector leg too: see knn_clause (a TAG clause alone would never
        # match a value like "production ", which RediSearch trimmed when it indexed it).
        knn_query = conjoin(knn_clause(engine_flt), in_range)
        k = self.fetch_k(spec.top_k)
        timings: dict[str, LegTiming] = {}
        runs: dict[str, Callable[[int], Awaitable[list[LegHit]]]] = {}
        tags = tuple(flt)
        if weights["sparse"] > 0:
            runs["sparse"] = lambda n: self._sparse(spec.text, hash_query, n, tags, timings)
        if weights["dense"] > 0:
            runs["dense"] = lambda n: self._dense(spec.text, knn_query, n, tags, timings)
        idents = query_identifiers(spec.text, limit=32) if weights["identifier"] > 0 else []
        if idents:
            runs["identifier"] = lambda n: self._identifier(idents, hash_query, n, tags, timings)
        names = list(runs)
        results = list(await asyncio.gather(*(run(k) for run in runs.values())))

        def fuse(legs: dict[str, list[str] | dict[str, int]], by_id: Mapping[str, LegHit]) -> list[Fused]:
            if weights["recency"] > 0 and by_id:
                legs["recency"] = recency_ranks([(cid, h.timestamp) for cid, h in by_id.items()])
            return fuse_rrf(legs, weights, k=rrf_k, weights_of=self._kind_weights(spec, weights, by_id))

        # Fused first as if no write marker hid anything, and the winners read with every
        # marker standing in the index (read after the legs, as ever; none, almost always):
        # one round trip. Where the markers of candidates' docs hide some of them (around
        # sliced writes), those leave the legs' lists before fusion, which is then done again.
        legs, by_id = self._lists(names, results, spec, flt, idents, {})
        fused = fuse(legs, by_id)
        chunks, standing = await self._index.hydrate([by_id[f.id] for f in fused[: spec.top_k]], None)
        first: tuple[list[StoredChunk | None], Mapping[tuple[int, str, str], WriteMarker]] | None
        if standing is None:
            # More markers stand than the winners' read returns: those of the candidates'
            # docs are read, and the winners read again with theirs.
            markers = await self._markers(results, spec.tenant)
            first = None
        else:
            candidates = (
                {(h.generation, spec.tenant, h.doc_id) for f in results for h in f if h.generation is not None}
                if standing
                else ()
            )
            markers = self._index.standing_markers(standing, candidates)
            first = (chunks, markers)
        if markers and any(not _shown(h, markers, spec.tenant) for found in results for h in found):
            # Chunks a sliced write hides still take their places among a leg's candidates:
            # a full leg that lost some is asked once more for HIDDEN_REFETCH times as many.
            crowded = [
                i
                for i, found in enumerate(results)
                if len(found) >= k and any(not _shown(h, markers, spec.tenant) for h in found)
            ]
            if crowded:
                wider = await asyncio.gather(*(runs[names[i]](k * HIDDEN_REFETCH) for i in crowded))
                for i, found in zip(crowded, wider, strict=True):
                    results[i] = found
                markers = await self._markers(results, spec.tenant)
            legs, by_id = self._lists(names, results, spec, flt, idents, markers)
            fused = fuse(legs, by_id)
            hits_out, rewritten = await self._hydrated(fused, by_id, spec, flt, last=last)
        else:
            hits_out, rewritten = await self._hydrated(fused, by_id, spec, flt, first, last=last)
        if rewritten and not last:
            return None
        if spec.context_turns and hits_out:
            hits_out = await self._with_turns(hits_out, spec, flt)
        took_ms = (time.monotonic() - t0) * 1000
        log.info(
            "retrieve.legs_fused",
            top_k=spec.top_k,
            fetch_k=k,
            legs={n: len(v) for n, v in legs.items()},
            returned=len(hits_out),
            took_ms=round(took_ms, 2),
        )
        for leg, timing in timings.items():
            LEG_SECONDS.labels(leg).observe(timing.end - timing.start)
        return SearchOutcome(hits=hits_out, took_ms=took_ms, legs=timings, ranked=legs, candidates=by_id)
