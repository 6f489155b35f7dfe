"""The wire contract end to end: a plain aiokafka client, the real broker, the daemon, real Redis."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from daemon.instance import Daemon
from tests.conftest import unique
from tests.helpers import PlainClient, daemon_and_client, eventually, in_graph, isolated_settings, read_dlq

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def env(kafka_bootstrap: str, redis_url: str) -> AsyncIterator[tuple[Daemon, PlainClient]]:
    name = unique(__name__)
    settings = isolated_settings(name, kafka_bootstrap, redis_url)
    async with daemon_and_client(settings, f"{name}.my-replies") as (daemon, client):
        await daemon.index.drop()
        await daemon.index.ensure()
        yield daemon, client


def doc_event(doc_id: str, version: int, content: str, env: str, service: str) -> dict[str, Any]:
    return {
        "event_id": uuid.uuid4().hex,
        "op": "upsert",
        "doc_id": doc_id,
        "version": version,
        "source": doc_id,
        "content": content,
        "metadata": {"environment": env, "service": service},
        "timestamp": "2026-11-29T18:00:00Z",
    }


async def test_filtered_query_returns_only_matching_doc(env) -> None:
    """Three docs in; a production + billing-service query returns only the first, with the contract's shape."""
    daemon, client = env
    t = client.topics
    text = "HTTP 504 gateway timeout: postgres connection pool exhausted under load."
    await client.send(t.documents, doc_event("e2e/a.md", 1, text, "production", "billing-service"), key="e2e/a.md")
    await client.send(t.documents, doc_event("e2e/b.md", 1, text, "staging", "billing-service"), key="e2e/b.md")
    await client.send(t.documents, doc_event("e2e/c.md", 1, text, "production", "auth-service"), key="e2e/c.md")

    async def all_in() -> bool:
        return all([await daemon.index.chunk_ids(d) for d in ("e2e/a.md", "e2e/b.md", "e2e/c.md")])

    await eventually(all_in, what="three docs indexed")
    _headers, reply = await client.ask(
        {
            "query_id": "mem_req_99214",
            "search_text": "HTTP 504 gateway timeout postgres connection pool",
            "top_k": 5,
            "hybrid_params": {"dense_weight": 0.6, "sparse_weight": 0.4, "rrf_k_constant": 60},
            "metadata_filter": {"environment": "production", "service": "billing-service"},
        }
    )
    assert reply["query_id"] == "mem_req_99214"
    assert [r["doc_id"] for r in reply["results"]] == ["e2e/a.md"]
    assert reply["total_retrieved"] == len(reply["results"]) == 1
    (hit,) = reply["results"]
    assert hit["chunk_id"] == "e2e/a.md_p0" and hit["kind"] == "document" and hit["source"] == "e2e/a.md"
    assert hit["metadata"] == {"environment": "production", "service": "billing-service"}
    assert hit["rrf_score"] == pytest.approx(
        sum({"dense": 0.6, "sparse": 0.4, "identifier": 1.0}[k] / (60 + r) for k, r in hit["ranks"].items())
    )
    assert set(hit["ranks"]) == {"dense", "sparse", "identifier"}  # "504" is an identifier
    assert isinstance(reply["took_ms"], float)


async def test_versions_through_the_broker(env) -> None:
    """A new version replaces the text; a delete removes the doc; older versions after it change nothing."""
    daemon, client = env
    t, d = client.topics, "e2e/versioned.md"

    async def search(text: str) -> list[str]:
        _, reply = await client.ask(
            {"query_id": "v", "search_text": text, "top_k": 5, "metadata_filter": {"doc_id": d}}
        )
        return [r["text"] for r in reply["results"]]

    await client.send(t.documents, doc_event(d, 1, "Old text about walrus migrations.", "production", "s"), key=d)
    await eventually(lambda: _has(daemon, d), what="v1 indexed")
    await client.send(t.documents, doc_event(d, 2, "New text about narwhal rollouts.", "production", "s"), key=d)

    async def is_v2() -> bool:
        return await daemon.index.versions([d]) == {d: 2}

    await eventually(is_v2, what="v2 applied")
    assert await search("walrus narwhal") == ["New text about narwhal rollouts."]
    await client.send(t.documents, {"event_id": "x", "op": "delete", "doc_id": d, "version": 3}, key=d)
    await client.send(t.documents, doc_event(d, 1, "Old text about walrus migrations.", "production", "s"), key=d)
    await client.send(t.documents, doc_event(d, 2, "New text about narwhal rollouts.", "production", "s"), key=d)
    marker = "e2e/after-delete.md"
    await client.send(t.documents, doc_event(marker, 1, "marker", "production", "s"), key=d)  # same partition
    await eventually(lambda: _has(daemon, marker), what="events after the delete processed")
    assert await daemon.index.chunk_ids(d) == set()
    assert await daemon.index.versions([d]) == {d: 3}
    assert await search("walrus narwhal") == []


async def _has(daemon: Daemon, doc_id: str) -> bool:
    return bool(await daemon.index.chunk_ids(doc_id))


async def _stored_version(daemon: Daemon, doc_id: str, version: int) -> bool:
    return await daemon.index.versions([doc_id]) == {doc_id: version}


async def test_identifier_query_ranks_its_doc_first(env) -> None:
    """An identifier that occurs in one doc only comes back first."""
    daemon, client = env
    t = client.topics
    await client.send(
        t.documents,
        doc_event("e2e/id.md", 1, "Clients see ERR_CONN_RESET_4F2A after failover.", "production", "gateway"),
        key="e2e/id.md",
    )
    await client.send(
        t.documents,
        doc_event("e2e/id2.md", 1, "Clients see ERR_CONN_RESET_4F2B after deploys.", "production", "gateway"),
        key="e2e/id2.md",
    )
    # Keyed apart, the two docs may land on different partitions: wait for both.
    await eventually(lambda: _has(daemon, "e2e/id.md"), what="first identifier doc indexed")
    await eventually(lambda: _has(daemon, "e2e/id2.md"), what="identifier docs indexed")
    _, reply = await client.ask({"query_id": "id", "search_text": "ERR_CONN_RESET_4F2A", "top_k": 3})
    assert reply["results"][0]["doc_id"] == "e2e/id.md"


async def test_bad_events_go_to_dlq_and_the_partition_keeps_flowing(env) -> None:
    """Malformed and schema-invalid events land in the DLQ with a reason; later events are processed."""
    daemon, client = env
    t = client.topics
    dlq = AIOKafkaConsumer(
        t.dlq,
        bootstrap_servers=client.bootstrap,
        auto_offset_reset="earliest",
        group_id=unique("dlq-reader"),
        fetch_max_wait_ms=5,
    )
    await dlq.start()
    try:
        key = "e2e/same-key"
        await client.send(t.documents, b"{definitely not json", key=key)
        await client.send(
            t.documents, {"event_id": "e", "op": "upsert", "doc_id": "x", "version": "7", "content": "c"}, key=key
        )
        await client.send(t.documents, b"\xff\xfe\xfa", key=key)
        await client.send(t.documents, doc_event("e2e/after-bad.md", 1, "still flowing", "production", "s"), key=key)
        await eventually(lambda: _has(daemon, "e2e/after-bad.md"), what="event after bad ones processed")
        reasons: list[dict[str, Any]] = []
        deadline = time.monotonic() + 20
        while len(reasons) < 3 and time.monotonic() < deadline:
            for records in (await dlq.getmany(timeout_ms=200)).values():
                reasons += [json.loads(r.value) for r in records]
        assert len(reasons) == 3
        assert "Invalid JSON" in reasons[0]["reason"] and reasons[0]["original_text"] == "{definitely not json"
        assert "version" in reasons[1]["reason"]
        assert "UTF-8" in reasons[2]["reason"] and reasons[2]["original_text"] is None
        assert all(r["topic"] == t.documents and r["error_code"] == "invalid_event" for r in reasons)
        assert len({(r["partition"], r["offset"]) for r in reasons}) == 3
    finally:
        await dlq.stop()


@pytest.mark.parametrize(
    ("payload", "code", "qid"),
    [
        (b"{oops", "invalid_request", None),
        ({"query_id": "q-type", "search_text": "x", "top_k": "5"}, "invalid_request", "q-type"),
        ({"query_id": "q-zero", "search_text": "x", "top_k": 0}, "invalid_request", "q-zero"),
        ({"query_id": "q-big", "search_text": "x", "top_k": 10**6}, "invalid_request", "q-big"),
        ({"query_id": "q-key", "search_text": "x", "metadata_filter": {"tenant": "b"}}, "invalid_request", "q-key"),
        ({"search_text": "x"}, "invalid_request", None),
    ],
)
async def test_malformed_queries_get_error_replies(env, payload, code, qid) -> None:
    """Every bad request is answered with an error reply naming the problem, and the daemon keeps serving."""
    _, client = env
    _headers, reply = await client.ask(payload)
    assert reply["error"]["code"] == code and reply["error"]["message"]
    assert reply["query_id"] == qid
    _, ok = await client.ask({"query_id": "after", "search_text": "postgres", "top_k": 1})
    assert "results" in ok


async def test_reply_defaults_to_replies_topic_and_echoes_correlation_id(env) -> None:
    """Without reply_to, the reply goes to the configured replies topic with the same correlation_id."""
    _, client = env
    other = PlainClient(client.bootstrap, client.topics, client.topics.replies)
    await other.start()
    try:
        cid = uuid.uuid4().hex
        await other.send(
            client.topics.requests,
            {"query_id": "d", "search_text": "pool", "top_k": 1},
            headers=[("correlation_id", cid.encode())],
        )
        headers, reply = await other.reply(cid)
        assert headers["correlation_id"].decode() == cid and reply["query_id"] == "d"
    finally:
        await other.stop()


async def _replies_by_cid(bootstrap: str, topic: str, cids: set[str], timeout: float = 20.0) -> dict[str, Any]:
    """Every partition of ``topic`` read from the start: correlation_id -> [(partition, reply)]."""
    reader = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=5)
    await reader.start()
    found: dict[str, list[Any]] = {}
    try:
        deadline = time.monotonic() + timeout
        settle = None  # once all are in, read a little longer: a second reply would show
        while time.monotonic() < deadline and (settle is None or time.monotonic() < settle):
            for records in (await reader.getmany(timeout_ms=100)).values():
                for r in records:
                    cid = dict(r.headers).get("correlation_id", b"").decode()
                    if cid in cids:
                        found.setdefault(cid, []).append((r.partition, json.loads(r.value)))
            if settle is None and cids <= found.keys():
                settle = time.monotonic() + 1.0
    finally:
        await reader.stop()
    return found


async def test_reply_partition_header_routes_the_reply(env) -> None:
    """reply_partition puts the reply on that partition; garbage or a partition the topic lacks
    gets an error reply on the topic instead, and the asker's query is not answered."""
    _, client = env
    replies = client.topics.replies  # the daemon's own: 2 partitions in these tests
    cids = {name: uuid.uuid4().hex for name in ("p0", "p1", "garbage", "missing")}
    partition_header = {"p0": b"0", "p1": b"1", "garbage": b"1; drop", "missing": b"7"}
    for name, cid in cids.items():
        await client.send(
            client.topics.requests,
            {"query_id": name, "search_text": "pool", "top_k": 1},
            headers=[
                ("reply_to", replies.encode()),
                ("correlation_id", cid.encode()),
                ("reply_partition", partition_header[name]),
            ],
        )
    found = await _replies_by_cid(client.bootstrap, replies, set(cids.values()))
    assert all(len(found[cid]) == 1 for cid in cids.values()), found  # one reply each, no more
    one = {name: found[cid][0] for name, cid in cids.items()}
    assert one["p0"][0] == 0 and one["p1"][0] == 1
    assert "results" in one["p0"][1] and "results" in one["p1"][1]
    for name, why in (("garbage", "is not a partition number"), ("missing", "has 2 partition(s)")):
        error = one[name][1]["error"]
        assert error["code"] == "invalid_request" and why in error["message"], error


async def test_memory_client_reads_only_its_reply_partition(env) -> None:
    """The typed client with reply_partition asks for it and reads that partition alone."""
    from consumers.client import MemoryClient
    from memory.errors import NotFound

    _, client = env
    async with MemoryClient(bootstrap=client.bootstrap, topics=client.topics, reply_partition=1) as memory:
        for text in ("pool", "postgres timeout"):
            reply = await memory.query(text, top_k=1)
            assert reply.total_retrieved == len(reply.results)
        consumer = memory._transport._replies._consumer
        assert consumer is not None and {tp.partition for tp in consumer.assignment()} == {1}
    async with MemoryClient(bootstrap=client.bootstrap, topics=client.topics, reply_partition=5) as memory:
        with pytest.raises(NotFound, match="no partition 5"):
            await memory.query("pool")


async def test_transcript_is_searchable_and_filterable_by_agent(env) -> None:
    """An observation is indexed as kind=transcript and filterable by agent_id."""
    daemon, client = env
    t = client.topics
    for agent in ("planner-7", "coder-2"):
        await client.send(
            t.transcripts,
            {
                "event_id": uuid.uuid4().hex,
                "agent_id": agent,
                "session_id": "incident-4411",
                "turn": 12,
                "role": "assistant",
                "content": f"{agent} restarted pgbouncer to clear the stuck pool.",
                "timestamp": "2026-11-29T18:00:00Z",
                "metadata": {"environment": "production"},
            },
            key=f"{agent}/incident-4411",
        )
    await eventually(lambda: _has(daemon, "transcript:coder-2/incident-4411/12"), what="transcripts indexed")
    await eventually(lambda: _has(daemon, "transcript:planner-7/incident-4411/12"), what="transcripts indexed")
    _, reply = await client.ask(
        {
            "query_id": "tr",
            "search_text": "restarted pgbouncer",
            "top_k": 5,
            "metadata_filter": {"agent_id": "planner-7", "kind": "transcript"},
        }
    )
    assert [r["doc_id"] for r in reply["results"]] == ["transcript:planner-7/incident-4411/12"]
    meta = reply["results"][0]["metadata"]
    assert meta["role"] == "assistant" and meta["turn"] == 12 and meta["session_id"] == "incident-4411"


async def test_transcript_redelivery_is_idempotent(env) -> None:
    """The same (agent, session, turn) delivered twice leaves one set of chunks with the latest text."""
    daemon, client = env
    t = client.topics
    base = {"agent_id": "dup-agent", "session_id": "s", "turn": 1, "role": "user"}
    await client.send(
        t.transcripts, {**base, "event_id": "a", "content": "first copy about quokkas"}, key="dup-agent/s"
    )
    await client.send(
        t.transcripts, {**base, "event_id": "b", "content": "second copy about quokkas"}, key="dup-agent/s"
    )
    doc = "transcript:dup-agent/s/1"

    async def second_applied() -> bool:
        _, reply = await client.ask(
            {"query_id": "dup", "search_text": "quokkas", "top_k": 10, "metadata_filter": {"agent_id": "dup-agent"}}
        )
        return [r["text"] for r in reply["results"]] == ["second copy about quokkas"]

    await eventually(second_applied, what="redelivered turn overwrote, not duplicated")
    assert await daemon.index.chunk_ids(doc) == {f"{doc}_p0"}


async def test_forget_a_session_over_kafka_clears_its_turns_and_their_graph(env) -> None:
    """A forget on the transcripts topic, keyed as the session's turns: every turn of that
    session leaves the index and the graph; the agent's other session stays."""
    daemon, client = env
    t = client.topics

    def turn(session: str, n: int, text: str) -> dict[str, Any]:
        return {"event_id": uuid.uuid4().hex, "agent_id": "fz-agent", "session_id": session, "turn": n, "content": text}

    for session in ("s1", "s2"):
        for n in (1, 2):
            text = f"Session {session}: the ledger-service raised ERR_FZ_{session.upper()}_{n} on db-{n}.prod"
            await client.send(t.transcripts, turn(session, n, text), key=f"fz-agent/{session}")
    ids = {s: [f"transcript:fz-agent/{s}/{n}" for n in (1, 2)] for s in ("s1", "s2")}

    async def indexed_and_in_graph() -> bool:
        docs = [*ids["s1"], *ids["s2"]]
        return all([await _has(daemon, d) for d in docs]) and await in_graph(daemon, docs)

    await eventually(indexed_and_in_graph, timeout=60, what="turns indexed and in the graph")
    forget = {"event_id": uuid.uuid4().hex, "op": "forget", "agent_id": "fz-agent", "session_id": "s1"}
    await client.send(t.transcripts, forget, key="fz-agent/s1")

    async def forgotten() -> bool:
        assert daemon.graph is not None
        in_store = set(await daemon.graph.store("default").doc_ids())
        return not any([await _has(daemon, d) for d in ids["s1"]]) and not in_store & set(ids["s1"])

    await eventually(forgotten, timeout=60, what="session s1 forgotten in the index and the graph")
    assert all([await _has(daemon, d) for d in ids["s2"]]) and await in_graph(daemon, ids["s2"])
    _, reply = await client.ask({"query_id": "fz", "search_text": "ERR_FZ_S1_1 ledger-service", "top_k": 10})
    assert not {r["doc_id"] for r in reply["results"]} & set(ids["s1"]), reply


async def test_scope_communities_over_kafka(env) -> None:
    """scope=communities answers from community summaries written by the daemon's own worker."""
    daemon, client = env
    t = client.topics
    for i, text in enumerate(
        [
            "The ledger-service writes to ledger_entries; ERR_LEDGER_LOCK_9C1 means lock_timeout is too low.",
            "Incident: ledger-service hit ERR_LEDGER_LOCK_9C1 again; we raised lock_timeout on ledger_entries.",
        ]
    ):
        await client.send(t.documents, doc_event(f"e2e/ledger-{i}.md", 1, text, "production", "ledger-service"))
    await eventually(lambda: _has(daemon, "e2e/ledger-1.md"), what="ledger docs indexed")
    assert daemon.graph is not None
    await daemon.graph.service().recompute(force=True)

    reply: dict[str, Any] = {}

    async def summarized() -> bool:
        # Asked until answered: a claimed community leaves the queue before its summary is written.
        nonlocal reply
        if (await daemon.graph.store().stale())[0]:  # type: ignore[union-attr]
            return False
        _, reply = await client.ask(
            {"query_id": "comm", "search_text": "ledger lock timeouts", "top_k": 3, "scope": "communities"}
        )
        return bool(reply["results"])

    await eventually(summarized, timeout=60, what="the daemon's worker summarized every community")
    top = reply["results"][0]
    assert top["kind"] == "community" and "ERR_LEDGER_LOCK_9C1" in top["text"]
    assert top["community"]["member_count"] >= 2 and top["community"]["stale"] is False
    assert top["community"]["community_id"] == top["metadata"]["community_id"]
    _, bad = await client.ask({"query_id": "s", "search_text": "x", "scope": "everything"})
    assert bad["error"]["code"] == "invalid_request"


async def test_reply_to_an_input_or_a_missing_topic_gets_an_error_on_the_default_topic(env) -> None:
    """The daemon never publishes a reply into its own inputs, nor into a topic nobody created."""
    _, client = env
    replies = client.topics.replies
    missing = f"{replies}-nobody-made-{uuid.uuid4().hex[:8]}"
    cids = {name: uuid.uuid4().hex for name in ("input", "missing")}
    targets = {"input": client.topics.documents, "missing": missing}
    for name, cid in cids.items():
        await client.send(
            client.topics.requests,
            {"query_id": name, "search_text": "pool", "top_k": 1},
            headers=[("reply_to", targets[name].encode()), ("correlation_id", cid.encode())],
        )
    found = await _replies_by_cid(client.bootstrap, replies, set(cids.values()))
    for name, why in (("input", "input topics"), ("missing", "does not exist")):
        (only,) = found[cids[name]]
        error = only[1]["error"]
        assert error["code"] == "invalid_request" and why in error["message"], error
    admin = AIOKafkaAdminClient(bootstrap_servers=client.bootstrap)
    await admin.start()
    try:
        assert missing not in await admin.list_topics()  # not auto-created by a publish
    finally:
        await admin.close()


async def test_a_dead_letter_too_big_for_kafka_is_cut_and_the_partition_keeps_flowing(env) -> None:
    """A 600 KB invalid event makes a ~1.4 MB dead letter with both copies: it is cut to fit,
    published, and the next event on the key is applied (it used to redeliver forever)."""
    daemon, client = env
    t = client.topics
    key = f"e2e/big-{uuid.uuid4().hex[:6]}"
    big = {"event_id": "big", "op": "upsert", "doc_id": key, "version": "1", "content": "x" * 600_000}
    await client.send(t.documents, big, key=key)
    await client.send(t.documents, doc_event(f"{key}-after.md", 1, "after the big one", "production", "s"), key=key)
    await eventually(lambda: _has(daemon, f"{key}-after.md"), what="event after the big bad one processed")
    letters = [d for d in await read_dlq(client, want=10_000, timeout=5) if d["key"] == key]
    assert letters, "no dead letter for the big event"
    letter = letters[0]
    assert letter["original_text"] is None and letter["original_size"] > 600_000
    assert len(base64.b64decode(letter["original_b64"])) == letter["original_size"]
    assert not letter["original_truncated"] and letter["error_code"] == "invalid_event"


async def test_a_reply_too_big_for_kafka_drops_results_from_its_end(env) -> None:
    """A reply over the producer's 1 MiB limit could not be published, and its asker would hear
    nothing. Five hits carrying ~256 kB of metadata each: the reply keeps the best ones that
    fit and says truncated."""
    daemon, client = env
    docs = [f"e2e/bulky-{i}.md" for i in range(5)]
    for i, doc_id in enumerate(docs):
        event = doc_event(doc_id, 1, f"walrus ledger reconciliation notes, part {i}", "production", "bulky-svc")
        event["metadata"].update({f"k{j}": chr(ord("a") + i) * 4000 for j in range(60)})
        await client.send(client.topics.documents, event, key=doc_id)

    async def all_in() -> bool:
        return all([await daemon.index.chunk_ids(d) for d in docs])

    await eventually(all_in, what="five bulky docs indexed")
    _headers, reply = await client.ask(
        {
            "query_id": "bulky",
            "search_text": "walrus ledger reconciliation",
            "top_k": 5,
            "metadata_filter": {"service": "bulky-svc"},
        }
    )
    assert reply["truncated"] is True and 1 <= reply["total_retrieved"] == len(reply["results"]) < 5
    assert all(r["doc_id"] in docs for r in reply["results"])
    _headers, small = await client.ask({"query_id": "small", "search_text": "walrus ledger reconciliation", "top_k": 1})
    assert small["truncated"] is False and small["total_retrieved"] == 1


async def test_a_turn_is_not_held_behind_a_large_document(env) -> None:
    """The two ingest topics share the embedding worker's document pipe and the NER thread: a
    turn published while a large document is being embedded is searchable before the document
    (before: it waited for the whole document, ~5 minutes for the largest one allowed)."""
    daemon, client = env
    t = client.topics
    words = "the pool retries while a cache warms and every worker drains its queue before noon".split()
    # ~270 chunks, ~12 s to embed; every window its own text (a repeated one is embedded once).
    content = " ".join(words[(i * 7) % len(words)] + (f" n{i}" if i % 20 == 0 else "") for i in range(60_000))
    await client.send(t.documents, doc_event("large-manual", 1, content, "production", "docs"), key="large-manual")
    await asyncio.sleep(2)  # the daemon is into the document
    turn = {
        "event_id": uuid.uuid4().hex,
        "agent_id": "planner-9",
        "session_id": "s-large",
        "turn": 1,
        "role": "assistant",
        "content": "planner-9 noted the walrus ledger outage.",
        "timestamp": "2026-11-29T18:00:00Z",
        "metadata": {},
    }
    await client.send(t.transcripts, turn, key="planner-9/s-large")
    try:
        await eventually(lambda: _has(daemon, "transcript:planner-9/s-large/1"), timeout=90, what="the turn indexed")
        assert not await _has(daemon, "large-manual"), "the turn waited for the whole document"
        await eventually(lambda: _has(daemon, "large-manual"), timeout=180, what="the document indexed")
        # Written in slices (over 64 chunks): queries see it once the last one is in.
        await eventually(
            lambda: _stored_version(daemon, "large-manual", 1), timeout=60, what="the document's last slice"
        )
        _headers, reply = await client.ask(
            {
                "query_id": "q-large",
                "search_text": "every worker drains its queue",
                "top_k": 5,
                "metadata_filter": {"service": "docs"},
            }
        )
        assert len(reply["results"]) == 5 and {r["doc_id"] for r in reply["results"]} == {"large-manual"}
    finally:
        delete = {"event_id": uuid.uuid4().hex, "op": "delete", "doc_id": "large-manual", "version": 2}
        await client.send(t.documents, delete, key="large-manual")
