"""Legs that return ids, winners read whole after fusion (issue 24): the same answers as before.

``full_field_search`` is the search as it was before the legs returned ids only: every leg
read every candidate whole (``ChunkIndex.search_text`` / ``search_vector``, kept for this and
other callers), and fusion picked from those. On one real index (two tenants, tags, metadata,
timestamps, identifiers, transcript turns, a sliced write in progress) both must give the
same hits: chunks (texts, metadata, tags, versions), scores, ranks and the turns around them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aredis

from consumers.events import TranscriptEvent
from memory.config import ChunkingConfig, IndexConfig, IngestConfig, RetrievalConfig
from memory.filters import (
    BASE_FILTER_KEYS,
    TagFilter,
    conjoin,
    hash_clause,
    in_time,
    knn_clause,
    matches,
    normalize_filter,
    time_clause,
)
from memory.fusion import boost_recent, fuse_rrf, per_doc_first
from memory.hit_checks import shown
from memory.identifiers import identifier_ranks, query_identifiers
from memory.index import ChunkIndex
from memory.ingest import Ingestor
from memory.records import DEFAULT_TENANT, MemoryItem, StoredChunk
from memory.retrieval import HIDDEN_REFETCH, Retriever
from memory.search_results import SearchHit, SearchOutcome
from memory.search_spec import SearchSpec, exact_identifiers, kind_weights, per_doc_limit, validate_spec
from memory.speakers import speaker_ranks
from memory.text import bm25_query, query_terms
from tests.conftest import unique
from tests.helpers.stacks import settled
from tests.integration.test_sliced_writes import PausedAfter, chunks, vectors

pytestmark = pytest.mark.integration

SLICE = 4
#: A nanosecond version (the LangGraph store's): above 2**53, RediSearch returns it rounded.
BIG_VERSION = 1_733_112_345_678_901_234
BIG = "specs/big.md"
WORDS = (
    "billing postgres pool timeout gateway retry queue kafka broker partition replica leader "
    "ledger invoice refund payment card fraud alert pager oncall latency cache redis eviction "
    "index shard vector search ranking fusion tenant schema migration rollout canary"
).split()


async def full_field_search(retriever: Retriever, spec: SearchSpec) -> SearchOutcome:
    """The search as it was (memory/retrieval.py before issue 24): full-field legs, fused."""
    t0 = time.monotonic()
    index: ChunkIndex = retriever._index
    weights, rrf_k = retriever.weights(spec)
    validate_spec(spec, weights, retriever._cfg)
    flt = dict(normalize_filter(spec.metadata_filter, allowed=index.cfg.filter_keys).include)
    flt["tenant"] = [spec.tenant]
    if spec.kinds:
        flt["kind"] = [k for k in flt.get("kind", spec.kinds) if k in spec.kinds]
        if not flt["kind"]:
            return SearchOutcome(hits=[], took_ms=0.0)
    cfg = retriever._cfg
    engine_flt = flt if cfg.engine_tenant_filter else {k: v for k, v in flt.items() if k != "tenant"}
    in_range = time_clause(spec.since, spec.until)
    hash_query = conjoin(hash_clause(engine_flt), in_range)
    knn_query = conjoin(knn_clause(engine_flt), in_range)
    k = retriever.fetch_k(spec.top_k)

    async def sparse(n: int) -> list[StoredChunk]:
        terms = query_terms(spec.text)
        return await index.search_text(bm25_query(terms, within=hash_query), k=n) if terms else []

    async def dense(n: int) -> list[StoredChunk]:
        vector = await retriever._embedder.embed_query(spec.text)
        return await index.search_vector(vector, filter_query=knn_query, k=n)

    idents = query_identifiers(spec.text, limit=32) if weights["identifier"] > 0 else []

    async def identifier(n: int) -> list[StoredChunk]:
        return await index.search_text(bm25_query(idents, field="idents", within=hash_query), k=n)

    runs: dict[str, Callable[[int], Awaitable[list[StoredChunk]]]] = {}
    if weights["sparse"] > 0:
        runs["sparse"] = sparse
    if weights["dense"] > 0:
        runs["dense"] = dense
    if idents:
        runs["identifier"] = identifier
    names = list(runs)
    results = list(await asyncio.gather(*(run(k) for run in runs.values())))
    markers = await retriever.lookups.markers(results, spec.tenant)
    if markers:
        crowded = [
            i
            for i, found in enumerate(results)
            if len(found) >= k and any(not shown(h, markers, spec.tenant) for h in found)
        ]
        if crowded:
            wider = await asyncio.gather(*(runs[names[i]](k * HIDDEN_REFETCH) for i in crowded))
            for i, found in zip(crowded, wider, strict=True):
                results[i] = found
            markers = await retriever.lookups.markers(results, spec.tenant)
    by_id: dict[str, StoredChunk] = {}
    legs: dict[str, list[str] | dict[str, int]] = {}
    for name, found in zip(names, results, strict=True):
        hits = [
            h
            for h in found
            if matches(h.tags, flt)
            and in_time(h.timestamp, spec.since, spec.until)
            and (not markers or shown(h, markers, spec.tenant))
        ]
        if name == "identifier":
            legs[name] = identifier_ranks([(h.chunk_id, h.idents) for h in hits], idents)
        else:
            legs[name] = [h.chunk_id for h in hits]
        for h in hits:
            by_id.setdefault(h.chunk_id, h)
    if weights["speaker"] > 0 and by_id:
        said = speaker_ranks(spec.text, [(cid, h.speaker) for cid, h in by_id.items()])
        if said:
            legs["speaker"] = said
    weights_of = kind_weights(spec, weights, by_id, cfg)  # type: ignore[arg-type]
    fused = fuse_rrf(legs, weights, k=rrf_k, weights_of=weights_of)
    if exact_identifiers(spec, weights):  # identifiers alone: what holds them (since)
        fused = [f for f in fused if "identifier" in f.ranks]
    # A long document's chunks past the limit after the others' (decision 0070, since).
    fused = per_doc_first(fused, lambda i: by_id[i].doc_id, per_doc_limit(spec, cfg))
    if weights["recency"] > 0 and fused:  # the newer lifted among the best of the fusion
        times = {f.id: by_id[f.id].timestamp for f in fused[: spec.top_k]}
        fused = boost_recent(fused, times, weights["recency"], spec.top_k)
    fused = fused[: spec.top_k]
    out = [SearchHit(chunk=by_id[f.id], score=f.score, ranks=f.ranks) for f in fused]
    if spec.context_turns and out:
        out = await retriever._with_turns(out, spec, TagFilter(flt))
    return SearchOutcome(hits=out, took_ms=(time.monotonic() - t0) * 1000)


def doc(i: int, rng: random.Random, tenant: str = "default") -> MemoryItem:
    env = ("production", "staging", "production ")[i % 3]  # a value with edge whitespace too
    service = ("billing-service", "auth-service", "ledger")[i % 4 % 3]
    words = [rng.choice(WORDS) for _ in range(rng.randint(30, 400))]
    if i % 5 == 0:
        words.insert(rng.randint(0, len(words)), f"ERR_CONN_RESET_{i:04X}")
    if i % 7 == 0:
        words.append('CVE-2024-3094 ünïcödé ✓ "quoted"')
    content = " ".join(words) + "."
    if i % 2 == 0:  # under headings: its later chunks name a section
        half = len(words) // 2
        content = f"# Runbook {i}\n\n## {words[0]} notes\n\n{' '.join(words[:half])}.\n\n{' '.join(words[half:])}."
    return MemoryItem(
        op="upsert",
        doc_id=f"wiki/doc-{i:03d}.md",
        version=BIG_VERSION if i == 3 else 1 + i % 3,
        content=content,
        source=f"wiki/doc-{i:03d}.md",
        tags={"environment": env, "service": service},
        metadata={"environment": env, "n": i, "ratio": i / 7, "ok": i % 2 == 0, "note": "é ✓ {x}"},
        timestamp=1_700_000_000.0 + i * 3600.25,
        tenant=tenant,
    )


def turn(session: str, n: int, content: str, tenant: str = "default") -> MemoryItem:
    event = TranscriptEvent.model_validate_json(
        json.dumps(
            {
                "event_id": f"agent-1/{session}/{n}",
                "agent_id": "agent-1",
                "session_id": session,
                "turn": n,
                "role": "user" if n % 2 else "assistant",
                "content": content,
                "timestamp": f"2023-11-{10 + n:02d}T10:00:00Z",
            }
        )
    )
    return event.to_item(BASE_FILTER_KEYS, tenant)


@pytest.fixture(scope="module")
async def stack(redis_url: str, embedder: Any) -> AsyncIterator[tuple[ChunkIndex, Retriever]]:
    client = aredis.from_url(redis_url)
    index = ChunkIndex(
        client=client, cfg=IndexConfig(name=unique(__name__), write_slice_chunks=SLICE), dims=embedder.dims
    )
    await index.drop()
    await index.ensure()
    ingestor = Ingestor(index=index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
    rng = random.Random(24)
    items = [doc(i, rng) for i in range(48)] + [doc(i, rng, tenant="acme") for i in range(48, 64)]
    for session in ("s1", "s2"):
        items += [turn(session, n, " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40)))) for n in range(1, 9)]
    for i in range(0, len(items), 16):
        await ingestor.apply(items[i : i + 16])
    yield index, Retriever(index=index, embedder=embedder, cfg=RetrievalConfig())
    await index.drop()
    await client.aclose()


SPECS: dict[str, dict[str, Any]] = {
    "top 5": {"text": "postgres pool timeout", "top_k": 5},
    "top 20": {"text": "kafka broker partition leader", "top_k": 20},
    "top 50": {"text": "billing invoice refund payment", "top_k": 50},
    "top 100, more than there are": {"text": "vector search ranking", "top_k": 100},
    "a filter": {"text": "fraud alert pager", "top_k": 20, "metadata_filter": {"environment": "production"}},
    "a filter value with edge whitespace": {
        "text": "cache redis eviction",
        "top_k": 20,
        "metadata_filter": {"environment": "production ", "service": ["ledger", "billing-service"]},
    },
    "a time range": {
        "text": "schema migration rollout",
        "top_k": 20,
        "since": 1_700_020_000.0,
        "until": 1_700_100_000.0,
    },
    "identifiers": {"text": "ERR_CONN_RESET_000A and CVE-2024-3094 in billing", "top_k": 20},
    "recency": {"text": "latency oncall", "top_k": 20, "recency_weight": 0.5},
    "dense only": {"text": "card fraud refund", "top_k": 20, "sparse_weight": 0.0},
    "sparse only": {"text": "card fraud refund", "top_k": 20, "dense_weight": 0.0},
    "weights and rrf k set": {
        "text": "queue retry",
        "top_k": 30,
        "dense_weight": 2.0,
        "sparse_weight": 0.5,
        "rrf_k": 5,
    },
    "another tenant": {"text": "billing postgres pool", "top_k": 20, "tenant": "acme"},
    "a tenant with nothing": {"text": "billing postgres pool", "top_k": 20, "tenant": "nobody"},
    "turns with context": {"text": "ledger invoice tenant", "top_k": 30, "context_turns": 2},
    "a speaker named": {"text": "what did the user say about the ledger invoice", "top_k": 30},
    "scope chunks": {"text": "canary rollout shard", "top_k": 25, "kinds": ("document", "transcript")},
    "scope turns only": {"text": "canary rollout shard", "top_k": 10, "kinds": ("transcript",)},
}


def assert_same(new: SearchOutcome, old: SearchOutcome) -> None:
    assert [(h.chunk.chunk_id, h.score, h.ranks) for h in new.hits] == [
        (h.chunk.chunk_id, h.score, h.ranks) for h in old.hits
    ]
    for n, o in zip(new.hits, old.hits, strict=True):
        # Text, doc id, source, kind, metadata, tags, idents, time, generation, and the version
        # but for one thing: read from the hash, a version above 2**53 is the exact one, not
        # the double a search returns.
        assert dataclasses.replace(n.chunk, version=None) == dataclasses.replace(o.chunk, version=None)
        assert n.chunk.version == (BIG_VERSION if n.chunk.doc_id == "wiki/doc-003.md" else o.chunk.version)
        assert o.chunk.version == (int(float(BIG_VERSION)) if o.chunk.doc_id == "wiki/doc-003.md" else n.chunk.version)
        assert n.context == o.context
    if not any(h.chunk.doc_id == "wiki/doc-003.md" for h in new.hits):
        assert new.hits == old.hits


@pytest.mark.parametrize("name", list(SPECS))
async def test_hydrated_results_are_the_full_field_results(stack, name: str) -> None:
    _, retriever = stack
    spec = SearchSpec(**SPECS[name])
    await settled(retriever._index._r, retriever._index.cfg.name)
    new, old = await retriever.search(spec), await full_field_search(retriever, spec)
    assert_same(new, old)
    if name != "a tenant with nothing":
        assert new.hits, "a comparison of nothing proves nothing"
        assert all(h.chunk.text and h.chunk.tags["tenant"] == spec.tenant for h in new.hits)
    if name == "turns with context":
        assert any(h.context for h in new.hits)
    if name == "identifiers":
        assert any("identifier" in h.ranks for h in new.hits)
    if name == "a speaker named":
        assert any("speaker" in h.ranks for h in new.hits)
    if name == "top 50":
        assert any(h.chunk.section.startswith("Runbook ") for h in new.hits)


async def test_the_same_while_a_sliced_write_hides_chunks(stack) -> None:
    """A doc being written in slices: its overwritten chunks are hidden, the others shown, alike."""
    index, retriever = stack
    # Without the candidate floor a request for 5 fetches 10 a leg, which the hidden chunks fill.
    shallow = Retriever(index=index, embedder=retriever._embedder, cfg=RetrievalConfig(min_candidates=0))
    asked: list[int] = []
    rank_text = index.rank_text

    async def recording(query: str, *, k: int, **kw: Any) -> Any:
        asked.append(k)
        return await rank_text(query, k=k, **kw)

    await index.apply(BIG, 1, chunks(1, 10, "alpha zulu"), vectors(10, 1))
    pause, write = await PausedAfter.hold(index, 1, index.apply(BIG, 2, chunks(2, 12, "alpha yankee"), vectors(12, 2)))
    try:
        for searcher, spec in (
            (shallow, SearchSpec(text="alpha section specification", top_k=5)),  # crowded: asked again
            (retriever, SearchSpec(text="alpha section specification", top_k=5)),
            (retriever, SearchSpec(text="alpha section specification", top_k=50)),
            (retriever, SearchSpec(text="zulu yankee", top_k=20, dense_weight=0.0)),
        ):
            asked.clear()
            index.rank_text = recording  # type: ignore[method-assign]
            await settled(index._r, index.cfg.name)
            try:
                new = await searcher.search(spec)
            finally:
                del index.rank_text
            if searcher is shallow:
                assert asked == [10, 10 * HIDDEN_REFETCH], "the crowded BM25 leg was not asked again"
            old = await full_field_search(searcher, spec)
            assert_same(new, old)
            big = [h.chunk for h in new.hits if h.chunk.doc_id == BIG]
            assert big and {c.version for c in big} == {1}
            assert all("yankee" not in c.text for c in big)
    finally:
        pause.release.set()
        pause.restore()
        await write
    spec = SearchSpec(text="alpha yankee section", top_k=20)
    await settled(index._r, index.cfg.name)
    new = await retriever.search(spec)
    assert_same(new, await full_field_search(retriever, spec))
    assert {h.chunk.version for h in new.hits if h.chunk.doc_id == BIG} == {2}
    await index.apply(BIG, 3, [], vectors(0, 3))


async def test_a_winner_rewritten_before_it_is_read_is_searched_again(stack) -> None:
    """Between the legs and the read of the winners, a doc gets a new version: its old chunks are
    not shown with the new text, and the search runs once more, so the new version is ranked."""
    index, retriever = stack
    await index.apply("specs/moving.md", 1, chunks(1, 3, "hotel whiskey", doc_id="specs/moving.md"), vectors(3, 5))
    await index.apply("specs/still.md", 1, chunks(1, 6, "hotel", doc_id="specs/still.md"), vectors(6, 4))
    spec = SearchSpec(text="hotel whiskey section", top_k=5, dense_weight=0.0)
    before = await retriever.search(spec)
    assert [h.chunk.doc_id for h in before.hits[:3]] == ["specs/moving.md"] * 3
    hydrate = index.hydrate
    calls = 0

    async def replaced_first(*args: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            await index.apply(
                "specs/moving.md", 2, chunks(2, 3, "hotel whiskey tango", doc_id="specs/moving.md"), vectors(3, 6)
            )
        return await hydrate(*args, **kw)

    runs = 0
    search_once = retriever._search_once

    async def counted(*args: Any, **kw: Any) -> Any:
        nonlocal runs
        runs += 1
        return await search_once(*args, **kw)

    index.hydrate = replaced_first  # type: ignore[method-assign]
    retriever._search_once = counted  # type: ignore[method-assign]
    try:
        after = await retriever.search(spec)
    finally:
        del index.hydrate
        del retriever._search_once
    assert runs == 2  # the first read found the winners rewritten; the search ran again
    assert calls == 2  # one read of the winners per run
    again = await retriever.search(spec)
    assert [(h.chunk, h.score, h.ranks) for h in after.hits] == [(h.chunk, h.score, h.ranks) for h in again.hits]
    moved = [h.chunk for h in after.hits if h.chunk.doc_id == "specs/moving.md"]
    assert len(moved) == 3 and all(c.version == 2 and "tango" in c.text for c in moved)
    await index.apply("specs/moving.md", 3, [], vectors(0, 3))
    await index.apply("specs/still.md", 2, [], vectors(0, 3))


async def test_a_winner_overwritten_by_a_slice_before_it_is_read_is_not_shown(stack) -> None:
    """Between the legs and the read of the winners, a sliced write begins and overwrites some
    chunks in place: those are dropped (their version changed), the rest of the old version shown."""
    index, retriever = stack
    doc_id = "specs/sliced-late.md"
    await index.apply(doc_id, 1, chunks(1, 10, "oscar lima", doc_id=doc_id), vectors(10, 7))
    spec = SearchSpec(text="oscar lima section", top_k=10, dense_weight=0.0)
    hydrate = index.hydrate
    held: list[Any] = []

    async def sliced_first(*args: Any, **kw: Any) -> Any:
        if not held:
            held.append(
                await PausedAfter.hold(
                    index, 1, index.apply(doc_id, 2, chunks(2, 10, "oscar kilo", doc_id=doc_id), vectors(10, 8))
                )
            )
        return await hydrate(*args, **kw)

    index.hydrate = sliced_first  # type: ignore[method-assign]
    try:
        out = await retriever.search(spec)
    finally:
        del index.hydrate
        pause, write = held[0]
        pause.release.set()
        pause.restore()
        await write
    mine = [h.chunk for h in out.hits if h.chunk.doc_id == doc_id]
    assert mine and len(mine) == 10 - SLICE  # the first slice overwrote SLICE chunks in place
    assert {c.version for c in mine} == {1} and all("kilo" not in c.text for c in mine)
    await index.apply(doc_id, 3, [], vectors(0, 3))


async def test_a_version_above_2_53_is_found_and_read_exact(stack) -> None:
    """A search returns a NUMERIC field as a double; the winner's re-check allows for it."""
    _, retriever = stack
    spec = SearchSpec(text="doc", top_k=100, metadata_filter={"doc_id": "wiki/doc-003.md"})
    await settled(retriever._index._r, retriever._index.cfg.name)
    new = await retriever.search(spec)
    assert new.hits and {h.chunk.version for h in new.hits} == {BIG_VERSION}
    assert_same(new, await full_field_search(retriever, spec))


async def test_a_large_doc_at_a_version_above_2_53_is_found_after_its_sliced_write(stack) -> None:
    """A doc written in slices keeps a marker showing its version for a while after the write:
    the legs' rounded version must count as that version, or every hit of the doc is hidden."""
    index, retriever = stack
    doc_id = "specs/big-sliced.md"
    await index.apply(
        doc_id, BIG_VERSION, chunks(BIG_VERSION, 3 * SLICE, "quebec romeo", doc_id=doc_id), vectors(12, 9)
    )
    gen = await index._generation()
    markers = await index.write_markers([(gen, DEFAULT_TENANT, doc_id)])
    assert markers[(gen, DEFAULT_TENANT, doc_id)].shown == BIG_VERSION  # the marker path is taken
    spec = SearchSpec(text="quebec romeo section", top_k=10, dense_weight=0.0, max_per_doc=0)
    out = await retriever.search(spec)
    mine = [h.chunk for h in out.hits if h.chunk.doc_id == doc_id]
    assert len(mine) == 10 and {c.version for c in mine} == {BIG_VERSION}, (markers, out.hits)
    await index.apply(doc_id, BIG_VERSION + 1, [], vectors(0, 3))
