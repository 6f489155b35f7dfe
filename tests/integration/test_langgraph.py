"""The LangGraph store and the LangChain retriever against the real broker, daemon and Redis:
the same operations on ``MemoryStore`` and on LangGraph's own ``InMemoryStore`` give the same
items, a compiled ``StateGraph`` reads and writes the store (``invoke`` and ``ainvoke``), the
retriever runs inside a runnable chain, and the contract's ``list`` op that the store lists
namespaces with."""

from __future__ import annotations

import asyncio
import hashlib
import math
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

import pytest
from langchain_core.documents import Document
from langchain_core.runnables import RunnableLambda
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import BaseStore, GetOp, Item, PutOp
from langgraph.store.memory import InMemoryStore
from pydantic import ValidationError

from consumers.client import MemoryClient
from consumers.config import ConsumerConfig
from consumers.errors import QueryFailed
from consumers.langchain_retriever import MemoryRetriever
from consumers.langgraph_store import MemoryStore
from consumers.threaded_client import ThreadedClient
from daemon.settings import Settings
from memory.config import IndexConfig
from memory.errors import InvalidRequest
from tests.conftest import unique
from tests.helpers import daemon_and_client, isolated_settings, topic_tenancy_daemon

pytestmark = pytest.mark.integration

DIMS = 64


def _embed(texts: list[str]) -> list[list[float]]:
    """A deterministic bag-of-words embedding for InMemoryStore: shared words, close vectors."""
    out = []
    for text in texts:
        v = [0.0] * DIMS
        for word in "".join(c.lower() if c.isalnum() else " " for c in text).split():
            v[int(hashlib.sha1(word.encode()).hexdigest(), 16) % DIMS] += 1.0
        norm = math.sqrt(sum(x * x for x in v)) or 1.0
        out.append([x / norm for x in v])
    return out


@pytest.fixture(scope="module")
async def settings(kafka_bootstrap: str, redis_url: str) -> AsyncIterator[Settings]:
    s = isolated_settings(unique(__name__), kafka_bootstrap, redis_url)
    async with daemon_and_client(s):
        yield s


@pytest.fixture(scope="module")
async def threaded(settings: Settings) -> AsyncIterator[ThreadedClient]:
    # 60 s: one batch of 400 chunks to embed took over 20 s under the whole suite's load.
    client = ThreadedClient.connect(bootstrap=settings.kafka_bootstrap, topics=settings.topics, timeout_s=60)
    yield client
    await asyncio.to_thread(client.close)


def keyed(items: list[Any]) -> dict[tuple[tuple[str, ...], str], dict[str, Any]]:
    return {(i.namespace, i.key): i.value for i in items}


async def both(ours: MemoryStore, theirs: InMemoryStore, method: str, *args: Any, **kw: Any) -> tuple[Any, Any]:
    """One call on both stores, ours through its async API."""
    return await getattr(ours, f"a{method}")(*args, **kw), getattr(theirs, method)(*args, **kw)


async def test_side_by_side_with_in_memory_store(threaded: ThreadedClient) -> None:
    run = uuid.uuid4().hex[:6]
    ours, theirs = MemoryStore(threaded), InMemoryStore(index={"dims": DIMS, "embed": _embed})
    u1, u2, wiki = ("users", f"u1-{run}", "memories"), ("users", f"u2-{run}", "memories"), (f"wiki-{run}", "ops")
    items = [
        (u1, "pref", {"text": "Alice prefers dark mode in every editor", "kind": "preference", "priority": 3}),
        (u1, "pager", {"text": "Alice is on the ledger pager rotation on Mondays", "kind": "fact", "priority": 1}),
        (u2, "pref", {"text": "Bob writes tabs, never spaces", "kind": "preference", "priority": 2, "tags": ["style"]}),
        (
            wiki,
            "lock/9c1",  # a key with a slash: the doc id encodes it
            {"text": "Raise lock_timeout for ERR_LEDGER_LOCK_9C1", "environment": "production", "team": {"n": 7}},
        ),
    ]
    # Writes in one batch on ours (abatch), one by one on theirs: the same state either way.
    await ours.abatch([PutOp(ns, k, v) for ns, k, v in items])
    for ns, k, v in items:
        theirs.put(ns, k, v)

    for ns, k, v in items:
        a, b = await both(ours, theirs, "get", ns, k)
        assert isinstance(a, Item) and (a.namespace, a.key, a.value) == (b.namespace, b.key, b.value) == (ns, k, v)
    assert (await ours.aget(u1, "nope"), theirs.get(u1, "nope")) == (None, None)

    users = ("users",)
    for flt in (None, {"kind": "preference"}, {"priority": {"$gte": 2}}, {"tags": ["style"]}):
        a, b = await both(ours, theirs, "search", users, filter=flt, limit=10)
        assert keyed(a) == keyed(b) and len(a) == len(b), flt
    # A filter on a filterable key (environment) goes to the daemon; one on a nested field is applied after.
    for flt in ({"environment": "production"}, {"team": {"n": 7}}, {"environment": "staging"}):
        a, b = await both(ours, theirs, "search", (), filter=flt)
        assert keyed(a) == keyed(b), flt
    # Pages: the same sizes, and together every item once (the orders differ: see docs/langgraph.md).
    pages = [await ours.asearch(users, limit=2, offset=o) for o in (0, 2, 4)]
    theirs_pages = [theirs.search(users, limit=2, offset=o) for o in (0, 2, 4)]
    assert [len(p) for p in pages] == [len(p) for p in theirs_pages] == [2, 1, 0]
    assert keyed([i for p in pages for i in p]) == keyed(theirs.search(users))
    # A blank query (a node passing on empty user input) lists the prefix, as an empty one does.
    blank = await ours.asearch(users, query="   ")
    assert keyed(blank) == keyed(await ours.asearch(users, query="")) and blank

    # With a query: the same best item, and within the prefix the same set.
    for query, prefix in (("dark mode editor", users), ("ERR_LEDGER_LOCK_9C1 lock_timeout", ())):
        a, b = await both(ours, theirs, "search", prefix, query=query, limit=10)
        assert (a[0].namespace, a[0].key) == (b[0].namespace, b[0].key), query
        assert a[0].score is not None and all(x.score <= a[0].score for x in a)
    a, b = await both(ours, theirs, "search", users, query="who prefers what", limit=10)
    assert keyed(a) == keyed(b)
    a, b = await both(ours, theirs, "search", users, query="preferences", filter={"kind": "preference"})
    assert keyed(a) == keyed(b)
    a, b = await both(ours, theirs, "search", (), query="lock timeout", filter={"environment": "production"})
    assert keyed(a) == keyed(b) == {(wiki, "lock/9c1"): items[3][2]}

    mine = [ns for ns in theirs.list_namespaces() if run in "".join(ns)]
    assert [ns for ns in await ours.alist_namespaces() if run in "".join(ns)] == mine == sorted([u1, u2, wiki])
    for kw in (
        {"prefix": ("users",), "max_depth": 2},
        {"suffix": ("memories",), "limit": 1, "offset": 1},
        {"prefix": ("users", "*", "memories")},
    ):
        a, b = await both(ours, theirs, "list_namespaces", **kw)
        assert [ns for ns in a if run in "".join(ns)] == [ns for ns in b if run in "".join(ns)], kw

    # An update keeps created_at, moves updated_at; a delete removes it from get, search and listing.
    first = await ours.aget(u1, "pref")
    assert first is not None
    await asyncio.to_thread(ours.put, u1, "pref", {"text": "Alice now prefers light mode", "kind": "preference"})
    theirs.put(u1, "pref", {"text": "Alice now prefers light mode", "kind": "preference"})
    again = await asyncio.to_thread(ours.get, u1, "pref")  # the sync API, from a thread without a loop
    assert again is not None and again.value == theirs.get(u1, "pref").value  # type: ignore[union-attr]
    assert again.created_at == first.created_at and again.updated_at > first.updated_at
    await both(ours, theirs, "delete", u2, "pref")
    assert (await ours.aget(u2, "pref"), theirs.get(u2, "pref")) == (None, None)
    a, b = await both(ours, theirs, "search", users, filter={"kind": "preference"})
    assert keyed(a) == keyed(b) and len(a) == 1
    # Deviation: InMemoryStore keeps listing a namespace whose items are all deleted; ours lists
    # namespaces that hold items (as LangGraph's Postgres store does).
    assert u2 in theirs.list_namespaces(prefix=("users",))
    assert u2 not in await ours.alist_namespaces(prefix=("users",))


class State(TypedDict, total=False):
    user: str
    fact: str
    recalled: list[str]


def _graph(store: BaseStore, *, use_async: bool) -> Any:
    def remember(state: State, runtime: Runtime[None]) -> State:
        assert runtime.store is not None
        runtime.store.put(("users", state["user"], "facts"), uuid.uuid4().hex[:8], {"text": state["fact"]})
        return {}

    def recall(state: State, runtime: Runtime[None]) -> State:
        assert runtime.store is not None
        hits = runtime.store.search(("users", state["user"]), query=state["fact"], limit=5)
        return {"recalled": [h.value["text"] for h in hits]}

    async def aremember(state: State, runtime: Runtime[None]) -> State:
        assert runtime.store is not None
        await runtime.store.aput(("users", state["user"], "facts"), uuid.uuid4().hex[:8], {"text": state["fact"]})
        return {}

    async def arecall(state: State, runtime: Runtime[None]) -> State:
        assert runtime.store is not None
        hits = await runtime.store.asearch(("users", state["user"]), query=state["fact"], limit=5)
        return {"recalled": [h.value["text"] for h in hits]}

    builder = StateGraph(State)
    builder.add_node("remember", aremember if use_async else remember)  # type: ignore[arg-type]
    builder.add_node("recall", arecall if use_async else recall)  # type: ignore[arg-type]
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    return builder.compile(store=store)


async def test_a_compiled_graph_reads_and_writes_the_store(threaded: ThreadedClient) -> None:
    store = MemoryStore(threaded)
    user = f"graph-{uuid.uuid4().hex[:6]}"
    fact = "The quarterly ledger close runs on the 3rd business day."
    # Sync invoke (its nodes call the sync store API from LangGraph's worker threads).
    out = await asyncio.to_thread(_graph(store, use_async=False).invoke, {"user": user, "fact": fact})
    assert out["recalled"] == [fact]
    second = "Incident reviews happen every Thursday afternoon."
    out = await _graph(store, use_async=True).ainvoke({"user": user, "fact": second})
    assert out["recalled"][0] == second and set(out["recalled"]) == {fact, second}
    assert await store.alist_namespaces(prefix=("users", user)) == [("users", user, "facts")]


async def test_the_retriever_in_a_runnable_chain(settings: Settings, threaded: ThreadedClient) -> None:
    doc = f"lc/{uuid.uuid4().hex[:8]}.md"
    async with MemoryClient(bootstrap=settings.kafka_bootstrap, topics=settings.topics, timeout_s=20) as c:
        text = "Runbook: when ledger-service raises ERR_LEDGER_LOCK_4D2, raise lock_timeout to 30s."
        await c.publish_document(doc, text, metadata={"service": "ledger-service", "owner": "alice"}, wait=True)
    retriever = MemoryRetriever(client=threaded, top_k=3, metadata_filter={"service": "ledger-service"})
    chain = retriever | RunnableLambda(lambda docs: [(d.metadata["doc_id"], d) for d in docs])
    for got in (
        await chain.ainvoke("ERR_LEDGER_LOCK_4D2 lock timeout"),
        await asyncio.to_thread(chain.invoke, "ERR_LEDGER_LOCK_4D2 lock timeout"),
    ):
        assert got[0][0] == doc
        first: Document = got[0][1]
        assert first.page_content == text and first.id == f"{doc}_p0"
        assert first.metadata["owner"] == "alice" and first.metadata["service"] == "ledger-service"
        assert first.metadata["kind"] == "document" and first.metadata["score"] > 0
        assert "context" not in first.metadata


async def test_the_retriever_takes_a_time_window_and_refuses_what_it_does_not_know(
    settings: Settings, threaded: ThreadedClient
) -> None:
    """``since`` as an age keeps last week's note and drops last year's; a mistyped argument
    or a time it cannot read is an error when the retriever is built, not ignored."""
    run = uuid.uuid4().hex[:8]
    now = datetime.now(UTC)
    async with MemoryClient(bootstrap=settings.kafka_bootstrap, topics=settings.topics, timeout_s=20) as c:
        for doc, age in ((f"lc/{run}/old.md", timedelta(days=400)), (f"lc/{run}/new.md", timedelta(days=2))):
            text = f"Quokka rota {run}: who holds the pager this week."
            await c.publish_document(doc, text, source=f"lc/{run}/", timestamp=now - age, wait=True)
    recent = MemoryRetriever(client=threaded, top_k=5, since="7d", sparse_weight=1.0, identifier_weight=0.0)
    docs = await recent.ainvoke(f"quokka rota {run} pager")
    assert [d.metadata["doc_id"] for d in docs if run in d.metadata["doc_id"]] == [f"lc/{run}/new.md"]
    with pytest.raises(ValidationError, match="since takes an ISO 8601 time"):
        MemoryRetriever(client=threaded, since="last week")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        MemoryRetriever(client=threaded, sinse="7d")  # type: ignore[call-arg]


async def test_the_retriever_brings_the_turns_around_a_turn(settings: Settings, threaded: ThreadedClient) -> None:
    """context_turns: a conversation turn's Document carries the exchange around it."""
    agent = f"lc-{uuid.uuid4().hex[:6]}"
    said = ["Did the ledger close move?", "Yes, to the 3rd business day.", "Noted, thanks."]
    async with MemoryClient(bootstrap=settings.kafka_bootstrap, topics=settings.topics, timeout_s=20) as c:
        for turn, text in enumerate(said):
            await c.publish_observation(agent_id=agent, session_id="s", turn=turn, content=text, wait=True)
    retriever = MemoryRetriever(client=threaded, top_k=1, metadata_filter={"agent_id": agent}, context_turns=1)
    (doc,) = await retriever.ainvoke("the 3rd business day")
    assert doc.page_content == said[1]
    assert [t["text"] for t in doc.metadata["context"]] == [said[0], said[2]]


async def test_the_list_op(settings: Settings) -> None:
    """The contract's ``list``: distinct doc ids or sources under a source prefix, sorted, paged;
    a prefix holding quotes and backslashes is matched literally."""
    run = uuid.uuid4().hex[:6]
    odd = f'odd-{run}/a"b\\c/'
    async with MemoryClient(bootstrap=settings.kafka_bootstrap, topics=settings.topics, timeout_s=20) as c:
        await asyncio.gather(
            *(
                c.publish_document(doc, f"note {doc}", source=src, wait=True)
                for doc, src in (
                    (f"{run}-1", odd),
                    (f"{run}-2", odd),
                    (f"{run}-3", f'odd-{run}/a"b\\d/'),
                    (f"{run}-4", f"odd-{run}/ab/"),
                )
            )
        )
        assert (await c.list_values("doc_id", source_prefix=odd)).values == [f"{run}-1", f"{run}-2"]
        assert (await c.list_values("source", source_prefix=f"odd-{run}/")).values == sorted(
            [odd, f'odd-{run}/a"b\\d/', f"odd-{run}/ab/"]
        )
        page = await c.list_values("doc_id", source_prefix=f"odd-{run}/", limit=2, offset=2)
        assert page.values == [f"{run}-3", f"{run}-4"]
        await c.publish_observation(agent_id=f"odd-{run}", session_id="s", turn=0, content="a turn", wait=True)
        # Turns are no documents: their source (agent/session) is never listed.
        assert len((await c.list_values("source", source_prefix=f"odd-{run}")).values) == 3
        with pytest.raises(QueryFailed) as bad:
            await c.list_values("doc_id", limit=0)
        assert bad.value.error_code == "invalid_request"
        # Backslashes, a backslash before a quote, a line break: what RediSearch's expression
        # strings mangle (a prefix that widened, matched nothing, or failed as "unavailable").
        tricky = [f"odd-{run}/w\\\\x", f"odd-{run}/w\\x", f'odd-{run}/q\\"r', f"odd-{run}/n\nl"]
        await asyncio.gather(
            *(c.publish_document(f"{run}-t{i}", "a note", source=src, wait=True) for i, src in enumerate(tricky))
        )
        for i, src in enumerate(tricky):
            assert (await c.list_values("doc_id", source_prefix=src)).values == [f"{run}-t{i}"], src
        assert (await c.list_values("doc_id", source_prefix=f"odd-{run}/w\\\\")).values == [f"{run}-t0"]
        # Paged after the exact match (the prefix's backslash is matched here, not in Redis).
        assert (await c.list_values("doc_id", source_prefix=f"odd-{run}/w\\")).values == [f"{run}-t0", f"{run}-t1"]
        page = await c.list_values("doc_id", source_prefix=f"odd-{run}/w\\", limit=1, offset=1)
        assert page.values == [f"{run}-t1"]
        with pytest.raises(QueryFailed) as bad:
            await c.list_values("doc_id", offset=1_000_001)  # past what the search module pages
        assert bad.value.error_code == "invalid_request"


async def test_each_tenant_sees_its_own_items(kafka_bootstrap: str, redis_url: str) -> None:
    """The tenant is the store's setting: the same namespace and key in two tenants are two
    items, and neither's get, search or listing shows the other's."""
    name = unique(f"{__name__}.tenancy")
    async with topic_tenancy_daemon(name, kafka_bootstrap, redis_url, ("ta", "tb")) as (_d, _plain, settings):
        stores = {
            t: MemoryStore.connect(bootstrap=kafka_bootstrap, tenant=t, topics=settings.topics, timeout_s=20)
            for t in ("ta", "tb")
        }
        try:
            ns = ("shared", "notes")
            await asyncio.gather(*(s.aput(ns, "k", {"text": f"the launch code of {t}"}) for t, s in stores.items()))
            for t, store in stores.items():
                got = await store.aget(ns, "k")
                assert got is not None and got.value == {"text": f"the launch code of {t}"}
                hits = await store.asearch(("shared",), query="launch code")
                assert [h.value["text"] for h in hits] == [f"the launch code of {t}"]
                assert await store.alist_namespaces() == [ns]
            await stores["tb"].adelete(ns, "k")
            assert await stores["tb"].alist_namespaces() == [] and await stores["tb"].aget(ns, "k") is None
            assert await stores["ta"].aget(ns, "k") is not None
        finally:
            await asyncio.gather(*(asyncio.to_thread(s.close) for s in stores.values()))


async def test_values_that_fill_replies_come_whole(kafka_bootstrap: str, redis_url: str) -> None:
    """With replies of 64 KiB: a batch of values that fill several replies, and a value whose
    text and value together are larger than one, come back whole and each the one put."""
    name = unique(f"{__name__}.large")
    consumer = ConsumerConfig(group_id=name, reply_max_bytes=64 * 1024)
    settings = isolated_settings(name, kafka_bootstrap, redis_url, consumer=consumer)
    async with daemon_and_client(settings):
        store = MemoryStore.connect(bootstrap=kafka_bootstrap, topics=settings.topics, timeout_s=30)
        try:
            ns = ("large", uuid.uuid4().hex[:8])
            words = "the replica lag on shard é "
            values = {f"k{i}": {"text": f"note {i}: " + words * (300 + 1000 * (i == 3))} for i in range(12)}
            await asyncio.gather(*(store.aput(ns, k, v) for k, v in values.items()))
            got = await store.abatch([GetOp(ns, k) for k in values])
            assert [g.value if isinstance(g, Item) else None for g in got] == list(values.values())
            alone = await store.aget(ns, "k3")
            assert alone is not None and alone.value == values["k3"] and len(alone.value["text"]) > 30_000
        finally:
            await asyncio.to_thread(store.close)


async def test_a_sync_call_from_the_clients_own_loop_is_refused(threaded: ThreadedClient) -> None:
    """It would wait for itself for ever: refused at once instead."""

    async def nested(c: MemoryClient) -> object:
        return threaded.call(lambda c2: c2.get(["x"]))

    with pytest.raises(RuntimeError, match="own loop"):
        await threaded.acall(nested)


def _long_text(words: str, paragraphs: int, seed: str) -> str:
    return "\n\n".join(
        f"Paragraph {i} of {seed}: {words} came up again while the on-call engineer {seed} checked "
        f"pool {i}, replica {i * 7 % 13} and queue {i * 3 % 11} before the handover note."
        for i in range(paragraphs)
    )


async def test_a_negative_limit_or_offset_is_refused_before_anything_is_sent(threaded: ThreadedClient) -> None:
    """A search with a negative ``limit`` or ``offset`` raises ``InvalidRequest`` naming both."""
    store = MemoryStore(threaded)
    for kw in ({"limit": -1}, {"offset": -2}, {"offset": -1, "query": "anything"}):
        with pytest.raises(InvalidRequest, match="limit and offset must be >= 0"):
            await store.asearch(("any",), **kw)  # type: ignore[arg-type]
    # A query that is no string is the caller's mistake, said so, not an AttributeError.
    with pytest.raises(InvalidRequest, match="query takes a string, got int"):
        await store.asearch(("any",), query=123)  # type: ignore[arg-type]


async def test_a_query_search_fills_its_page_with_items_of_many_chunks(threaded: ThreadedClient) -> None:
    """Items of several chunks each still fill a query search's page: each counts once, and
    the store asks for more chunks while fewer items than asked came back."""
    store, ns = MemoryStore(threaded), ("long", uuid.uuid4().hex[:6])
    await store.abatch(
        [PutOp(ns, f"k{i}", {"text": _long_text("the saffron ledger outage", 40, f"eng{i}")}) for i in range(10)]
    )
    found = await store.asearch(ns, query="saffron ledger outage", limit=10)
    assert sorted(i.key for i in found) == [f"k{i}" for i in range(10)]


async def test_a_get_during_a_sliced_overwrite_finds_the_item(
    kafka_bootstrap: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a large item's new version is written in slices (the daemon answers ``writing``),
    ``get`` waits for it instead of answering None, and the overwrite keeps ``created_at``."""
    seen: list[str] = []
    original = MemoryClient.get

    async def recording(self: MemoryClient, *args: Any, **kw: Any) -> Any:
        reply = await original(self, *args, **kw)
        seen.extend(i.status for i in reply.items)
        return reply

    monkeypatch.setattr(MemoryClient, "get", recording)
    name = unique("lg-sliced")
    # Slices of 4 chunks: a write of some 30 chunks takes several transactions.
    s = isolated_settings(name, kafka_bootstrap, redis_url, index=IndexConfig(name=name, write_slice_chunks=4))
    async with daemon_and_client(s):
        client = ThreadedClient.connect(bootstrap=s.kafka_bootstrap, topics=s.topics, timeout_s=20)
        try:
            store, ns = MemoryStore(client), ("big", "runbook")
            await store.aput(ns, "doc", {"text": _long_text("a large runbook", 90, "v0")})
            first = await store.aget(ns, "doc")
            assert first is not None
            for version in range(1, 6):  # until the daemon has once answered `writing` to a get
                text = _long_text("a large runbook", 90, f"v{version}")
                put = asyncio.create_task(store.aput(ns, "doc", {"text": text}))
                while not put.done():
                    item = await store.aget(ns, "doc")
                    assert item is not None and item.created_at == first.created_at
                await put
                if "writing" in seen:
                    break
            assert "writing" in seen, "no get met a write in slices: the test did not exercise the wait"
            last = await store.aget(ns, "doc")
            assert last is not None and last.value["text"] == text and last.created_at == first.created_at
        finally:
            await asyncio.to_thread(client.close)


async def test_a_store_with_a_recency_weight_puts_the_newer_of_two_facts_first(threaded: ThreadedClient) -> None:
    """Two facts of one user under uuid keys, as langgraph.md's example stores them: the later
    ("started eating fish again") comes first with the store's recency weight, whatever their
    scores for the question."""
    ns = ("users", f"u-{uuid.uuid4().hex[:6]}", "facts")
    newest = MemoryStore(threaded, recency_weight=5.0)
    await newest.aput(ns, str(uuid.uuid4()), {"text": "Ana is vegetarian and never eats fish."})
    await newest.aput(ns, str(uuid.uuid4()), {"text": "Ana started eating fish again last month."})
    found = await newest.asearch(ns, query="Does Ana eat fish?", limit=2)
    assert [i.value["text"] for i in found] == [
        "Ana started eating fish again last month.",
        "Ana is vegetarian and never eats fish.",
    ]
    with pytest.raises(ValueError, match="recency_weight"):
        MemoryStore(threaded, recency_weight=-1.0)


class Home(TypedDict, total=False):
    user: str
    city: str
    before: list[str]


async def test_a_graph_keeps_a_fact_current_and_reads_what_it_said_before(threaded: ThreadedClient) -> None:
    """A fact kept under one key, as docs/conversation.md says: each put replaces it, and the
    store's ``history`` (read by a graph node) gives the values it held before, newest first."""
    store = MemoryStore(threaded)

    async def move(state: Home, runtime: Runtime[None]) -> Home:
        assert runtime.store is not None
        await runtime.store.aput(("users", state["user"]), "home_city", {"city": state["city"]})
        assert isinstance(runtime.store, MemoryStore)
        earlier = await runtime.store.ahistory(("users", state["user"]), "home_city")
        return {"before": [i.value["city"] for i in earlier]}

    builder = StateGraph(Home)
    builder.add_node("move", move)  # type: ignore[arg-type]
    builder.add_edge(START, "move")
    builder.add_edge("move", END)
    graph = builder.compile(store=store)
    user = f"home-{uuid.uuid4().hex[:6]}"
    assert (await graph.ainvoke({"user": user, "city": "Paris"}))["before"] == []
    assert (await graph.ainvoke({"user": user, "city": "Lisbon"}))["before"] == ["Paris"]
    assert (await graph.ainvoke({"user": user, "city": "Berlin"}))["before"] == ["Lisbon", "Paris"]
    current = await store.aget(("users", user), "home_city")
    earlier = await asyncio.to_thread(store.history, ("users", user), "home_city")
    assert current is not None and current.value == {"city": "Berlin"}
    assert [(i.namespace, i.key, i.value["city"]) for i in earlier] == [
        (("users", user), "home_city", "Lisbon"),
        (("users", user), "home_city", "Paris"),
    ]
    # Each held from its own put until the next one.
    assert earlier[1].until == earlier[0].updated_at and earlier[0].until == current.updated_at
    # A put of the same value is no change: the history stays, and says when Berlin began.
    await store.aput(("users", user), "home_city", {"city": "Berlin"})
    again = await store.ahistory(("users", user), "home_city")
    assert [(i.value["city"], i.until) for i in again] == [(i.value["city"], i.until) for i in earlier]
    assert again[0].dict()["until"] == earlier[0].until.isoformat()
    await store.adelete(("users", user), "home_city")
    assert await store.ahistory(("users", user), "home_city") == []


async def test_a_repeated_text_folds_into_its_first_result_except_in_the_store(
    settings: Settings, threaded: ThreadedClient
) -> None:
    """The same observation written three times (case and spacing aside) is one result listing
    the other two, and the next memory takes the places they would have held; asked with
    ``fold_repeats=False`` each is its own result. The LangGraph store never folds: two keys
    holding the same value are two items."""
    agent = f"rep-{uuid.uuid4().hex[:6]}"
    same = ["Nightly build failed on test_ledger_close.", "nightly build  failed on test_ledger_close.\n"]
    async with MemoryClient(bootstrap=settings.kafka_bootstrap, topics=settings.topics, timeout_s=20) as c:
        for day in range(3):
            await c.publish_observation(
                agent_id=agent, session_id=f"day{day}", turn=0, content=same[day % 2], wait=True,
                timestamp=datetime(2026, 11, 10 + day, 6, tzinfo=UTC),
            )  # fmt: skip
        await c.publish_observation(
            agent_id=agent, session_id="day3", turn=0, content="Nightly build passed after the ledger fix.", wait=True
        )
        folded = await c.query("nightly build test_ledger_close", top_k=2, metadata_filter={"agent_id": agent})
        whole = await c.query(
            "nightly build test_ledger_close", top_k=4, metadata_filter={"agent_id": agent}, fold_repeats=False
        )
    first, second = folded.results
    assert "failed" in first.text and "passed" in second.text
    assert first.repeats is not None and second.repeats is None
    assert {r.doc_id for r in first.repeats} | {first.doc_id} == {f"transcript:{agent}/day{d}/0" for d in range(3)}
    assert all(r.timestamp and r.timestamp.startswith("2026-11-1") for r in first.repeats)
    assert len(whole.results) == 4 and all(r.repeats is None for r in whole.results)

    retriever = MemoryRetriever(client=threaded, top_k=2, metadata_filter={"agent_id": agent})
    docs = await retriever.ainvoke("nightly build test_ledger_close")
    assert len(docs[0].metadata["repeats"]) == 2 and "repeats" not in docs[1].metadata

    store, ns = MemoryStore(threaded), ("rep", agent)
    await store.abatch([PutOp(ns, key, {"text": "Ship the ledger fix on Friday."}) for key in ("a", "b")])
    found = await store.asearch(ns, query="when does the ledger fix ship", limit=5)
    assert sorted(i.key for i in found) == ["a", "b"]


async def test_a_filter_key_the_daemon_does_not_filter_on_names_the_setting_to_change(
    threaded: ThreadedClient,
) -> None:
    """The first filtered search with such a key fails: the error says it is the store's
    filter_keys, and what to do, in one InvalidRequest (it was the daemon's reply alone)."""
    store, ns = MemoryStore(threaded, filter_keys=("env",)), ("fk", uuid.uuid4().hex[:6])
    await store.aput(ns, "a", {"text": "deploys go to eu-west-1", "env": "prod"})
    for query in ("where do deploys go", None):
        with pytest.raises(InvalidRequest, match=r"filter_keys name 'env', which the daemon does not filter on"):
            await store.asearch(ns, query=query, filter={"env": "prod"})
    assert [i.key for i in await store.asearch(ns, query="where do deploys go")] == ["a"]  # unfiltered: fine


async def test_a_store_never_closed_closes_at_exit_without_warnings(settings: Settings) -> None:
    """A program that ends without ``store.close()`` closes its connection on the way out: no
    "Unclosed AIOKafkaProducer" nor "Task was destroyed" on its stderr."""
    import subprocess
    import sys

    program = (
        "import sys\n"
        "from consumers.langgraph_store import MemoryStore\n"
        "from consumers.config import Topics\n"
        f"topics = Topics.model_validate_json({settings.topics.model_dump_json()!r})\n"
        f"store = MemoryStore.connect(bootstrap={settings.kafka_bootstrap!r}, topics=topics, timeout_s=60)\n"
        "store.put(('exit',), 'k', {'text': 'written before an exit without close'})\n"
        "print(store.get(('exit',), 'k').value['text'])\n"
    )
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "written before an exit without close", done
    assert "Unclosed" not in done.stderr and "Task was destroyed" not in done.stderr, done.stderr
