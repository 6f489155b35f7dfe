"""Ingestion and hybrid retrieval against a real Redis with RediSearch and the real model."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aredis

from consumers.events import ForgetEvent, TranscriptEvent
from daemon.doctor_index import check_generation
from daemon.settings import Settings
from memory.config import ChunkingConfig, IndexConfig, IngestConfig, RetrievalConfig
from memory.errors import BackendUnavailable, EmbedderError, InvalidRequest, NotFound, ReindexConflict
from memory.filters import BASE_FILTER_KEYS
from memory.index import ChunkIndex, IndexError_
from memory.ingest import Ingestor
from memory.keys import chunk_prefix
from memory.records import MemoryItem
from memory.retrieval import Retriever
from memory.search_spec import SearchSpec
from memory.server_policies import search_timeout_policy
from memory.text import bm25_query
from tests.conftest import unique
from tests.helpers.stacks import settled

pytestmark = pytest.mark.integration

DOCS = {
    "wiki/billing.md": (
        "production",
        "billing-service",
        "The billing-service returns HTTP 504 gateway timeout when the postgres connection pool "
        "is exhausted. Raise max_connections and check pgbouncer.",
    ),
    "wiki/billing-staging.md": (
        "staging",
        "billing-service",
        "In staging the billing-service also hit HTTP 504 gateway timeout from the postgres pool.",
    ),
    "wiki/auth.md": (
        "production",
        "auth-service",
        "The auth-service logs ERR_CONN_RESET_4F2A when the redis session store resets connections.",
    ),
    "wiki/is-an-hip.md": ("production", "misc", "This is an hip replacement note about hip joints."),
}


def item(doc_id: str, version: int = 1, env: str = "production", service: str = "x", text: str = "") -> MemoryItem:
    return MemoryItem(
        op="upsert",
        doc_id=doc_id,
        version=version,
        content=text,
        source=doc_id,
        tags={"environment": env, "service": service},
        metadata={"environment": env, "service": service},
    )


@pytest.fixture(scope="module")
async def stack(redis_url: str, embedder) -> AsyncIterator[tuple[ChunkIndex, Ingestor, Retriever]]:
    client = aredis.from_url(redis_url)
    index = ChunkIndex(client=client, cfg=IndexConfig(name=unique(__name__)), dims=embedder.dims)
    await index.drop()
    await index.ensure()
    ingestor = Ingestor(index=index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
    retriever = Retriever(index=index, embedder=embedder, cfg=RetrievalConfig())
    await ingestor.apply([item(d, env=e, service=s, text=t) for d, (e, s, t) in DOCS.items()])
    yield index, ingestor, retriever
    await index.drop()
    await client.aclose()


async def test_filter_applies_inside_both_legs(stack) -> None:
    """A production + billing-service filter returns only that doc, from both legs."""
    _, _, retriever = stack
    out = await retriever.search(
        SearchSpec(
            text="HTTP 504 gateway timeout postgres connection pool",
            top_k=5,
            metadata_filter={"environment": "production", "service": "billing-service"},
        )
    )
    assert [h.chunk.doc_id for h in out.hits] == ["wiki/billing.md"]
    assert out.hits[0].ranks == {"dense": 1, "sparse": 1, "identifier": 1}


async def test_exact_identifier_comes_first(stack) -> None:
    """An identifier that occurs in one doc only ranks that doc first."""
    _, _, retriever = stack
    out = await retriever.search(SearchSpec(text="ERR_CONN_RESET_4F2A", top_k=3))
    assert out.hits[0].chunk.doc_id == "wiki/auth.md"
    assert out.hits[0].ranks["sparse"] == 1
    # Asked for alone, an identifier brings what names it, and no nearest vectors under it;
    # one stored nowhere, nothing.
    assert [h.chunk.doc_id for h in out.hits] == ["wiki/auth.md"] and "dense" not in out.ranked, out.hits
    assert (await retriever.search(SearchSpec(text="QZXW-99173", top_k=3))).hits == []
    # Nor one whose letters are a word the memory holds: the BM25 leg's match of a piece is no answer.
    assert (await retriever.search(SearchSpec(text="BILLING-4410", top_k=3))).hits == []
    # In a sentence, the vector leg reads the words around it.
    said = await retriever.search(SearchSpec(text="why does ERR_CONN_RESET_4F2A appear", top_k=3))
    assert said.hits[0].chunk.doc_id == "wiki/auth.md" and "dense" in said.ranked and len(said.hits) == 3


async def test_an_id_in_lower_case_asked_alone_is_found_by_the_text_legs(redis_url: str, embedder) -> None:
    """A document's index keeps ids by how they are written (upper case, underscores): one in
    lower case (``quokka-zebra-7731``) is words there. Asked alone, it is no question of
    identifiers alone (which only the identifier leg would answer, with nothing): the text legs
    find the note, as they do for the same id in a sentence."""
    from tests.helpers.stacks import memory_stack

    async with memory_stack(redis_url, embedder, unique("lower-id")) as s:
        text = "The drill code is quokka-zebra-7731."
        note = MemoryItem(op="upsert", doc_id="notes/drill.md", version=1, content=text)
        assert not (await s.ingestor.apply([note])).failed
        for text in ("quokka-zebra-7731", "which drill code is quokka-zebra-7731?"):
            out = await s.retriever.search(SearchSpec(text=text, top_k=3))
            assert [h.chunk.doc_id for h in out.hits][:1] == ["notes/drill.md"], (text, out.hits)


async def test_rrf_score_matches_the_formula_for_reported_ranks(stack) -> None:
    """Every rrf_score equals sum(w / (k + rank)) over the ranks it reports."""
    _, _, retriever = stack
    spec = SearchSpec(text="postgres pool timeout", top_k=4, dense_weight=0.6, sparse_weight=0.4, rrf_k=10)
    out = await retriever.search(spec)
    assert out.hits
    weights = {"dense": 0.6, "sparse": 0.4}
    for h in out.hits:
        assert h.score == pytest.approx(sum(weights[leg] / (10 + r) for leg, r in h.ranks.items()))
    assert [h.score for h in out.hits] == sorted((h.score for h in out.hits), reverse=True)


async def test_legs_overlap_in_time(stack) -> None:
    """The BM25 leg starts before the query embedding has finished: it never waits for it."""
    _, _, retriever = stack
    out = await retriever.search(SearchSpec(text="a brand new question about pgbouncer pools", top_k=3))
    sparse, dense = out.legs["sparse"], out.legs["dense"]
    assert dense.embedded is not None
    assert sparse.start < dense.embedded
    assert max(sparse.start, dense.start) < min(sparse.end, dense.end)


async def test_query_of_death_is_harmless(stack) -> None:
    """'(is|an|hip)' and other stopword-led text neither crash Redis nor lose results."""
    index, _, retriever = stack
    for text in ["(is|an|hip)", "is an hip", "is|an|hip", "the of and"]:
        out = await retriever.search(SearchSpec(text=text, top_k=3))
        assert isinstance(out.hits, list)
    out = await retriever.search(SearchSpec(text="(is|an|hip)", top_k=3, dense_weight=0.0))
    assert [h.chunk.doc_id for h in out.hits] == ["wiki/is-an-hip.md"]
    await index.ping()


@pytest.mark.parametrize(
    "text",
    [
        "@service:{auth\\-service} | *",
        "* | -foo",
        '"quoted" {braces} [x] (y)',
        "~fuzzy %x% @kind:{transcript}",
        "\\ \\\\ $param =>[KNN 100 @vector $vec]",
        "'; DROP INDEX",
    ],
)
async def test_query_syntax_in_text_cannot_widen_the_filter(stack, text: str) -> None:
    """RediSearch syntax inside search_text is searched as words, and the filter still holds."""
    _, _, retriever = stack
    out = await retriever.search(SearchSpec(text=text, top_k=10, metadata_filter={"service": "billing-service"}))
    # The vector leg returns every chunk inside the filter, so exactly the two billing docs come back:
    # nothing outside the filter, and the text's syntax did not empty or break the query either.
    assert sorted(h.chunk.doc_id for h in out.hits) == ["wiki/billing-staging.md", "wiki/billing.md"]
    assert all(h.chunk.tags["service"] == "billing-service" for h in out.hits)


@pytest.mark.parametrize("value", ["billing-service} | @service:{auth-service", "*", "billing-service}|{*", "x\\}|*"])
async def test_filter_value_syntax_is_literal(stack, value: str) -> None:
    """A filter value with tag syntax matches nothing rather than escaping its clause."""
    _, _, retriever = stack
    out = await retriever.search(SearchSpec(text="timeout connection", top_k=10, metadata_filter={"service": value}))
    assert out.hits == []


async def test_unknown_filter_key_and_bad_top_k_are_errors(stack) -> None:
    """Unknown filter keys and top_k outside 1..100 are rejected, never ignored."""
    _, _, retriever = stack
    for spec in [
        SearchSpec(text="x", top_k=5, metadata_filter={"tenant": "a"}),
        SearchSpec(text="x", top_k=0),
        SearchSpec(text="x", top_k=101),
        SearchSpec(text="  ", top_k=1),
        SearchSpec(text="x", top_k=1, dense_weight=0, sparse_weight=0),
    ]:
        with pytest.raises(InvalidRequest):
            await retriever.search(spec)


async def test_a_whole_passage_is_a_query_and_a_longer_one_an_error(stack) -> None:
    """An agent may ask with a passage of thousands of words: its first terms lead the BM25
    leg and the model reads its window; past max_query_chars it is refused, not cut."""
    _, _, retriever = stack
    limit = RetrievalConfig().max_query_chars
    passage = "ERR_CONN_RESET_4F2A from the session store. " + "nothing here matches anything " * 600
    passage = passage[:limit]
    out = await retriever.search(SearchSpec(text=passage, top_k=3))
    assert out.hits[0].chunk.doc_id == "wiki/auth.md"
    with pytest.raises(InvalidRequest, match=f"longer than {limit}"):
        await retriever.search(SearchSpec(text=passage + "x" * (limit - len(passage) + 1), top_k=3))


async def test_versions_replace_delete_and_never_resurrect(stack) -> None:
    """A newer version replaces all chunks; a delete removes them; older versions change nothing."""
    index, ingestor, retriever = stack
    doc = "wiki/versioned.md"
    long_v1 = " ".join(f"Version one sentence {i} mentions zebrafish cache eviction." for i in range(60))
    await ingestor.apply([item(doc, 1, text=long_v1)])
    v1_chunks = await index.chunk_ids(doc)
    assert len(v1_chunks) > 1
    await ingestor.apply([item(doc, 2, text="Version two talks only about kangaroo retries.")])
    assert await index.chunk_ids(doc) == {f"{doc}_p0"}
    out = await retriever.search(SearchSpec(text="zebrafish", top_k=5, dense_weight=0))
    assert out.hits == []
    report = await ingestor.apply([item(doc, 1, text=long_v1)])
    assert report.applied == [] and len(report.skipped) == 1
    assert await index.chunk_ids(doc) == {f"{doc}_p0"}
    await ingestor.apply([MemoryItem(op="delete", doc_id=doc, version=3)])
    assert await index.chunk_ids(doc) == set()
    await ingestor.apply([item(doc, 2, text="Version two talks only about kangaroo retries.")])
    assert await index.chunk_ids(doc) == set()
    out = await retriever.search(SearchSpec(text="kangaroo", top_k=5))
    assert all(h.chunk.doc_id != doc for h in out.hits)


async def test_batch_coalesces_to_the_highest_version(stack) -> None:
    """Within one batch, only the highest version of a doc is applied."""
    index, ingestor, _ = stack
    doc = "wiki/batched.md"
    report = await ingestor.apply(
        [
            item(doc, 5, text="five"),
            item(doc, 7, text="seven walrus"),
            item(doc, 6, text="six"),
        ]
    )
    assert [r.stored_version for r in report.applied] == [7]
    assert await index.versions([doc]) == {doc: 7}


async def test_identifier_leg_separates_look_alike_identifiers(stack) -> None:
    """Near-identical identifiers are told apart by the identifier leg, and its weight can switch it off."""
    _, ingestor, retriever = stack
    await ingestor.apply(
        [
            item("ids/a.md", text="Postgres raised SQLSTATE 42P01 undefined_table during the migration."),
            item("ids/b.md", text="Postgres raised SQLSTATE 42P07 duplicate_table during the migration."),
        ]
    )
    out = await retriever.search(SearchSpec(text="what does 42P07 mean", top_k=2))
    assert out.hits[0].chunk.doc_id == "ids/b.md" and out.hits[0].ranks["identifier"] == 1
    assert "identifier" in out.legs
    off = await retriever.search(SearchSpec(text="what does 42P07 mean", top_k=2, identifier_weight=0))
    assert "identifier" not in off.legs and all("identifier" not in h.ranks for h in off.hits)


async def test_a_hyphen_spelling_finds_the_underscore_one_and_no_piece_matches(stack) -> None:
    """Asked with ERR-CONN-RESET, the identifier leg finds the chunk that wrote ERR_CONN_RESET
    and not the one naming ERR_CONN_REFUSED; a ticket ABC-123 does not match an HTTP 123
    (analyzer 1 split the hyphen form into err, conn and reset, which matched neither)."""
    _, ingestor, retriever = stack
    await ingestor.apply(
        [
            item("hy/reset.md", text="The checkout gateway logged ERR_CONN_RESET after the proxy restart."),
            item("hy/refused.md", text="The checkout gateway logged ERR_CONN_REFUSED after the proxy restart."),
            item("hy/status.md", text="The legacy probe answers status 123 when the proxy restarts."),
        ]
    )
    out = await retriever.search(SearchSpec(text="why ERR-CONN-RESET at checkout", top_k=3))
    by_doc = {h.chunk.doc_id: h.ranks for h in out.hits}
    assert out.hits[0].chunk.doc_id == "hy/reset.md" and by_doc["hy/reset.md"]["identifier"] == 1, by_doc
    assert "identifier" not in by_doc.get("hy/refused.md", {}), by_doc
    ticket = await retriever.search(SearchSpec(text="status of ABC-123", top_k=3))
    assert "identifier" in ticket.legs  # the leg ran (for abc123) and matched no chunk
    assert all("identifier" not in h.ranks for h in ticket.hits), [(h.chunk.doc_id, h.ranks) for h in ticket.hits]


async def test_an_identifier_typed_in_lower_case_finds_its_chunk(stack) -> None:
    """Asked as err-conn-reset-4f2a (or errconnreset4f2a) with the dense leg off, a chunk that
    wrote ERR_CONN_RESET_4F2A is found: BM25 holds it as one term with its underscores, so the
    lower-case forms must be taken for the identifier too."""
    _, ingestor, retriever = stack
    await ingestor.apply(
        [
            item("lc/a.md", text="The edge proxy logged ERR_LINK_DROP_7C3A during the failover."),
            item("lc/b.md", text="The edge proxy logged ERR_LINK_DROP_7C3B during the failover."),
        ]
    )
    for typed in ("err-link-drop-7c3a", "errlinkdrop7c3a", "Err_Link_Drop_7c3a"):
        out = await retriever.search(SearchSpec(text=f"what is {typed}", top_k=2, dense_weight=0))
        by_doc = {h.chunk.doc_id: h.ranks for h in out.hits}
        assert out.hits and out.hits[0].chunk.doc_id == "lc/a.md", (typed, by_doc)
        assert by_doc["lc/a.md"].get("identifier") == 1 and "identifier" not in by_doc.get("lc/b.md", {}), by_doc


async def test_an_id_only_the_metadata_names_is_found_by_the_identifier_leg(stack) -> None:
    """A support turn whose ticket id is only in its metadata (``ticket: T-1002``), beside one
    of another ticket: asked for T-1002, the identifier leg finds the first and not the second."""
    _, ingestor, retriever = stack
    said = "The customer asked again when the refund lands; I promised Friday."
    await ingestor.apply(
        [
            dataclasses.replace(item("md/t1002", text=said), metadata={"ticket": "T-1002", "customer": "Northwind"}),
            dataclasses.replace(item("md/t1003", text=said), metadata={"ticket": "T-1003", "customer": "Contoso"}),
        ]
    )
    out = await retriever.search(SearchSpec(text="what did we say on T-1002?", top_k=2))
    by_doc = {h.chunk.doc_id: h.ranks for h in out.hits}
    assert out.hits[0].chunk.doc_id == "md/t1002" and by_doc["md/t1002"].get("identifier") == 1, by_doc
    assert "identifier" not in by_doc.get("md/t1003", {}), by_doc


async def test_a_similarity_floor_keeps_only_the_vector_candidates_close_enough(stack, embedder) -> None:
    """``min_similarity``: the vector leg keeps exactly the candidates whose cosine similarity
    to the question reaches the floor (checked against the model's own vectors), so a question
    about nothing stored, with no word to match, finds nothing at all."""
    _, _, retriever = stack
    question = "why does billing time out talking to postgres"
    spec = SearchSpec(text=question, top_k=8, sparse_weight=0.0, metadata_filter={"environment": "production"})
    everything = await retriever.search(spec)
    texts = {h.chunk.chunk_id: h.chunk.text for h in everything.hits}
    [q] = await embedder.embed_documents([question])
    vectors = dict(zip(texts, await embedder.embed_documents(list(texts.values())), strict=True))
    sims = {c: float(np.dot(q, v) / (np.linalg.norm(q) * np.linalg.norm(v))) for c, v in vectors.items()}
    # The floor in the widest gap between two candidates: the query encoder's rounding cannot cross it.
    ranked = sorted(sims.values(), reverse=True)
    gap, at = max((ranked[i] - ranked[i + 1], i) for i in range(len(ranked) - 1))
    assert gap > 0.04 and at + 1 < len(ranked), sims
    floor = (ranked[at] + ranked[at + 1]) / 2
    kept = await retriever.search(dataclasses.replace(spec, min_similarity=floor))
    assert {h.chunk.chunk_id for h in kept.hits} == {c for c, s in sims.items() if s >= floor}, (sims, floor)
    nothing = await retriever.search(SearchSpec(text="🙂🙂 the of and", top_k=5, min_similarity=0.5))
    assert nothing.hits == []
    assert (await retriever.search(SearchSpec(text="🙂🙂 the of and", top_k=5))).hits  # without it: the nearest
    # The configured floor applies when the request names none; a request's own overrides it.
    index, _, _ = stack
    floored = Retriever(index=index, embedder=embedder, cfg=RetrievalConfig(min_similarity=0.5))
    assert (await floored.search(SearchSpec(text="🙂🙂 the of and", top_k=5))).hits == []
    assert (await floored.search(SearchSpec(text="🙂🙂 the of and", top_k=5, min_similarity=-1.0))).hits


async def test_a_time_range_filters_every_leg_before_fusion(stack) -> None:
    """Three notes alike but for their time: a range keeps only those inside it, in every leg
    (BM25, vector, identifier), and each hit says when it was recorded."""
    _, ingestor, retriever = stack
    day = 86_400.0
    t0 = 1_790_000_000.0  # 2026-09-21
    notes = {f"tr/{i}": t0 + i * day for i in range(3)}
    await ingestor.apply(
        [
            MemoryItem(
                op="upsert",
                doc_id=d,
                version=1,
                content=f"Rollout note: the vault-sync job failed with VAULT_SYNC_E77 on day {i}.",
                source=d,
                timestamp=ts,
            )
            for i, (d, ts) in enumerate(notes.items())
        ]
    )
    text = "vault-sync job failed VAULT_SYNC_E77"

    def docs(out: Any) -> set[str]:
        return {h.chunk.doc_id for h in out.hits if h.chunk.doc_id.startswith("tr/")}

    everything = await retriever.search(SearchSpec(text=text, top_k=10))
    assert docs(everything) == set(notes)
    recent = await retriever.search(SearchSpec(text=text, top_k=10, since=t0 + day))
    assert docs(recent) == {"tr/1", "tr/2"} and docs(recent) == {h.chunk.doc_id for h in recent.hits}
    for h in recent.hits:
        assert set(h.ranks) == {"dense", "sparse", "identifier"}, h.ranks  # each leg found it in range
        assert h.chunk.timestamp == notes[h.chunk.doc_id]
    window = await retriever.search(SearchSpec(text=text, top_k=10, since=t0 + day, until=t0 + day))
    assert [h.chunk.doc_id for h in window.hits] == ["tr/1"]
    # (the module's other docs carry timestamp 0: an open start includes them)
    old = await retriever.search(SearchSpec(text=text, top_k=10, until=t0 + 0.5 * day))
    assert docs(old) == {"tr/0"} and all(h.chunk.timestamp == 0.0 for h in old.hits if h.chunk.doc_id != "tr/0")
    dense_only = await retriever.search(SearchSpec(text=text, top_k=10, since=t0 - day, until=t0, sparse_weight=0))
    assert [h.chunk.doc_id for h in dense_only.hits] == ["tr/0"]
    with pytest.raises(InvalidRequest, match="since is after"):
        await retriever.search(SearchSpec(text=text, top_k=3, since=t0 + day, until=t0))


async def test_a_hit_carries_its_exact_timestamp(stack) -> None:
    """RediSearch returns a NUMERIC field rounded to 12 significant digits: an epoch timestamp
    came back to 10 ms (…000.123456 as …000.12). The stored exact value is returned instead."""
    _, ingestor, retriever = stack
    ts = 1_700_000_000.123456  # older than the module's other dated notes (their recency ranks)
    await ingestor.apply(
        [MemoryItem(op="upsert", doc_id="ts/exact", version=1, content="The quokka-sync job ran.", timestamp=ts)]
    )
    out = await retriever.search(SearchSpec(text="quokka-sync job", top_k=3, since=ts, until=ts))
    assert [(h.chunk.doc_id, h.chunk.timestamp) for h in out.hits] == [("ts/exact", ts)]


async def test_a_shallow_request_is_fused_from_the_candidate_floor(stack) -> None:
    """Below the floor every request fuses the same candidates: a request for 5 is the head of a
    request for 15, scores and ranks alike, and each leg holds min_candidates of the 40 matches."""
    _, ingestor, retriever = stack
    rng = random.Random(33)
    words = ["lantern", "harbor", "ferry", "ledger", "quartz", "meadow", "signal", "copper", "willow", "basalt"]
    await ingestor.apply(
        [
            MemoryItem(
                op="upsert",
                doc_id=f"floor/{i}",
                version=1,
                content=f"Pelican report {i}: " + " ".join(rng.choice(words) for _ in range(12)),
                source="floor",
            )
            for i in range(40)
        ]
    )
    only = {"source": "floor"}
    text = "pelican report harbor ferry quartz"
    await settled(retriever._index._r, retriever._index.cfg.name)  # the same BM25 statistics for both
    shallow = await retriever.search(SearchSpec(text=text, top_k=5, metadata_filter=only))
    deeper = await retriever.search(SearchSpec(text=text, top_k=15, metadata_filter=only))
    floor = RetrievalConfig().min_candidates
    assert len(shallow.ranked["sparse"]) == len(shallow.ranked["dense"]) == floor
    assert [(h.chunk.chunk_id, h.score, h.ranks) for h in shallow.hits] == [
        (h.chunk.chunk_id, h.score, h.ranks) for h in deeper.hits[:5]
    ]


async def test_a_long_document_takes_at_most_max_per_doc_results_while_others_match(stack) -> None:
    """A long runbook matches a question with many of its chunks; by default it takes 3 of
    the results and the short notes that match come next; with no limit it takes them all;
    and a question only it answers still gets every result from it."""
    _, ingestor, retriever = stack
    section = (
        "Section {n}. The quarry conveyor belt tension is checked before each shift; a slack conveyor "
        "belt slips on the head pulley and the quarry crusher stalls. "
    )
    runbook = " ".join(section.format(n=n) + "Filler words about gravel sorting and dust. " * 20 for n in range(12))
    notes = {f"crowd/note-{i}": f"Note {i}: the quarry conveyor belt was replaced on shift {i}." for i in range(4)}
    await ingestor.apply(
        [MemoryItem(op="upsert", doc_id="crowd/runbook", version=1, content=runbook, source="crowd")]
        + [MemoryItem(op="upsert", doc_id=d, version=1, content=t, source="crowd") for d, t in notes.items()]
    )
    only = {"source": "crowd"}
    text = "quarry conveyor belt tension slack head pulley crusher stalls"
    unlimited = await retriever.search(SearchSpec(text=text, top_k=6, metadata_filter=only, max_per_doc=0))
    assert [h.chunk.doc_id for h in unlimited.hits].count("crowd/runbook") >= 5  # it floods, unlimited
    crowded = await retriever.search(SearchSpec(text=text, top_k=6, metadata_filter=only))
    docs = [h.chunk.doc_id for h in crowded.hits]
    assert docs.count("crowd/runbook") == RetrievalConfig().max_per_doc == 3, docs
    assert len(set(docs) - {"crowd/runbook"}) == 3, docs  # three notes, each once
    # The runbook's chunks it returns are its best: the head of the unlimited list's.
    best = [h.chunk.chunk_id for h in unlimited.hits if h.chunk.doc_id == "crowd/runbook"][:3]
    assert [h.chunk.chunk_id for h in crowded.hits if h.chunk.doc_id == "crowd/runbook"] == best
    # One each: the five documents, then the runbook's next chunk fills the sixth place.
    one = [
        h.chunk.doc_id
        for h in (await retriever.search(SearchSpec(text=text, top_k=6, metadata_filter=only, max_per_doc=1))).hits
    ]
    assert sorted(one[:5]) == sorted({"crowd/runbook", *notes}) and one[5] == "crowd/runbook", one
    # Only the runbook is searched: its chunks fill every place all the same.
    alone = await retriever.search(SearchSpec(text=text, top_k=6, metadata_filter={"doc_id": "crowd/runbook"}))
    assert [h.chunk.doc_id for h in alone.hits] == ["crowd/runbook"] * 6
    with pytest.raises(InvalidRequest, match="max_per_doc"):
        await retriever.search(SearchSpec(text=text, top_k=6, max_per_doc=-1))


async def test_recency_weight_puts_the_newer_of_two_relevant_notes_first(stack) -> None:
    """The status of one thing recorded twice: by relevance the older note wins (it matches
    the query's words better); with a recency weight the newer one comes first, and each hit
    reports its recency rank. Weight 0 (the default) lifts nothing and ranks nothing by time."""
    _, ingestor, retriever = stack
    t0 = 1_790_000_000.0
    await ingestor.apply(
        [
            MemoryItem(
                op="upsert",
                doc_id="rc/old",
                version=1,
                content="Status of the quasar-billing migration: blocked on the schema review of the migration.",
                source="rc/old",
                timestamp=t0,
            ),
            MemoryItem(
                op="upsert",
                doc_id="rc/new",
                version=1,
                content="Update: quasar-billing went live this morning.",
                source="rc/new",
                timestamp=t0 + 86_400,
            ),
        ]
    )
    text = "status of the quasar-billing migration"
    # Only these two: the module's other tests share the index, and newer unrelated notes
    # among the results would take the recency ranks.
    only = {"doc_id": ["rc/old", "rc/new"]}
    plain = await retriever.search(SearchSpec(text=text, top_k=2, metadata_filter=only))
    assert [h.chunk.doc_id for h in plain.hits] == ["rc/old", "rc/new"], [(h.chunk.doc_id, h.ranks) for h in plain.hits]
    assert all("recency" not in h.ranks for h in plain.hits)
    recent = await retriever.search(SearchSpec(text=text, top_k=2, recency_weight=2.0, metadata_filter=only))
    assert [h.chunk.doc_id for h in recent.hits] == ["rc/new", "rc/old"]
    assert [h.ranks["recency"] for h in recent.hits] == [1, 2]


def _turn(agent: str, session: str, n: int, text: str) -> MemoryItem:
    event = TranscriptEvent(event_id=f"{agent}{session}{n}", agent_id=agent, session_id=session, turn=n, content=text)
    return event.to_item(BASE_FILTER_KEYS)


def _forget(agent: str, session: str | None = None) -> MemoryItem:
    event = ForgetEvent(event_id="f", op="forget", agent_id=agent, session_id=session, all_sessions=session is None)
    return event.to_item(BASE_FILTER_KEYS)


async def test_forget_deletes_a_sessions_turns_and_nothing_else(stack) -> None:
    """A forget deletes every turn of its session, stored or earlier in its batch, and keeps
    the turns after it, the agent's other sessions and an agent whose id it prefixes; an
    agent-wide forget deletes every session of the agent."""
    index, ingestor, retriever = stack
    await ingestor.apply(
        [
            _turn("fg/a", "s1", 1, "restarted the zephyr cache"),
            _turn("fg/a", "s1", 2, "zephyr cache is warm again"),
            _turn("fg/a", "s2", 1, "zephyr cache in the other session"),
            _turn("fg/ab", "s1", 1, "zephyr cache of another agent"),
        ]
    )
    s1 = [f"transcript:fg%2Fa/s1/{n}" for n in (1, 2, 3, 4)]
    report = await ingestor.apply(
        [
            _turn("fg/a", "s1", 3, "zephyr cache, last word"),
            _forget("fg/a", "s1"),
            _turn("fg/a", "s1", 4, "a new start"),
        ]
    )
    assert report.failed == []
    assert [bool(await index.chunk_ids(d)) for d in s1] == [False, False, False, True]
    assert await index.chunk_ids("transcript:fg%2Fa/s2/1") and await index.chunk_ids("transcript:fg%2Fab/s1/1")
    out = await retriever.search(SearchSpec(text="zephyr cache", top_k=10, metadata_filter={"session_id": "s1"}))
    assert {h.chunk.doc_id for h in out.hits} == {"transcript:fg%2Fab/s1/1", s1[3]}

    # a turn stored before ids were percent-encoded (its id has the raw "/"): same tags
    legacy = MemoryItem(
        op="upsert",
        doc_id="transcript:fg/a/s2/9",
        version=None,
        kind="transcript",
        content="zephyr cache, stored under the old id",
        tags={"agent_id": "fg/a", "session_id": "s2"},
    )
    await ingestor.apply([legacy, dataclasses.replace(legacy, doc_id="transcript:fg/a/s2/8")])
    # one turn forgotten: found under its old id by its session's tags, and only that turn
    turn9 = ForgetEvent(event_id="f9", op="forget", agent_id="fg/a", session_id="s2", turn=9)
    assert (await ingestor.apply([turn9.to_item(BASE_FILTER_KEYS)])).failed == []
    assert not await index.chunk_ids(legacy.doc_id) and await index.chunk_ids("transcript:fg/a/s2/8")
    await ingestor.apply([_forget("fg/a")])
    assert not await index.chunk_ids("transcript:fg%2Fa/s2/1") and not await index.chunk_ids(s1[3])
    assert not await index.chunk_ids(legacy.doc_id)
    assert await index.chunk_ids("transcript:fg%2Fab/s1/1")
    out = await retriever.search(SearchSpec(text="zephyr cache", top_k=10, metadata_filter={"agent_id": "fg/a"}))
    assert out.hits == []


class RefusesDeleteOf(ChunkIndex):
    """The real index, refusing (as Redis refuses a command) the delete of one doc."""

    def __init__(self, *args: Any, refused: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refused = refused

    async def apply(self, doc_id: str, version: int | None, chunks: Sequence[Any], *args: Any, **kw: Any) -> Any:
        if doc_id == self.refused and not chunks:
            raise IndexError_("delete refused (injected)")
        return await super().apply(doc_id, version, chunks, *args, **kw)


async def test_a_failed_forget_never_falls_back_to_the_turn_it_forgets(stack, embedder, redis_url: str) -> None:
    """A turn and a forget of its session in one batch: should the forget's delete fail, the
    turn must not be written in its place (a failed doc falls back to its next best item of
    the batch, which here is the very turn the forget was to remove). The forget fails once;
    the other turns it covers are still deleted."""
    index, ingestor, _ = stack
    await ingestor.apply([_turn("ff/a", "s1", 1, "quokka ledger, first turn")])
    client = aredis.from_url(redis_url)
    refusing = RefusesDeleteOf(client=client, cfg=index.cfg, dims=embedder.dims, refused="transcript:ff%2Fa/s1/2")
    failing = Ingestor(index=refusing, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
    forget = _forget("ff/a", "s1")
    report = await failing.apply([_turn("ff/a", "s1", 2, "quokka ledger, second turn"), forget])
    assert [(i is forget, e.code) for i, e in report.failed] == [(True, "index_error")]
    assert not await index.chunk_ids("transcript:ff%2Fa/s1/1")
    assert not await index.chunk_ids("transcript:ff%2Fa/s1/2")  # the fallback would have written it
    assert report.applied and all(r.chunks == 0 for r in report.applied)
    await client.aclose()


async def test_filters_do_not_change_bm25_scores(stack) -> None:
    """On this corpus, a filter distributed into each term keeps the unfiltered BM25 ranking."""
    index, _, _ = stack
    from memory.filters import hash_clause
    from memory.text import bm25_query, query_terms

    terms = query_terms("timeout pool connection gateway 504")  # no ties among the matching chunks
    await settled(index._r, index.cfg.name)  # the same BM25 statistics for both
    plain = await index.search_text(bm25_query(terms), k=10)
    filtered = await index.search_text(bm25_query(terms, within=hash_clause({"tenant": ["default"]})), k=10)
    assert [h.chunk_id for h in plain] == [h.chunk_id for h in filtered] and len(plain) >= 3


async def test_concurrent_query_embeddings_are_batched_and_exact(embedder) -> None:
    """Queries embedded concurrently (micro-batched) get exactly the vectors they would alone."""
    import asyncio

    import numpy as np

    texts = [f"question number {i} about pgbouncer pools" for i in range(12)]
    together = await asyncio.gather(*(embedder.embed_query(t) for t in texts))
    alone = [await embedder.embed_documents([t]) for t in texts]
    for a, b in zip(together, alone, strict=True):
        assert np.allclose(a, b[0], atol=1e-5)


class FailsOnMarker:
    """The real embedder, failing the way the worker reports a model error on one input."""

    MARKER = "UNEMBEDDABLE"

    def __init__(self, inner: Any) -> None:
        self.inner, self.dims, self.identity = inner, inner.dims, inner.identity
        self.calls: list[int] = []

    async def embed_documents(self, texts: Sequence[str]) -> Any:
        self.calls.append(len(texts))
        if any(self.MARKER in t for t in texts):
            raise EmbedderError("the model failed on this input (injected)")
        return await self.inner.embed_documents(texts)

    async def embed_query(self, text: str) -> Any:
        return await self.inner.embed_query(text)

    async def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return await self.inner.token_offsets(text)


async def test_one_input_the_model_fails_on_fails_only_its_doc(stack, embedder) -> None:
    """The group is embedded again doc by doc: the neighbours of the bad doc are indexed."""
    index, _, _ = stack
    failing = FailsOnMarker(embedder)
    ingestor = Ingestor(index=index, embedder=failing, chunking=ChunkingConfig(), cfg=IngestConfig())
    docs = ["wiki/group-a.md", "wiki/group-bad.md", "wiki/group-b.md"]
    report = await ingestor.apply(
        [
            item(docs[0], text="pgbouncer pool notes"),
            item(docs[1], text=f"{FailsOnMarker.MARKER} text"),
            item(docs[2], text="session cache notes"),
        ]
    )
    assert [i.doc_id for i, _ in report.failed] == [docs[1]]
    assert report.failed[0][1].code == "embedding_failed"
    assert sorted(r.doc_id for r in report.applied) == [docs[0], docs[2]]
    assert await index.versions(docs) == {docs[0]: 1, docs[2]: 1}
    assert failing.calls[0] == 3  # one group first, then doc by doc


async def test_a_failed_newest_version_falls_back_to_the_next_in_the_batch(stack, embedder) -> None:
    """Stored v3, batch v4 (fine) + v5 (fails): v5 is reported failed and v4 is applied, as one-by-one polling would."""
    index, ingestor, _ = stack
    doc = "wiki/fallback.md"
    await ingestor.apply([item(doc, 3, text="three")])
    failing = Ingestor(index=index, embedder=FailsOnMarker(embedder), chunking=ChunkingConfig(), cfg=IngestConfig())
    report = await failing.apply([item(doc, 4, text="four"), item(doc, 5, text=f"{FailsOnMarker.MARKER} five")])
    assert [(i.version, e.code) for i, e in report.failed] == [(5, "embedding_failed")]
    assert [r.stored_version for r in report.applied] == [4]
    assert await index.versions([doc]) == {doc: 4}


async def test_a_filter_value_with_edge_spaces_matches_in_the_vector_leg(stack) -> None:
    """RediSearch trims TAG values; the vector leg filters on exact values, like the text legs."""
    _, ingestor, retriever = stack
    await ingestor.apply([item("wiki/spaced.md", env="canary ", text="walrus migration runbook")])
    for weights in ({"sparse_weight": 0.0}, {"dense_weight": 0.0}):
        out = await retriever.search(
            SearchSpec(text="walrus migration", top_k=3, metadata_filter={"environment": "canary "}, **weights)
        )
        assert [h.chunk.doc_id for h in out.hits] == ["wiki/spaced.md"], weights
    out = await retriever.search(
        SearchSpec(text="walrus migration", top_k=3, metadata_filter={"environment": "canary"}, sparse_weight=0.0)
    )
    assert out.hits == []


async def test_inputs_that_are_redisearch_syntax_errors_raw_are_searched(stack) -> None:
    """Inputs that are syntax errors to this RediSearch when sent raw (a lone ``_`` term, filter
    values holding ASCII control characters or only ``_``), and a term over 128 bytes, which
    RediSearch cuts: each is searched, and found, in every leg."""
    index, ingestor, retriever = stack
    await ingestor.apply(
        [
            item("wiki/underscore.md", env="_", text="what does _ mean in the heron shell"),
            item("wiki/control.md", env="a\x00b", text="heron relay control characters"),
            item("wiki/del.md", env="\x7f", text="heron relay delete character"),
            item("wiki/long.md", env="long", text=f"{'q' * 300} and {'ü' * 100} and ERR_{'X' * 200}"),
        ]
    )
    for weights in ({"dense_weight": 0.0}, {"sparse_weight": 0.0}, {}):
        out = await retriever.search(SearchSpec(text="what does _ mean", top_k=3, **weights))
        assert "wiki/underscore.md" in {h.chunk.doc_id for h in out.hits}, weights
        for env, doc in (("_", "wiki/underscore.md"), ("a\x00b", "wiki/control.md"), ("\x7f", "wiki/del.md")):
            out = await retriever.search(
                SearchSpec(text="heron _", top_k=3, metadata_filter={"environment": env}, **weights)
            )
            assert [h.chunk.doc_id for h in out.hits] == [doc], (env, weights)
    for text in ("q" * 300, "ü" * 100, "ERR_" + "X" * 200):
        out = await retriever.search(SearchSpec(text=text, top_k=3, dense_weight=0.0))
        assert [h.chunk.doc_id for h in out.hits] == ["wiki/long.md"], text[:8]
    await index.ping()


async def test_configured_weights_and_k_are_the_defaults(stack, embedder) -> None:
    """AGENTMEM_RETRIEVAL__* set what a request leaves out; a request's own values still win."""
    index, _, _ = stack
    retriever = Retriever(
        index=index, embedder=embedder, cfg=RetrievalConfig(rrf_k=10, sparse_weight=0.0, identifier_weight=0.0)
    )
    out = await retriever.search(SearchSpec(text="billing-service HTTP 504 gateway timeout", top_k=3))
    assert out.hits and all(set(h.ranks) == {"dense"} for h in out.hits)
    assert [h.score for h in out.hits] == pytest.approx([1 / (10 + h.ranks["dense"]) for h in out.hits])
    out = await retriever.search(
        SearchSpec(text="billing-service HTTP 504 gateway timeout", top_k=3, sparse_weight=1.0, rrf_k=60)
    )
    assert any("sparse" in h.ranks for h in out.hits)
    assert all(h.score <= 2 / 61 + 1e-12 for h in out.hits)


async def test_an_index_lost_with_redis_data_is_recreated_by_the_daemons_writer(redis_url: str, embedder) -> None:
    """Redis restarted empty: the daemon's index recreates itself (and says so) instead of
    failing every event into the DLQ; tools that only read never create it."""
    client = aredis.from_url(redis_url)
    name = unique("lost-index")
    daemon_index = ChunkIndex(client=client, cfg=IndexConfig(name=name), dims=embedder.dims, recreate=True)
    tool_index = ChunkIndex(client=client, cfg=IndexConfig(name=name), dims=embedder.dims)
    try:
        await daemon_index.ensure()
        ingestor = Ingestor(index=daemon_index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
        await ingestor.apply([item("wiki/before.md", text="before the flush")])
        await daemon_index.drop()  # what a flush leaves: no registry, no index, no keys
        with pytest.raises(NotFound):
            await tool_index.versions(["wiki/before.md"])
        report = await ingestor.apply([item("wiki/after.md", text="walrus after the flush")])
        assert [r.doc_id for r in report.applied] == ["wiki/after.md"] and not report.failed
        retriever = Retriever(index=daemon_index, embedder=embedder, cfg=RetrievalConfig())
        out = await retriever.search(SearchSpec(text="walrus after the flush", top_k=2))
        assert [h.chunk.doc_id for h in out.hits] == ["wiki/after.md"]
    finally:
        await daemon_index.drop()
        await client.aclose()


async def test_a_lost_registry_is_rebuilt_from_the_alias_and_the_data_kept(redis_url: str, embedder) -> None:
    """The generation registry deleted (or evicted) while the alias and the index live on:
    a start adopts the generation the alias points at (its data intact, no later build
    reusing a number) instead of failing on an alias that already exists; a running writer
    does the same instead of recreating the index empty. An alias whose index these
    settings would not build is refused, naming both."""
    client = aredis.from_url(redis_url)
    name = unique("lost-registry")
    cfg = IndexConfig(name=name)
    index = ChunkIndex(client=client, cfg=cfg, dims=embedder.dims, recreate=True)
    try:
        await index.ensure()
        ingestor = Ingestor(index=index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
        await ingestor.apply([item("wiki/kept.md", text="walrus ledger kept")])
        # generation 3 active behind the alias, generation 4 left by a dead build
        for gen in (3, 4):
            await ChunkIndex(client=client, cfg=cfg, dims=embedder.dims, generation=gen).ensure()
        await client.execute_command("FT.ALIASUPDATE", name, f"{name}-g3")
        await client.hset(index.registry.key, mapping={"active": 3, "seq": 4})
        await index.state(fresh=True)
        await ingestor.apply([item("wiki/in-g3.md", text="walrus ledger in three")])

        await client.delete(index.registry.key)
        # doctor sends the operator to a daemon start (which adopts), never to a drop
        (finding,) = await check_generation(client, Settings(index=cfg), embedder.dims)
        assert not finding.ok and "alias points at generation 3" in finding.detail, finding
        assert "adopts" in finding.fix and "DROPINDEX" not in finding.fix
        fresh = ChunkIndex(client=client, cfg=cfg, dims=embedder.dims, recreate=True)
        with pytest.raises(ReindexConflict, match="no active generation"):
            await fresh.registry.unregister(3)  # drop-generation: nothing is dropped blind
        await fresh.ensure()  # before: "Alias already exists", at every start
        state = await fresh.state(fresh=True)
        assert state.active == 3 and state.spec == fresh.spec
        assert "registry lost" in (await fresh.registry.adopted())[3]  # doctor shows it
        assert await fresh.versions(["wiki/in-g3.md"]) == {"wiki/in-g3.md": 1}
        gen, _ = await fresh.registry.reserve("reindex-next")
        assert gen == 5  # past the leftover generation 4
        await fresh.registry.release("reindex-next")

        await client.delete(index.registry.key)  # now under a running writer
        await index.state(fresh=True)
        await ingestor.apply([item("wiki/after.md", text="walrus ledger after")])
        assert (await index.state(fresh=True)).active == 3
        assert await index.versions(["wiki/in-g3.md", "wiki/after.md"]) == {"wiki/in-g3.md": 1, "wiki/after.md": 1}

        await client.delete(index.registry.key)
        other = ChunkIndex(client=client, cfg=cfg, dims=embedder.dims + 1, recreate=True)
        with pytest.raises(IndexError_, match=f"{name}-g3"):
            await other.ensure()
    finally:
        for gen in (1, 3, 4):
            await ChunkIndex(client=client, cfg=cfg, dims=embedder.dims, generation=gen).drop()
        await index.drop()
        await client.aclose()


async def test_a_search_that_outlives_the_timeout_fails_rather_than_answering_in_part(redis_url: str) -> None:
    """Redis's search module answers a query that outlives its TIMEOUT with what it found so
    far, silently, unless ON_TIMEOUT is FAIL. The Redis we start loads it that way, and the
    timeout reaches the caller as an outage (``unavailable`` to an asker), never as a short
    list of hits."""
    client = aredis.from_url(redis_url)
    index = ChunkIndex(client=client, cfg=IndexConfig(name=unique("search-timeout")), dims=4)
    try:
        assert await search_timeout_policy(client) == "fail"
        await index.drop()
        await index.ensure()
        words = [f"w{i}" for i in range(200)]
        root = chunk_prefix(index._cfg.name, 1)
        pipe = client.pipeline(transaction=False)
        for i in range(20_000):  # ~400k postings for the OR below: milliseconds, not one
            terms = " ".join(words[(i * 7 + j * 13) % 200] for j in range(20))
            pipe.hset(f"{root}{i}", mapping={"terms": terms, "doc_id": f"d{i}", "tenant": "default"})
            if i % 2000 == 1999:
                await pipe.execute()
        await pipe.execute()
        query = bm25_query(words[:100])
        assert len(await index.search_text(query, k=10)) == 10  # answers under the usual timeout
        reply = await client.execute_command("FT.CONFIG", "GET", "TIMEOUT")
        before = reply[b"TIMEOUT"] if isinstance(reply, dict) else reply[0][1]  # RESP3 or RESP2
        await client.execute_command("FT.CONFIG", "SET", "TIMEOUT", "1")
        try:
            with pytest.raises(BackendUnavailable, match="timed out"):
                await index.search_text(query, k=10)
        finally:
            await client.execute_command("FT.CONFIG", "SET", "TIMEOUT", before)
    finally:
        await index.drop()
        await client.aclose()


async def test_question_words_are_not_what_a_question_seeks(redis_url: str, embedder) -> None:
    """The BM25 leg searches a question without its question words: a chunk that only
    repeats "what did ... how did" is not found, the one that says what was decided is."""
    client = aredis.from_url(redis_url)
    index = ChunkIndex(client=client, cfg=IndexConfig(name=unique(__name__)), dims=embedder.dims)
    await index.drop()
    await index.ensure()
    try:
        ingestor = Ingestor(index=index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
        chatter = "What did we do? What did they do? How did it go? What did you do then?"
        await ingestor.apply(
            [
                item("chatter", text=chatter),
                item("decision", text="The planner decided to cache every embedding for a day."),
            ]
        )
        retriever = Retriever(index=index, embedder=embedder, cfg=RetrievalConfig())
        out = await retriever.search(SearchSpec(text="What did the planner decide?", top_k=5, dense_weight=0.0))
        assert [h.chunk.doc_id for h in out.hits] == ["decision"]
        # A query of question words alone is still searched for them.
        alone = await retriever.search(SearchSpec(text="what did you do", top_k=5, dense_weight=0.0))
        assert [h.chunk.doc_id for h in alone.hits] == ["chatter"]
    finally:
        await index.drop()
        await client.aclose()


async def test_a_lookup_never_returns_a_text_cut_short_by_an_edit_between_its_reads(redis_url: str, embedder) -> None:
    """Edits (one transaction each) that change the doc's number of chunks land while lookups
    run: each lookup gives one version whole, never a new version's first chunks under the
    old chunk set."""
    client = aredis.from_url(redis_url)
    index = ChunkIndex(client=client, cfg=IndexConfig(name=unique("lookup-race")), dims=embedder.dims)
    await index.ensure()
    ingestor = Ingestor(index=index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
    retriever = Retriever(index=index, embedder=embedder, cfg=RetrievalConfig())
    try:
        await _lookups_during_edits(ingestor, retriever)
    finally:
        await index.drop()
        await client.aclose()


async def _lookups_during_edits(ingestor: Ingestor, retriever: Retriever) -> None:
    doc = "wiki/growing.md"

    def text(version: int) -> str:
        para = f"The ledger-service (v{version}) paged the on-call engineer about lag on shard {{}}. " * 5
        return "\n\n".join(para.format(*[i] * 5) for i in range(2 + version % 2))

    await ingestor.apply([item(doc, 1, text=text(1))])
    seen: list[tuple[int | None, str]] = []
    editing = True

    async def look() -> None:
        while editing:
            [got] = await retriever.lookups.lookup([doc])
            seen.append((got.version, got.content))

    reader = asyncio.create_task(look())
    try:
        for version in range(2, 22):
            await ingestor.apply([item(doc, version, text=text(version))])
            await asyncio.sleep(0)
    finally:
        editing = False
        await reader
    assert len({v for v, _ in seen}) > 3, "the lookups met too few of the edits to tell"
    wrong = [(v, c[:40]) for v, c in seen if v is None or c != text(v)]
    assert not wrong, wrong[:2]
