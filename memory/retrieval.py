"""Hybrid retrieval: BM25 and HNSW legs run concurrently, filtered in-engine, fused by RRF.

The ``Retriever`` does the I/O: the legs, the write markers and the winners' reads. What it
decides from them is pure: the spec's weights, depth and queries (``memory.search_spec``), the
exact checks and each leg's list (``memory.hit_checks``), fusion (``memory.fusion``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

import structlog

from memory.config import RetrievalConfig
from memory.conversation import parse_turn
from memory.embedder import Embedder
from memory.filters import TagFilter, in_time
from memory.fusion import Fused, boost_recent, fuse_rrf, per_doc_first
from memory.hit_checks import leg_lists, marker_docs, shown
from memory.identifiers import query_identifiers
from memory.index import ChunkIndex, LegHit
from memory.index.codec import joined_text
from memory.lookups import Lookups
from memory.metrics import LEG_SECONDS
from memory.records import StoredChunk
from memory.repeats import fold_key, newest_first
from memory.search_results import LegTiming, SearchHit, SearchOutcome
from memory.search_spec import (
    SearchSpec,
    exact_identifiers,
    fetch_depth,
    kind_weights,
    leg_queries,
    leg_weights,
    max_vector_distance,
    per_doc_limit,
    search_filter,
    validate_spec,
)
from memory.speakers import speaker_ranks
from memory.text import bm25_query, content_terms, query_terms
from memory.visibility import WriteMarker, same_version

log = structlog.get_logger()


#: A leg whose candidates were crowded by chunks a sliced write hides is asked once more
#: for this many times as many (memory.visibility).
HIDDEN_REFETCH = 4


class Retriever:
    """Answers a SearchSpec over one ChunkIndex."""

    def __init__(self, *, index: ChunkIndex, embedder: Embedder, cfg: RetrievalConfig) -> None:
        self._index = index
        self._embedder = embedder
        self._cfg = cfg
        #: Reads by id (``get``, ``recent``, the distinct ids), with a search's visibility.
        self.lookups = Lookups(index)

    def fetch_k(self, top_k: int) -> int:
        """Candidates each leg fetches: ``ceil(top_k * fetch_multiplier)``, at least ``min_candidates``."""
        return fetch_depth(top_k, self._cfg)

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
        self,
        text: str,
        filter_query: str,
        k: int,
        tags: Sequence[str],
        timings: dict[str, LegTiming],
        max_distance: float | None = None,
    ) -> list[LegHit]:
        start = time.monotonic()
        vector = await self._embedder.embed_query(text)
        embedded = time.monotonic()
        hits = await self._index.rank_vector(
            vector, filter_query=filter_query, k=k, tag_keys=tags, max_distance=max_distance
        )
        timings["dense"] = LegTiming(start, time.monotonic(), embedded)
        return hits

    def weights(self, spec: SearchSpec) -> tuple[dict[str, float], int]:
        """The legs' weights and the RRF k of ``spec``, the configured default for each it leaves out."""
        return leg_weights(spec, self._cfg)

    async def _with_turns(self, hits: list[SearchHit], spec: SearchSpec, flt: TagFilter) -> list[SearchHit]:
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
            # Read from the hashes, exact: the slack for a search's rounded values does not apply.
            if flt.matches(first.tags) and in_time(first.timestamp, spec.since, spec.until, exact=True):
                whole[doc_id] = dataclasses.replace(first, text=joined_text(chunks))
        return [
            dataclasses.replace(h, context=tuple(whole[d] for d in around.get(h.chunk.chunk_id, ()) if d in whole))
            for h in hits
        ]

    async def _hydrated(
        self,
        fused: Sequence[Fused],
        by_id: Mapping[str, LegHit],
        spec: SearchSpec,
        flt: TagFilter,
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
        dropped = rewritten = folded = 0
        first_of: dict[str, int] = {}  # fold key -> its first result's place in out
        pos = size = 0
        while len(out) < spec.top_k and pos < len(fused) and (last or not rewritten):
            # Once texts repeat, more may follow: each read takes twice the last, so that a
            # hundred copies of one text cost a few round trips, not one each.
            size = max(spec.top_k - len(out), 2 * size if folded else 0)
            batch = fused[pos : pos + size]
            pos += len(batch)
            found = [by_id[f.id] for f in batch]
            if first is not None:
                (chunks, markers), first = first, None
            else:
                docs = sorted(marker_docs([found], spec.tenant))
                chunks, markers = await self._index.hydrate(found, docs)
            for f, leg, chunk in zip(batch, found, chunks, strict=True):
                if len(out) == spec.top_k:
                    break  # read beyond what was needed: the rest is not looked at
                if (
                    chunk is not None
                    and same_version(chunk.version, leg.version)
                    and flt.matches(chunk.tags)
                    and in_time(chunk.timestamp, spec.since, spec.until)
                    and (not markers or shown(chunk, markers, spec.tenant))
                ):
                    key = fold_key(chunk, spec.context_turns) if spec.fold_repeats else ""
                    if key and (at := first_of.get(key)) is not None:
                        out[at] = dataclasses.replace(out[at], repeats=(*out[at].repeats, chunk))
                        folded += 1
                        continue
                    if key:
                        first_of[key] = len(out)
                    out.append(SearchHit(chunk=chunk, score=f.score, ranks=f.ranks))
                else:
                    dropped += 1
                    rewritten += chunk is not None and not same_version(chunk.version, leg.version)
        if dropped:
            log.info("retrieve.winners_changed", dropped=dropped, rewritten=rewritten, top_k=spec.top_k)
        if folded:
            out = [
                dataclasses.replace(h, repeats=newest_first(h.repeats), repeat_count=len(h.repeats)) if h.repeats else h
                for h in out
            ]
            log.debug("retrieve.repeats_folded", folded=folded, top_k=spec.top_k)
        return out, rewritten

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
        validate_spec(spec, weights, self._cfg)
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
        flt = search_filter(spec, self._index.cfg.filter_keys)
        if spec.kinds and not flt.include["kind"]:  # the request's kind filter and its scope exclude each other
            return SearchOutcome(hits=[], took_ms=(time.monotonic() - t0) * 1000)
        hash_query, knn_query = leg_queries(flt, spec, engine_tenant_filter=self._cfg.engine_tenant_filter)
        k = self.fetch_k(spec.top_k)
        timings: dict[str, LegTiming] = {}
        runs: dict[str, Callable[[int], Awaitable[list[LegHit]]]] = {}
        tags = flt.keys
        if weights["sparse"] > 0:
            runs["sparse"] = lambda n: self._sparse(spec.text, hash_query, n, tags, timings)
        if weights["dense"] > 0:
            reach = max_vector_distance(spec, self._cfg)
            runs["dense"] = lambda n: self._dense(spec.text, knn_query, n, tags, timings, reach)
        idents = query_identifiers(spec.text, limit=32) if weights["identifier"] > 0 else []
        if idents:
            runs["identifier"] = lambda n: self._identifier(idents, hash_query, n, tags, timings)
        names = list(runs)
        results = list(await asyncio.gather(*(run(k) for run in runs.values())))

        per_doc = per_doc_limit(spec, self._cfg)
        exact = exact_identifiers(spec, weights)

        def fuse(legs: dict[str, list[str] | dict[str, int]], by_id: Mapping[str, LegHit]) -> list[Fused]:
            if weights["speaker"] > 0 and by_id:
                said = speaker_ranks(spec.text, ((cid, h.speaker) for cid, h in by_id.items()))
                if said:
                    legs["speaker"] = said
            per_kind = kind_weights(spec, weights, by_id, self._cfg)
            fused = fuse_rrf(legs, weights, k=rrf_k, weights_of=per_kind)
            if exact:
                fused = [f for f in fused if "identifier" in f.ranks]
            if per_doc:
                fused = per_doc_first(fused, lambda i: by_id[i].doc_id, per_doc)
            if weights["recency"] > 0 and fused:
                # Among the results only: over every candidate (each leg's floor of 30 holds
                # most of one user's memory) it would sort a memory by time, small talk first.
                times = {f.id: by_id[f.id].timestamp for f in fused[: spec.top_k]}
                fused = boost_recent(fused, times, weights["recency"], spec.top_k)
                # Reported with the legs (the explorer shows it as one), after it was used.
                legs["recency"] = {f.id: f.ranks["recency"] for f in fused[: spec.top_k]}
            return fused

        # Fused first as if no write marker hid anything, and the winners read with every
        # marker standing in the index (read after the legs, as ever; none, almost always):
        # one round trip. Where the markers of candidates' docs hide some of them (around
        # sliced writes), those leave the legs' lists before fusion, which is then done again.
        legs, by_id = leg_lists(names, results, spec, flt, idents, {})
        fused = fuse(legs, by_id)
        chunks, standing = await self._index.hydrate([by_id[f.id] for f in fused[: spec.top_k]], None)
        first: tuple[list[StoredChunk | None], Mapping[tuple[int, str, str], WriteMarker]] | None
        if standing is None:
            # More markers stand than the winners' read returns: those of the candidates'
            # docs are read, and the winners read again with theirs.
            markers = await self.lookups.markers(results, spec.tenant)
            first = None
        else:
            candidates = marker_docs(results, spec.tenant) if standing else ()
            markers = self._index.standing_markers(standing, candidates)
            first = (chunks, markers)
        if markers and any(not shown(h, markers, spec.tenant) for found in results for h in found):
            # Chunks a sliced write hides still take their places among a leg's candidates:
            # a full leg that lost some is asked once more for HIDDEN_REFETCH times as many.
            crowded = [
                i
                for i, found in enumerate(results)
                if len(found) >= k and any(not shown(h, markers, spec.tenant) for h in found)
            ]
            if crowded:
                wider = await asyncio.gather(*(runs[names[i]](k * HIDDEN_REFETCH) for i in crowded))
                for i, found in zip(crowded, wider, strict=True):
                    results[i] = found
                markers = await self.lookups.markers(results, spec.tenant)
            legs, by_id = leg_lists(names, results, spec, flt, idents, markers)
            fused = fuse(legs, by_id)
            hits_out, rewritten = await self._hydrated(fused, by_id, spec, flt, last=last)
        else:
            hits_out, rewritten = await self._hydrated(fused, by_id, spec, flt, first, last=last)
        if rewritten and not last:
            return None
        if spec.context_turns and hits_out:
            hits_out = await self._with_turns(hits_out, spec, flt)
        took_ms = (time.monotonic() - t0) * 1000
        # Debug: a line per question would be most of the log under load; /metrics counts them.
        log.debug(
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
