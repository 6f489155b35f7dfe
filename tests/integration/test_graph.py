"""The GraphRAG layer on real Redis, the real model and spaCy: communities, staleness, summaries."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aredis

from consumers.events import ForgetEvent, TranscriptEvent
from graph.config import GraphConfig
from graph.contribution import Contribution
from graph.ner import SpacyNer
from graph.search import ScopedSearch
from graph.service import GraphService
from graph.store import GraphStore
from graph.summary_records import record_summarizer
from memory import keys
from memory.chunk_records import chunk_item
from memory.config import ChunkingConfig, IndexConfig, IngestConfig, RetrievalConfig
from memory.errors import BackendUnavailable, MemdError
from memory.index import ChunkIndex
from memory.ingest import Ingestor
from memory.records import COMMUNITY_PREFIX, ChunkRecord, MemoryItem
from memory.retrieval import Retriever
from memory.search_spec import SearchSpec
from memory.tenants import TenantRegistry
from tests.conftest import unique

pytestmark = pytest.mark.integration

CORPUS = {
    "runbooks/billing-504.md": "When billing-service returns HTTP 504, check pgbouncer first. "
    "The pgbouncer pool is capped by max_connections on db-01.prod.internal. "
    "ERR_CONN_RESET_4F2A in billing-service logs means pgbouncer dropped the connection.",
    "incidents/INC-4411.md": "Incident INC-4411: billing-service timed out with HTTP 504 for 20 minutes. "
    "pgbouncer reached max_connections; SQLSTATE 08006 appeared on db-01.prod.internal. "
    "Raising max_connections fixed ERR_CONN_RESET_4F2A.",
    "runbooks/auth-sessions.md": "The auth-service stores sessions in session-cache. "
    "ERR_SESSION_EXPIRED_77 means token_ttl is shorter than the client refresh interval. "
    "auth-service returns HTTP 401 when session-cache evicts keys early.",
    "incidents/INC-5120.md": "Incident INC-5120: auth-service answered HTTP 401 to valid users. "
    "session-cache ran out of memory and evicted sessions; ERR_SESSION_EXPIRED_77 spiked. "
    "We raised token_ttl and resized session-cache.",
    "runbooks/search-shards.md": "search-api returns HTTP 503 when es-node-3 drops out. "
    "ERR_SHARD_UNASSIGNED means refresh_interval is too low for the indexing rate on es-node-3. "
    "Restart es-node-3 and raise refresh_interval.",
    "incidents/INC-6001.md": "Incident INC-6001: search-api answered HTTP 503; es-node-3 lost its disk. "
    "ERR_SHARD_UNASSIGNED appeared for every shard on es-node-3 until refresh_interval was raised.",
}


@dataclass
class Stack:
    index: ChunkIndex
    store: GraphStore
    graph: GraphService
    ingestor: Ingestor
    search: ScopedSearch
    embedder: Any
    versions: dict[str, int]

    async def put(self, doc_id: str, text: str) -> None:
        self.versions[doc_id] = self.versions.get(doc_id, 0) + 1
        await self.ingestor.apply([MemoryItem(op="upsert", doc_id=doc_id, version=self.versions[doc_id], content=text)])

    async def delete(self, doc_id: str) -> None:
        self.versions[doc_id] = self.versions.get(doc_id, 0) + 1
        await self.ingestor.apply([MemoryItem(op="delete", doc_id=doc_id, version=self.versions[doc_id])])


class GatedEmbedder:
    """The real embedder; when armed, the next embed_documents call waits for ``release``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.dims, self.identity = inner.dims, inner.identity
        self.armed = False
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if self.armed:
            self.armed = False
            self.entered.set()
            await self.release.wait()
        return await self.inner.embed_documents(texts)

    async def embed_query(self, text: str) -> np.ndarray:
        return await self.inner.embed_query(text)

    async def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return await self.inner.token_offsets(text)


@pytest.fixture(scope="module")
async def ner() -> AsyncIterator[SpacyNer]:
    n = await SpacyNer.load("en_core_web_sm")
    yield n
    n.close()


@pytest.fixture
def llm_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The arguments of every litellm completion call, each still made (with its mock_response)."""
    import litellm

    calls: list[dict[str, Any]] = []
    original = litellm.acompletion

    async def spy(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return await original(**kwargs)

    monkeypatch.setattr(litellm, "acompletion", spy)
    return calls


async def make_stack(redis_url: str, embedder: Any, ner: SpacyNer, name: str, **graph_cfg: Any) -> Stack:
    client = aredis.from_url(redis_url)
    index = ChunkIndex(client=client, cfg=IndexConfig(name=name), dims=embedder.dims)
    await index.drop()
    async for key in client.scan_iter(match=keys.graph_prefix(name, "default") + ":*"):
        await client.delete(key)
    await index.ensure()
    cfg = GraphConfig(summarizer_rate_per_min=60_000, **graph_cfg)
    store = GraphStore(client=client, name=name)
    graph = GraphService(
        store=store, index=index, embedder=embedder, ner=ner, cfg=cfg, mock_llm_response=graph_cfg.get("mock")
    )
    ingestor = Ingestor(index=index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig(), hook=graph)
    search = ScopedSearch(
        retriever=Retriever(index=index, embedder=embedder, cfg=RetrievalConfig()), stores=lambda _tenant: store
    )
    return Stack(index, store, graph, ingestor, search, embedder, {})


@pytest.fixture
async def stack(redis_url: str, embedder: Any, ner: SpacyNer, request: pytest.FixtureRequest) -> Stack:
    s = await make_stack(redis_url, GatedEmbedder(embedder), ner, unique(request.node.nodeid))
    for doc_id, text in CORPUS.items():
        await s.put(doc_id, text)
    return s


async def expected_marks(s: Stack, doc_id: str, new_keys: set[str]) -> set[str]:
    """Communities holding any entity the doc had before or has after the change."""
    old = await s.store._r.get(s.store._k(f"contrib:{doc_id}"))  # the stored contribution
    old_keys = set(json.loads(old)["e"]) if old else set()
    touched = old_keys | new_keys
    return {c.id for c in await s.store.communities() if c.members & touched}


async def test_communities_exist_and_are_deterministic(
    stack: Stack, redis_url: str, embedder: Any, ner: SpacyNer
) -> None:
    """The corpus forms one community per topic, and a second build gives the same ids and members."""
    report = await stack.graph.recompute(force=True)
    assert report is not None and report.communities >= 3
    comms = {c.id: c.members for c in await stack.store.communities()}
    for c in await stack.store.communities():  # one read by id is what the list holds
        assert await stack.store.community(c.id) == c
    assert await stack.store.community("no-such-community") is None
    groups = [
        {"billing-service", "pgbouncer", "max_connections"},
        {"auth-service", "session-cache", "token_ttl"},
        {"search-api", "es-node-3", "refresh_interval"},
    ]
    for group in groups:
        assert any(group <= m for m in comms.values()), group
    other = await make_stack(redis_url, embedder, ner, unique("second-build"))
    for doc_id, text in CORPUS.items():
        await other.put(doc_id, text)
    await other.graph.recompute(force=True)
    assert {c.id: c.members for c in await other.store.communities()} == comms


async def test_edit_marks_exactly_the_touched_communities(stack: Stack) -> None:
    """An edit marks stale exactly the communities of its old and new entities; repeats coalesce; the worker clears."""
    await stack.graph.recompute(force=True)
    while await stack.graph.work_once():
        pass
    assert (await stack.store.stale())[0] == 0
    doc = "runbooks/auth-sessions.md"
    new_text = CORPUS[doc] + " Since v2 the auth-service also logs AuthTokenError."
    new_keys = set(
        (
            await stack.graph.extract(
                await chunk_item(
                    MemoryItem("upsert", doc, 0, content=new_text),
                    0,
                    embedder=stack.embedder,
                    chunking=ChunkingConfig(),
                )
            )
        ).entities
    )
    expected = await expected_marks(stack, doc, new_keys)
    await stack.put(doc, new_text)
    depth, items = await stack.store.stale()
    assert {i.community_id for i in items} == expected
    assert 0 < len(expected) < len(await stack.store.communities())
    assert all(i.doc_ids == [doc] and i.change_count == 1 for i in items)
    await stack.put(doc, new_text + " Again.")
    depth2, items2 = await stack.store.stale()
    assert depth2 == depth and all(i.change_count == 2 for i in items2)
    assert all(i.first_marked_at <= i.last_marked_at for i in items2)
    while await stack.graph.work_once():
        pass
    assert (await stack.store.stale())[0] == 0
    for cid in expected:
        summary = await stack.store.summaries.get(cid)
        assert summary is not None and summary["model"] == "extractive" and summary["text"].startswith("Entities:")


async def test_community_edited_while_being_summarized_stays_stale(stack: Stack) -> None:
    """A change that lands during summarization leaves the community stale for another pass."""
    await stack.graph.recompute(force=True)
    comm = next(c for c in await stack.store.communities() if "search-api" in c.members)
    embedder: GatedEmbedder = stack.embedder
    embedder.armed = True
    task = asyncio.create_task(stack.graph.summarize(comm.id))
    await asyncio.wait_for(embedder.entered.wait(), 30)  # the summary is written, not yet stored
    await stack.put("incidents/INC-6001.md", CORPUS["incidents/INC-6001.md"] + " search-api recovered at 18:40.")
    embedder.release.set()
    result = await task
    assert result is not None and result.cleared is False
    assert (await stack.store.is_stale([comm.id]))[comm.id] is True
    while await stack.graph.work_once():
        pass
    assert (await stack.store.is_stale([comm.id]))[comm.id] is False


async def test_extraction_runs_while_the_chunks_are_embedded(stack: Stack) -> None:
    """The hook's prepare (NER) finishes while the doc's embedding is held; apply follows the chunk write."""
    embedder: GatedEmbedder = stack.embedder
    prepared = asyncio.Event()
    applied_after_write: list[bool] = []

    class Spy:
        async def prepare(self, changes: Sequence[tuple[MemoryItem, Sequence[Any]]]) -> list[Any]:
            out = await stack.graph.prepare(changes)
            prepared.set()
            return out

        async def apply(self, item: MemoryItem, contrib: Any) -> object:
            applied_after_write.append(bool(await stack.index.chunk_ids(item.doc_id)))
            return await stack.graph.apply(item, contrib)

    ingestor = Ingestor(index=stack.index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig(), hook=Spy())
    doc = "incidents/INC-7000.md"
    embedder.armed = True
    task = asyncio.create_task(
        ingestor.apply([MemoryItem("upsert", doc, 1, content="billing-service hit ERR_LEDGER_LOCK_9C1 on Stripe.")])
    )
    await asyncio.wait_for(embedder.entered.wait(), 30)
    await asyncio.wait_for(prepared.wait(), 30)  # extraction done, embedding still held
    assert applied_after_write == [] and await stack.store.entity_docs("err_ledger_lock_9c1") == set()
    embedder.release.set()
    report = await task
    assert [r.doc_id for r in report.applied] == [doc] and applied_after_write == [True]
    assert await stack.store.entity_docs("err_ledger_lock_9c1") == {doc}


async def test_one_batch_in_many_embedding_groups_gives_the_same_graph(
    stack: Stack, redis_url: str, embedder: Any, ner: SpacyNer
) -> None:
    """A batch written group by group (writes overlapping the next group's embedding) equals docs put one by one."""
    batched = await make_stack(redis_url, embedder, ner, unique("batched-groups"))
    ingestor = Ingestor(
        index=batched.index,
        embedder=embedder,
        chunking=ChunkingConfig(),
        cfg=IngestConfig(embed_group_chunks=1),
        hook=batched.graph,
    )
    items = [MemoryItem("upsert", d, 1, content=t) for d, t in CORPUS.items()]
    items.append(MemoryItem("delete", "incidents/INC-5120.md", 2))
    report = await ingestor.apply(items)
    assert len(report.applied) == len(CORPUS) and not report.failed
    await stack.delete("incidents/INC-5120.md")
    assert await batched.store.graph() == await stack.store.graph()
    for key in (await stack.store.graph())[0]:
        assert await batched.store.entity_docs(key) == await stack.store.entity_docs(key)


async def test_ner_alone_finds_what_it_found_with_the_tagger(ner: SpacyNer) -> None:
    """Running only spaCy's ner component gives the same entities as with tagger and attribute ruler."""
    assert ner._nlp.pipe_names == ["ner"]
    texts = [*CORPUS.values(), "Jane Doe of Stripe met the Google Cloud team in Berlin on Monday about Kafka."]
    alone = [[(e.text, e.label_, e.start_char) for e in d.ents] for d in ner._nlp.pipe(texts)]
    tagger = ["tok2vec", "tagger", "attribute_ruler"]  # the parser stays off, as it always was
    for name in tagger:
        ner._nlp.enable_pipe(name)
    try:
        assert ner._nlp.pipe_names == [*tagger, "ner"]
        tagged = [[(e.text, e.label_, e.start_char) for e in d.ents] for d in ner._nlp.pipe(texts)]
    finally:
        for name in tagger:
            ner._nlp.disable_pipe(name)
    assert alone == tagged and any(alone)


async def test_a_large_document_does_not_hold_the_ner_thread_from_other_ingest_calls(ner: SpacyNer) -> None:
    """Both ingest subscribers share the NER thread: a document of many chunks goes in
    requests, so a turn's chunk gets in between; the document's entities stay in order."""
    big = [f"Note {i}: Jane Doe {i} of Stripe met the Google Cloud team in Berlin about Kafka." for i in range(800)]
    whole = asyncio.create_task(ner.entities(big))
    await asyncio.sleep(0)  # the document's first request is in the NER thread
    turn = await ner.entities(["Priya Patel moved the Acme Corp deploy to Tuesday."])
    assert any(label == "PERSON" for _, label in turn[0])
    assert not whole.done(), "the turn waited for the whole document"
    found = await whole
    assert len(found) == len(big)
    for i in (0, 63, 64, 799):
        assert found[i] == (await ner.entities([big[i]]))[0], i


async def test_a_large_documents_chunking_extraction_and_write_run_off_the_event_loop(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pure Python at up to ~1 ms per chunk: on the event loop, a 756-chunk document's
    extraction stalled every query for 0.7 s (measured on a live daemon); its write's hashes
    and the graph read of a recompute after it, ~0.2-0.3 s each; a capped contribution's JSON,
    30-65 ms. They run in threads; the doc is indexed and extracted as before."""
    import graph.contribution
    import graph.extractor
    import graph.store
    import memory.chunk_records
    import memory.index.codec

    names = ("spans_for", "contribution_from", "_record_mapping", "_parse_graph", "to_json")
    threads: dict[str, set[int]] = {name: set() for name in names}

    def spy(name: str, fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            threads[name].add(threading.get_ident())
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(memory.chunk_records, "spans_for", spy("spans_for", memory.chunk_records.spans_for))
    parts = graph.extractor.contribution_from
    monkeypatch.setattr(graph.extractor, "contribution_from", spy("contribution_from", parts))
    mapping = memory.index.codec._record_mapping
    monkeypatch.setattr(memory.index.codec, "_record_mapping", spy("_record_mapping", mapping))
    monkeypatch.setattr(graph.store, "_parse_graph", spy("_parse_graph", graph.store._parse_graph))
    # This doc's contribution is small (few distinct words); its JSON takes the large path.
    monkeypatch.setattr(graph.store, "_INLINE_JSON_ITEMS", 0)
    monkeypatch.setattr(
        graph.contribution.Contribution, "to_json", spy("to_json", graph.contribution.Contribution.to_json)
    )
    words = "the pool retries while a cache warms and every worker drains its queue before noon".split()
    content = "Stripe reported ERR_LEDGER_LOCK_9C1. " + " ".join(words[(i * 7) % len(words)] for i in range(21_000))
    doc = "manuals/large.md"
    report = await stack.ingestor.apply([MemoryItem("upsert", doc, 1, content=content)])
    assert [r.doc_id for r in report.applied] == [doc] and len(await stack.index.chunk_ids(doc)) > 80
    assert await stack.store.entity_docs("err_ledger_lock_9c1") == {doc}
    nodes, _ = await stack.store.graph()  # what a community recompute reads
    assert "err_ledger_lock_9c1" in nodes
    loop_thread = threading.get_ident()
    for name in names:
        assert threads[name] and loop_thread not in threads[name], name


async def test_a_write_whose_reply_was_lost_still_reaches_the_graph(
    redis_url: str, embedder: Any, ner: SpacyNer
) -> None:
    """The chunk write succeeds in Redis but its reply is lost (a timeout, a reset): the retry
    finds this very version stored and skips the write, and the doc's graph work must still run."""
    s = await make_stack(redis_url, embedder, ner, unique("lost-reply"))
    real_apply = s.index.apply
    lost: list[str] = []

    async def reply_lost_once(doc_id: str, *args: Any, **kwargs: Any) -> Any:
        result = await real_apply(doc_id, *args, **kwargs)
        if not lost:
            lost.append(doc_id)
            raise BackendUnavailable("redis unavailable during chunk write: connection reset (test)")
        return result

    s.index.apply = reply_lost_once  # type: ignore[method-assign]
    doc_id = "runbooks/billing-504.md"
    await s.put(doc_id, CORPUS[doc_id])
    assert lost == [doc_id] and await s.index.chunk_ids(doc_id)
    assert await s.store._r.get(s.store._k(f"contrib:{doc_id}")) is not None
    assert doc_id in await s.store.entity_docs("err_conn_reset_4f2a")


async def test_a_forget_redelivered_after_a_crash_still_clears_the_graph(
    redis_url: str, embedder: Any, ner: SpacyNer
) -> None:
    """A forget's first delivery dies between a turn's chunk delete and its graph delete (as
    under kill -9): the redelivery lists the session's turns again, the ones with no chunks
    left among them, and their entities leave the graph."""
    name = unique("forget-crash")
    s = await make_stack(redis_url, embedder, ner, name)
    keys_ = IndexConfig().filter_keys
    said = ["Alice Johnson from Acme Corporation flew to Paris on Monday.", "Bob Smith met her in Berlin."]
    turns = [
        TranscriptEvent(event_id=f"e{n}", agent_id="a1", session_id="s1", turn=n, content=text).to_item(keys_)
        for n, text in enumerate(said)
    ]
    await s.ingestor.apply(turns)
    assert await s.store.doc_ids() == [t.doc_id for t in turns]
    forget = ForgetEvent(event_id="f1", op="forget", agent_id="a1", session_id="s1").to_item(keys_)

    class CrashAtTheFirstGraphDelete:
        crashed = False

        async def prepare(self, changes: Sequence[tuple[MemoryItem, Sequence[Any]]]) -> list[Any]:
            return await s.graph.prepare(changes)

        async def apply(self, item: MemoryItem, contrib: Any) -> object:
            if item.op == "delete" and not self.crashed:
                self.crashed = True  # the chunks of this turn are deleted already
                raise RuntimeError("the daemon died here")
            return await s.graph.apply(item, contrib)

        async def docs_under(self, tenant: str, prefix: str) -> set[str]:
            return await s.graph.docs_under(tenant, prefix)

    dying = Ingestor(
        index=s.index,
        embedder=embedder,
        chunking=ChunkingConfig(),
        cfg=IngestConfig(),
        hook=CrashAtTheFirstGraphDelete(),
    )
    with pytest.raises(RuntimeError, match="died"):
        await dying.apply([forget])
    gone = [t.doc_id for t in turns if not await s.index.chunk_ids(t.doc_id)]
    assert gone and set(gone) <= set(await s.store.doc_ids())  # chunks deleted, the graph not

    report = await s.ingestor.apply([forget])  # the redelivery
    assert not report.failed
    assert [await s.index.chunk_ids(t.doc_id) for t in turns] == [set(), set()]
    assert await s.store.doc_ids() == []
    nodes, edges = await s.store.graph()
    assert nodes == {} and edges == [], (nodes, edges)

    # A graph written before it kept a list of its docs: the list is filled once, on first use.
    await s.ingestor.apply(turns)
    await s.store._r.delete(s.store._k("docs"), s.store._k("docs_listed"))
    older = GraphStore(client=s.store._r, name=name)
    assert await older.doc_ids_under(forget.doc_id) == {t.doc_id for t in turns}
    assert await older.doc_ids_under("transcript:a1/s2/") == set()


async def test_a_summary_is_not_written_from_passages_an_edit_moved_before_its_graph_change(
    redis_url: str, embedder: Any, ner: SpacyNer
) -> None:
    """A paragraph inserted at a doc's top shifts its chunk ids and changes no entity. Between
    its chunk write and its graph change, the graph's ids name other passages: a summary then
    waits (its community stays stale) instead of being written from them and kept as fresh."""
    s = await make_stack(redis_url, embedder, ner, unique("moved-passages"))

    async def write_chunks(doc: str, version: int, texts: list[str]) -> Contribution:
        recs = [
            ChunkRecord(f"{doc}_p{i}", doc, i, t, "document", doc, {}, {}, version, 1_700_000_000.0 + version)
            for i, t in enumerate(texts)
        ]
        assert (await s.index.apply(doc, version, recs, await embedder.embed_documents(texts))).applied
        (contrib,) = await s.graph.extract_chunks([[(c.chunk_id, c.text) for c in recs]])
        return contrib

    billing = "The billing-service writes invoices to ledger-db through pgbouncer-proxy."
    auth = "The auth-service keeps its sessions in session-cache."
    await s.store.apply("runbook", 1, await write_chunks("runbook", 1, [billing, auth]))
    await s.graph.recompute(force=True)
    while await s.graph.work_once():
        pass
    cid = next(c.id for c in await s.store.communities() if "billing-service" in c.members)
    # Another doc marks the billing community stale, then the runbook gains a first paragraph.
    marked = await s.store.apply("incident", 1, await write_chunks("incident", 1, [f"{billing} It returned 504s."]))
    assert cid in marked.marked
    moved = await write_chunks("runbook", 2, ["Overview: reviewed in March by the on-call team.", billing, auth])
    with pytest.raises(MemdError, match="out of step"):
        await s.graph.summarize(cid)  # the graph still names runbook_p0 for billing-service
    assert (await s.store.is_stale([cid]))[cid] is True
    applied = await s.store.apply("runbook", 2, moved)
    assert applied.applied and cid not in applied.marked  # the edit changed no entity
    result = await s.graph.summarize(cid)
    assert result is not None and result.cleared and "ledger-db" in result.text, result

    # Turns carry no version (none in the graph, 0 on their chunks): their communities are summarized.
    keys_ = IndexConfig().filter_keys
    said = ["Alice Johnson from Acme Corporation flew to Paris.", "Alice Johnson met Bob Smith of Acme Corporation."]
    await s.ingestor.apply(
        [
            TranscriptEvent(event_id=f"t{n}", agent_id="a1", session_id="s1", turn=n, content=text).to_item(keys_)
            for n, text in enumerate(said)
        ]
    )
    await s.graph.recompute(force=True)
    while await s.graph.work_once():
        pass
    talk = next(c.id for c in await s.store.communities() if any("alice" in m for m in c.members))
    assert (await s.store.is_stale([talk]))[talk] is False and await s.store.summaries.get(talk) is not None


async def test_a_doc_with_a_megabyte_unbroken_string_is_indexed_and_extracted(
    redis_url: str, embedder: Any, ner: SpacyNer
) -> None:
    """A data URI of 1.2 MB is one [UNK] token to the model, so one chunk of over a million
    characters: more than spaCy takes (E088), which failed the whole doc before."""
    s = await make_stack(redis_url, embedder, ner, unique("huge-word"))
    blob = "data:image/png;base64," + "QUJD" * 300_000
    await s.put("notes/screenshot.md", f"ERR_SCREENSHOT_TOO_BIG_5B raised for this upload: {blob} (Microsoft Edge)")
    assert await s.index.chunk_ids("notes/screenshot.md")
    assert "notes/screenshot.md" in await s.store.entity_docs("err_screenshot_too_big_5b")


async def test_delete_everything_then_reingest_gives_the_same_communities(stack: Stack) -> None:
    """Deleting every doc empties the graph; re-ingesting brings back the same communities and ids."""
    await stack.graph.recompute(force=True)
    before = {c.id: c.members for c in await stack.store.communities()}
    for doc_id in CORPUS:
        await stack.delete(doc_id)
    nodes, edges = await stack.store.graph()
    assert nodes == {} and edges == []
    report = await stack.graph.recompute(force=True)
    assert report is not None and report.communities == 0 and set(report.removed) == set(before)
    assert await stack.store.communities() == []
    for doc_id, text in CORPUS.items():
        await stack.put(doc_id, text)
    await stack.graph.recompute(force=True)
    assert {c.id: c.members for c in await stack.store.communities()} == before


async def test_edge_weights_are_exact_after_edits(stack: Stack, redis_url: str, embedder: Any, ner: SpacyNer) -> None:
    """After edits and deletes, the stored graph equals the graph built from the final docs alone."""
    await stack.put("runbooks/billing-504.md", "billing-service now talks to pgbouncer-2 only. max_connections is 800.")
    await stack.delete("incidents/INC-5120.md")
    await stack.put("incidents/INC-5120.md", CORPUS["incidents/INC-5120.md"])
    await stack.put("runbooks/search-shards.md", CORPUS["runbooks/search-shards.md"] + " es-node-4 joined.")
    nodes, edges = await stack.store.graph()
    final = dict(CORPUS)
    final["runbooks/billing-504.md"] = "billing-service now talks to pgbouncer-2 only. max_connections is 800."
    final["runbooks/search-shards.md"] = CORPUS["runbooks/search-shards.md"] + " es-node-4 joined."
    fresh = await make_stack(redis_url, embedder, ner, unique("fresh-build"))
    for doc_id, text in final.items():
        await fresh.put(doc_id, text)
    assert await fresh.store.graph() == (nodes, edges)


async def test_scope_communities_returns_summaries(stack: Stack) -> None:
    """A broad question with scope=communities returns community summaries with their facts."""
    await stack.graph.recompute(force=True)
    while await stack.graph.work_once():
        pass
    spec = SearchSpec(text="how do we handle session expiry and HTTP 401 in auth?", top_k=3)
    outcome, stale = await stack.search.search(spec, "communities")
    assert outcome.hits and all(h.chunk.kind == "community" for h in outcome.hits)
    top = outcome.hits[0].chunk
    assert "auth-service" in top.text and top.metadata["member_count"] >= 3
    assert stale == {h.chunk.metadata["community_id"]: False for h in outcome.hits}
    chunks_only, _ = await stack.search.search(spec, "chunks")
    assert all(h.chunk.kind == "document" for h in chunks_only.hits)
    both, _ = await stack.search.search(SearchSpec(text="auth-service HTTP 401 session-cache", top_k=10), "all")
    assert {h.chunk.kind for h in both.hits} == {"document", "community"}
    # A recompute that removes the community drops its record at once and its summary chunk
    # later (or not, if that drop fails): meanwhile the summary is served as stale, not fresh.
    gone = top.metadata["community_id"]
    await stack.store._r.hdel(stack.store._k("comms"), gone)
    outcome, stale = await stack.search.search(spec, "communities")
    assert gone in stale and stale[gone] is True


async def test_litellm_path_with_mock_response(
    redis_url: str, embedder: Any, ner: SpacyNer, llm_calls: list[dict[str, Any]]
) -> None:
    """With a model configured, summaries go through litellm; the prompt carries members and chunk text."""
    assert os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP") == "True"
    calls = llm_calls
    s = await make_stack(
        redis_url,
        embedder,
        ner,
        unique("litellm"),
        llm_model="gpt-4o-mini",
        mock="Auth sessions expire early when session-cache evicts; raise token_ttl.",
    )
    for doc_id in ("runbooks/auth-sessions.md", "incidents/INC-5120.md"):
        await s.put(doc_id, CORPUS[doc_id])
    await s.graph.recompute(force=True)
    while await s.graph.work_once():
        pass
    assert calls, "litellm was not called"
    prompt = calls[0]["messages"][1]["content"]
    assert calls[0]["model"] == "gpt-4o-mini" and calls[0]["mock_response"]
    assert "auth-service" in prompt and "session-cache" in prompt
    assert "ERR_SESSION_EXPIRED_77 means token_ttl is shorter" in prompt or "session-cache ran out of memory" in prompt
    cid = next(iter(c.id for c in await s.store.communities()))
    summary = await s.store.summaries.get(cid)
    assert summary is not None and summary["model"] == "gpt-4o-mini"
    assert summary["text"] == "Auth sessions expire early when session-cache evicts; raise token_ttl."


async def test_resummarize_rewrites_the_summaries_another_summarizer_wrote(stack: Stack, redis_url: str) -> None:
    """After switching to an LLM, `graph resummarize` marks the extractive summaries stale (a
    summary in flight from before cannot clear the mark) and the workers write them with the
    model; run again it marks nothing, and --all marks every summarized community."""
    await stack.graph.recompute(force=True)
    while await stack.graph.work_once():
        pass
    comms = [c.id for c in await stack.store.communities()]
    assert comms and (await stack.store.stale())[0] == 0
    same = await stack.graph.resummarize()
    assert (same.summarizer, same.marked, same.kept) == ("extractive", 0, len(comms))

    said = "Sessions expire when session-cache evicts; raise token_ttl."
    llm = GraphService(
        store=stack.store,
        index=stack.index,
        embedder=stack.embedder,
        ner=None,
        cfg=GraphConfig(llm_model="gpt-4o-mini", summarizer_rate_per_min=60_000),
        mock_llm_response=said,
    )
    in_flight = {cid: await stack.store.mark_count(cid) for cid in comms}
    report = await llm.resummarize()
    assert (report.summarizer, report.marked, report.kept) == ("gpt-4o-mini", len(comms), 0)
    depth, items = await stack.store.stale(limit=100)
    assert depth == len(comms) and all(i.asked and i.cause() == "asked (graph resummarize)" for i in items)
    # A summary begun before the mark, with the old summarizer, does not clear it.
    assert not await stack.store.clear_if_unchanged(comms[0], in_flight[comms[0]])
    while await llm.work_once():
        pass
    assert (await stack.store.stale())[0] == 0
    for cid in comms:
        summary = await stack.store.summaries.get(cid)
        assert summary is not None and summary["model"] == "gpt-4o-mini" and summary["text"] == said
    again = await llm.resummarize()
    assert (again.marked, again.kept) == (0, len(comms))

    env = {
        **os.environ,
        "AGENTMEM_REDIS_URL": redis_url,
        "AGENTMEM_INDEX__NAME": stack.index.cfg.name,
        "AGENTMEM_GRAPH__LLM_MODEL": "gpt-4o-mini",
    }
    agentmemd = str(Path(sys.executable).parent / "agentmemd")
    res = subprocess.run([agentmemd, "graph", "resummarize", "--all"], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(comms)} summarized communities marked stale, 0 left" in " ".join(res.stdout.split()), res.stdout
    assert (await stack.store.stale())[0] == len(comms)
    res = subprocess.run([agentmemd, "graph", "resummarize", "--all"], env=env, capture_output=True, text=True)
    assert f"({len(comms)} of them were queued already)" in " ".join(res.stdout.split()), res.stdout
    # The daemons started their workers with the model: a shell without its settings is refused.
    await record_summarizer(stack.store._r, stack.index.cfg.name, "gpt-4o-mini")
    plain = {k: v for k, v in env.items() if k != "AGENTMEM_GRAPH__LLM_MODEL"}
    res = subprocess.run([agentmemd, "graph", "resummarize"], env=plain, capture_output=True, text=True)
    said = " ".join(res.stderr.split())
    assert res.returncode == 1 and "the daemons write summaries with 'gpt-4o-mini'" in said, said
    assert "nothing was marked" in said and (await stack.store.stale())[0] == len(comms)
    # Back to the extractive summarizer: the model's summaries are the other summarizer's now.
    back = await stack.graph.resummarize()
    assert (back.summarizer, back.marked) == ("extractive", len(comms))


async def test_a_large_communitys_prompt_names_its_most_mentioned_members_within_the_budget(
    redis_url: str, embedder: Any, ner: SpacyNer, llm_calls: list[dict[str, Any]]
) -> None:
    """A community of 300 entities: the prompt names the 50 most mentioned (the one every
    chunk names first), not all 300 in name order, and stays within summary_token_budget."""
    s = await make_stack(
        redis_url,
        embedder,
        ner,
        unique("big-prompt"),
        llm_model="gpt-4o-mini",
        mock="A summary.",
        summary_token_budget=400,
    )
    entities = {f"svc-{i:03d}-api": (f"svc-{i:03d}-api", "service", [f"d#{i % 7}"]) for i in range(300)}
    entities["zz-hub-api"] = ("zz-hub-api", "service", [f"d#{i}" for i in range(7)])
    edges = {(a, "zz-hub-api"): 1 for a in entities if a != "zz-hub-api"}
    await s.store.apply("d", 1, Contribution(entities=entities, edges=edges))
    await s.graph.recompute(force=True)
    while await s.graph.work_once():
        pass
    prompts = [c["messages"][1]["content"] for c in llm_calls]
    big = [p for p in prompts if "has 301 entities" in p]
    assert big, prompts
    head, names = big[0].split("\n")[:2]
    assert head.endswith("the 50 most mentioned:") and names.split(", ")[0] == "zz-hub-api", head
    assert len(names.split(", ")) == 50 and len(big[0].split()) <= 400 + 20


async def test_a_failing_model_pauses_the_worker_not_only_the_community(
    redis_url: str, embedder: Any, ner: SpacyNer, llm_calls: list[dict[str, Any]]
) -> None:
    """Three communities due and a model that fails: one call, then the worker pauses (the
    next community would fail alike), for twice as long after each failure in a row."""
    calls = llm_calls
    s = await make_stack(
        redis_url,
        embedder,
        ner,
        unique("llm-pause"),
        llm_model="gpt-4o-mini",
        mock="litellm.InternalServerError",
        summary_retry_initial_s=0.5,
    )
    for doc_id, text in CORPUS.items():
        await s.put(doc_id, text)
    await s.graph.recompute(force=True)
    assert len(await s.graph.due(10)) >= 3
    assert await s.graph.work_once() == 0 and len(calls) == 1
    assert await s.graph.work_once() == 0 and len(calls) == 1  # paused: the others wait
    await asyncio.sleep(0.6)
    assert await s.graph.work_once() == 0 and len(calls) == 2
    assert await s.graph.work_once() == 0 and len(calls) == 2  # paused for 1 s now
    # The community that failed last says it is tried again when the pause ends, not before.
    failed = [i for i in (await s.store.stale(limit=50))[1] if i.retry_at is not None]
    latest = max(failed, key=lambda i: i.retry_at or 0.0)
    assert (latest.retry_at or 0.0) - time.time() > 0.8, latest
    await asyncio.sleep(1.1)
    assert await s.graph.work_once() == 0 and len(calls) == 3


async def test_a_summary_finished_after_its_tenant_was_erased_is_not_written(stack: Stack) -> None:
    """An erase may come while a summary is written (an LLM call takes up to a minute): the
    summary checks the mark before it writes, so its chunk cannot outlive the erase's sweep."""
    await stack.graph.recompute(force=True)
    cid = (await stack.graph.due(1))[0]
    await TenantRegistry(client=stack.store._r, name=stack.index.cfg.name).erase("default")
    assert await stack.graph.summarize(cid) is None
    assert await stack.index.chunk_ids(COMMUNITY_PREFIX + cid) == set()


@pytest.mark.parametrize("failure", ["litellm.RateLimitError", "litellm.InternalServerError"])
async def test_llm_extraction_failures_never_hold_ingestion(
    redis_url: str, embedder: Any, ner: SpacyNer, failure: str
) -> None:
    """With LLM extraction on, a model that fails (rate limit, server error) does not fail the
    doc: its chunks are indexed with their identifier and NER entities."""
    s = await make_stack(
        redis_url, embedder, ner, unique("llm-extract"), llm_model="gpt-4o-mini", llm_extraction=True, mock=failure
    )
    doc_id = "runbooks/auth-sessions.md"
    await s.put(doc_id, CORPUS[doc_id])
    assert await s.index.chunk_ids(doc_id)
    assert doc_id in await s.store.entity_docs("err_session_expired_77")


async def test_stale_cli_reports_the_queue(stack: Stack, redis_url: str) -> None:
    """`agentmemd stale --json` shows depth, oldest age and each item's fields."""
    await stack.graph.recompute(force=True)
    env = {**os.environ, "AGENTMEM_REDIS_URL": redis_url, "AGENTMEM_INDEX__NAME": stack.index.cfg.name}
    agentmemd = str(Path(sys.executable).parent / "agentmemd")
    res = subprocess.run(
        [agentmemd, "stale", "--json", "--limit", "50"], env=env, capture_output=True, text=True, check=True
    )
    data = json.loads(res.stdout)
    assert data["depth"] == len(await stack.store.communities()) == len(data["items"])
    assert data["oldest_age_s"] >= 0
    assert set(data["items"][0]) == {
        "community_id",
        "level",
        "first_marked_at",
        "last_marked_at",
        "change_count",
        "doc_ids",
        "attempts",
        "last_error",
        "retry_at",
        "claimed",
        "asked",
        "ahead",
    }
    res = subprocess.run([agentmemd, "communities", "--json"], env=env, capture_output=True, text=True, check=True)
    assert len(json.loads(res.stdout)["communities"]) == data["depth"]
    # In topic tenancy the default tenant holds nobody's graph: an unnamed tenant is an error, not "0 communities".
    topic = {**env, "AGENTMEM_CONSUMER__TENANCY": "topic"}
    res = subprocess.run([agentmemd, "communities"], env=topic, capture_output=True, text=True)
    assert res.returncode != 0 and "--tenant" in res.stderr and "communities" not in res.stdout, res.stdout + res.stderr
    res = subprocess.run([agentmemd, "graph", "rebuild"], env=env, capture_output=True, text=True, check=True)
    assert "communities" in res.stdout
    assert "graph.communities_recomputed" not in res.stderr  # a one-shot command prints its result, not its info lines
    # a rebuild that removes communities deletes their summary chunks through the index,
    # built as the active generation was (no model loaded in the CLI)
    for doc_id in CORPUS:  # every document: the communities stay until a recompute
        await stack.delete(doc_id)
    res = subprocess.run([agentmemd, "communities"], env=env, capture_output=True, text=True, check=True)
    said = " ".join(res.stderr.split())
    assert "none of whose members a document still names" in said and "graph rebuild" in said, said
    res = subprocess.run([agentmemd, "graph", "rebuild"], env=env, capture_output=True, text=True)
    assert res.returncode == 0 and ", 0 removed" not in res.stdout, res.stdout + res.stderr
    assert await stack.store.summaries.pending_drops() == []
    res = subprocess.run([agentmemd, "communities"], env=env, capture_output=True, text=True, check=True)
    assert "no communities yet" in " ".join(res.stderr.split()), res.stderr


async def test_refresh_replaces_only_the_same_version(redis_url: str) -> None:
    """A replay never replaces a contribution; a refresh (re-chunked doc) does at the same
    version, and never brings an older version back."""
    client = aredis.from_url(redis_url)
    store = GraphStore(client=client, name=unique("graph-refresh"))
    first = Contribution(entities={"err_a_1": ("ERR_A_1", "error_code", ["d_p0"])}, edges={})
    moved = Contribution(entities={"err_a_1": ("ERR_A_1", "error_code", ["d_p3"])}, edges={})
    try:
        assert (await store.apply("d", 2, first)).applied
        assert not (await store.apply("d", 2, moved)).applied  # a replay
        assert (await store.chunks_of_each(["err_a_1"]))["err_a_1"] == ["d_p0"]
        assert not (await store.apply("d", 1, moved, refresh=True)).applied  # older: never
        assert (await store.apply("d", 2, moved, refresh=True)).applied
        assert (await store.chunks_of_each(["err_a_1"]))["err_a_1"] == ["d_p3"]
        assert await store.doc_ids() == ["d"]
        # never on an unversioned doc, nor on one deleted meanwhile
        assert (await store.apply("t", None, first)).applied
        assert not (await store.apply("t", None, moved, refresh=True)).applied
        assert (await store.apply("d", 3, None)).applied  # a versioned delete
        assert not (await store.apply("d", 3, moved, refresh=True)).applied
        assert (await store.chunks_of_each(["err_a_1"]))["err_a_1"] == ["d_p0"]  # t's own, unrefreshed; d's gone
    finally:
        await client.aclose()


async def test_communities_whose_every_member_is_gone_are_named_nowhere(redis_url: str) -> None:
    """Until the next recompute, a community whose documents were all deleted still exists:
    ``named`` (what the CLI and the explorer list) leaves it out, and keeps one with a member left."""
    from graph.communities import Community

    client = aredis.from_url(redis_url)
    store = GraphStore(client=client, name=unique("graph-named"))
    kept = Contribution(entities={"err_a_1": ("ERR_A_1", "error_code", ["a_p0"])}, edges={})
    gone = Contribution(entities={"err_b_2": ("ERR_B_2", "error_code", ["b_p0"])}, edges={})
    try:
        assert (await store.apply("a", 1, kept)).applied and (await store.apply("b", 1, gone)).applied
        both = [Community("c-a", 0, frozenset({"err_a_1", "err_b_2"})), Community("c-b", 0, frozenset({"err_b_2"}))]
        assert [c.id for c in await store.named(both)] == ["c-a", "c-b"]
        assert (await store.apply("b", 2, None)).applied  # b deleted: err_b_2 is named by no document
        assert [c.id for c in await store.named(both)] == ["c-a"]
    finally:
        await client.aclose()


@pytest.mark.parametrize(("older", "newer"), [(9, 10), (99, 100), (2**53, 2**53 + 1), (10**18, 9 * 10**18)])
async def test_versions_compare_as_numbers_not_strings(redis_url: str, older: int, newer: int) -> None:
    """A version with more digits is newer (``"10"`` sorts before ``"9"`` as a string), and two
    past 2**53 still differ (as doubles they would not): the newer one replaces the older,
    and the older one never comes back."""
    client = aredis.from_url(redis_url)
    store = GraphStore(client=client, name=unique("graph-versions"))
    old = Contribution(entities={"err_old_1": ("ERR_OLD_1", "error_code", ["d_p0"])}, edges={})
    new = Contribution(entities={"err_new_1": ("ERR_NEW_1", "error_code", ["d_p0"])}, edges={})
    try:
        assert (await store.apply("d", older, old)).applied
        assert (await store.apply("d", newer, new)).applied
        assert not (await store.apply("d", older, old)).applied  # a replay of the older one
        nodes, _ = await store.graph()
        assert set(nodes) == {"err_new_1"}
    finally:
        await client.aclose()


FILLER = "the team read the notes again and agreed to keep the plan simple while the work goes on " * 4


async def test_an_edit_re_extracts_and_marks_only_what_it_changed(stack: Stack) -> None:
    """Only an edit's changed chunks are extracted again; text that names no entity marks no
    community stale; a paragraph naming a new entity beside auth-service marks only the
    communities it joins (auth-service's), not those of the doc's other entities."""
    doc = "wiki/ops-overview.md"
    billing = "When billing-service returns HTTP 504, check pgbouncer first. " + FILLER
    search = "search-api returns HTTP 503 when es-node-3 drops out. " + FILLER
    await stack.put(doc, "\n\n".join([billing, FILLER + "quietly.", search]))
    await stack.graph.recompute(force=True)
    while await stack.graph.work_once():
        pass
    assert (await stack.store.stale())[0] == 0
    extracted = stack.graph.chunks_extracted

    await stack.put(doc, "\n\n".join([billing, FILLER + "slowly.", search]))
    assert stack.graph.chunks_extracted - extracted == 1
    assert (await stack.store.stale())[0] == 0

    auth = "Since v2 the auth-service also raises ERR_TOKEN_REVOKED_5 on logout. " + FILLER
    new_keys = set((await stack.graph.extract_chunks([[("x_p0", auth)]]))[0].entities)
    assert {"auth-service", "err_token_revoked_5"} <= new_keys
    await stack.put(doc, "\n\n".join([billing, FILLER + "slowly.", auth, search]))
    _, items = await stack.store.stale()
    comms = await stack.store.communities()
    joined = {c.id for c in comms if c.members & new_keys}
    others = {c.id for c in comms if c.members & {"billing-service", "search-api"}}
    assert joined and others and not joined & others
    assert {i.community_id for i in items} == joined


async def test_a_forgotten_turn_is_not_quoted_by_a_summary_once_the_forget_is_applied(
    redis_url: str, embedder: Any, ner: SpacyNer
) -> None:
    """An extractive summary quotes its members' passages. Once a forget (or a delete) is
    applied, the summaries of the communities it touched are withdrawn, chunk and record,
    not only marked stale: no query finds the forgotten words in one until it is rewritten
    from what is left, which then no longer holds them."""
    s = await make_stack(redis_url, embedder, ner, unique("forget-summary"))
    keys_ = IndexConfig().filter_keys
    secret = "Alice Johnson of Acme Corporation gave Bob Smith the vault code in Paris on Monday."
    kept = "Alice Johnson met Bob Smith in Paris."
    turns = [
        TranscriptEvent(event_id=f"t{n}", agent_id="a1", session_id=f"s{n}", turn=0, content=text).to_item(keys_)
        for n, text in enumerate([secret, kept])
    ]
    await s.ingestor.apply(turns)
    await s.graph.recompute(force=True)
    while await s.graph.work_once():
        pass
    quoting = [
        c.id
        for c in await s.store.communities()
        if "vault code" in ((await s.store.summaries.get(c.id)) or {}).get("text", "")
    ]
    assert quoting, "the summary quotes the turn"
    spec = SearchSpec(text="vault code Paris", top_k=10, kinds=("community",))
    assert any("vault code" in h.chunk.text for h in (await s.search.search(spec, "communities"))[0].hits)

    forget = ForgetEvent(event_id="f", op="forget", agent_id="a1", session_id="s0").to_item(keys_)
    assert not (await s.ingestor.apply([forget])).failed

    assert not any("vault code" in h.chunk.text for h in (await s.search.search(spec, "all"))[0].hits)
    for cid in quoting:
        assert await s.store.summaries.get(cid) is None and not await s.index.chunk_ids(COMMUNITY_PREFIX + cid)
        assert (await s.store.is_stale([cid]))[cid] is True  # queued to be written again
    while await s.graph.work_once():
        pass
    rewritten = [(await s.store.summaries.get(cid)) or {} for cid in quoting]
    assert any(r.get("text") for r in rewritten) and not any("vault code" in r.get("text", "") for r in rewritten)


#: A line of code that names what no sentence of the runbook below says anything of.
CODE_LINE = "    step {} sends the Globex Industries invoices to Tokyo for Acme Corporation"


def fenced_runbook() -> str:
    """A runbook whose code block is longer than a chunk, between two paragraphs of prose."""
    code = "\n".join(CODE_LINE.format(n) for n in range(80))
    return (
        "Alice Johnson of Acme Corporation runs the ledger service in Paris.\n\n"
        f"```\n{code}\n```\n\n"
        "Bob Smith reviewed the Paris ledger with Alice Johnson of Acme Corporation."
    )


async def test_a_summary_never_quotes_code_from_a_passage_cut_inside_a_fence(
    redis_url: str, embedder: Any, ner: SpacyNer
) -> None:
    """A code block longer than a chunk leaves chunks that start inside it, with no opening
    fence of their own: each is stored with its fence, and the extractive summary reads their
    code as code, not as sentences."""
    s = await make_stack(redis_url, embedder, ner, unique("fenced-summary"))
    # Globex Industries and Tokyo are named in the code alone: a summary covering them quotes it.
    await s.put("runbooks/ledger.md", fenced_runbook())
    ids = await s.index.chunk_ids("runbooks/ledger.md")
    read = await s.index.versioned_texts(ids)
    inside = [c for c, (text, _, fence) in read.items() if fence == "```"]
    assert len(ids) >= 3 and inside, read  # chunks cut from inside the block know it
    assert all("step" in read[c][0] for c in inside)
    await s.graph.recompute(force=True)
    while await s.graph.work_once():
        pass
    texts = [((await s.store.summaries.get(c.id)) or {}).get("text", "") for c in await s.store.communities()]
    assert any(texts), "communities were summarized"
    assert not any("Globex Industries invoices" in t for t in texts), texts


async def test_names_in_code_are_no_entities(redis_url: str, embedder: Any, ner: SpacyNer) -> None:
    """Names that only a code block holds (a diagram, a program's strings) give no entity,
    whether the chunk holds the block's opening fence or was cut from inside it; the prose
    around the block still gives its names."""
    s = await make_stack(redis_url, embedder, ner, unique("code-names"))
    await s.put("runbooks/ledger.md", fenced_runbook())
    read = await s.index.versioned_texts(await s.index.chunk_ids("runbooks/ledger.md"))
    assert any(fence for _, _, fence in read.values()), "no chunk was cut inside the block"
    names = {name for name, _ in (await s.store.graph())[0].values()}
    assert {"Alice Johnson", "Acme Corporation", "Paris", "Bob Smith"} <= names, names
    assert not {"Globex Industries", "Tokyo"} & names, names
    # A long transcript turn's code block too (a tool's output), cut into chunks as a document's.
    turn_code = "\n".join(CODE_LINE.format(n).replace("Tokyo", "Nairobi") for n in range(80))
    turn = MemoryItem(
        "upsert",
        "transcript:planner/s1/0",
        None,
        kind="transcript",
        content=f"Carol Danvers asked for the job:\n```\n{turn_code}\n```\nDana Scully checked it in Lisbon.",
        source="planner/s1",
    )
    await s.ingestor.apply([turn])
    assert len(await s.index.chunk_ids("transcript:planner/s1/0")) >= 3
    names = {name for name, _ in (await s.store.graph())[0].values()}
    assert {"Carol Danvers", "Dana Scully", "Lisbon"} <= names and "Nairobi" not in names, names
