"""Bad input, table-driven, through the real broker: every case gets a DLQ record or an error
reply with a clear reason, the daemon stays up, and later events in the same partition flow.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from consumers.ingestion import Ingestion
from daemon.instance import Daemon
from memory.config import IngestConfig
from memory.errors import BackendUnavailable
from tests.conftest import unique
from tests.helpers import PlainClient, daemon_and_client, eventually, isolated_settings, read_dlq

pytestmark = pytest.mark.integration

LIMIT = 2048


DOC: dict[str, Any] = {"event_id": "e", "op": "upsert", "doc_id": "bad/x.md", "version": 1, "content": "fine"}
TURN: dict[str, Any] = {"event_id": "e", "agent_id": "a", "session_id": "s", "turn": 1, "content": "fine"}


def _event(base: dict[str, Any], over: dict[str, Any]) -> bytes:
    """``base`` with ``over`` applied; a value of ``...`` removes the field."""
    merged = {**base, **over}
    return json.dumps({k: v for k, v in merged.items() if v is not ...}).encode()


def doc(**over: Any) -> bytes:
    return _event(DOC, over)


def turn(**over: Any) -> bytes:
    return _event(TURN, over)


# (name, topic kind, raw bytes, headers, fragment expected in the DLQ reason)
EVENT_CASES: list[tuple[str, str, bytes, list[tuple[str, bytes]], str]] = [
    ("invalid json", "documents", b"{nope", [], "Invalid JSON"),
    ("invalid utf-8", "documents", b"\xc3\x28\xa0\xa1", [], "UTF-8"),
    ("empty body", "documents", b"", [], "empty message body"),
    ("json array", "documents", b"[1,2,3]", [], "object"),
    ("json string", "documents", b'"upsert"', [], "object"),
    ("version as string", "documents", doc(version="1"), [], "version"),
    ("negative version", "documents", doc(version=-5), [], "version"),
    ("absurd version", "documents", doc(version=10**30), [], "version"),
    ("float version", "documents", doc(version=1.5), [], "version"),
    ("unknown op", "documents", doc(op="merge"), [], "op"),
    ("missing doc_id", "documents", doc(doc_id=...), [], "doc_id"),
    ("empty doc_id", "documents", doc(doc_id=""), [], "doc_id"),
    ("huge doc_id", "documents", doc(doc_id="d" * 5000), [], "doc_id"),
    ("missing version", "documents", doc(version=...), [], "version"),
    ("missing event_id", "documents", doc(event_id=...), [], "event_id"),
    ("empty content", "documents", doc(content=""), [], "content is empty"),
    ("blank content", "documents", doc(content=" \n\t "), [], "content is empty"),
    ("upsert without content", "documents", doc(content=...), [], "needs content"),
    ("content without a token", "documents", doc(content="\u200b\ufeff\u200b"), [], "no tokens"),
    ("content is a number", "documents", doc(content=42), [], "content"),
    ("content over the limit", "documents", doc(content="x" * (LIMIT + 10)), [], f"larger than {LIMIT}"),
    ("nested metadata", "documents", doc(metadata={"a": {"b": 1}}), [], "metadata"),
    ("list metadata value", "documents", doc(metadata={"a": [1]}), [], "metadata"),
    ("metadata not an object", "documents", doc(metadata="prod"), [], "metadata"),
    ("too many metadata keys", "documents", doc(metadata={f"k{i}": i for i in range(100)}), [], "64 keys"),
    ("garbage timestamp", "documents", doc(timestamp="last tuesday"), [], "timestamp"),
    ("negative turn", "transcripts", turn(turn=-1), [], "turn"),
    ("a turn sent as a delete", "transcripts", turn(op="delete"), [], "unknown op 'delete' on the transcripts topic"),
    (
        "a turn's forget without its session",
        "transcripts",
        turn(op="forget", session_id=..., content=..., all_sessions=True),
        [],
        "a forget of one turn names its session_id too",
    ),
    ("turn as string", "transcripts", turn(turn="1"), [], "turn"),
    ("missing agent_id", "transcripts", turn(agent_id=...), [], "agent_id"),
    ("empty transcript content", "transcripts", turn(content=""), [], "content is empty"),
    ("transcript content over the limit", "transcripts", turn(content="y" * (LIMIT + 10)), [], f"larger than {LIMIT}"),
    ("transcript content without a token", "transcripts", turn(content="\u200b\u200b"), [], "no tokens"),
    ("transcript content is a number", "transcripts", turn(content=7), [], "content"),
    ("session_id as a list", "transcripts", turn(session_id=["s"]), [], "session_id"),
    ("garbage headers, bad body", "documents", b"{", [("x", b"\xff\xfe"), ("reply_to", b"\x00")], "Invalid JSON"),
]

# (name, request bytes, headers override or None, expected error-code fragment)
QUERY_CASES: list[tuple[str, bytes, str]] = [
    ("malformed json", b"{oops", "Invalid JSON"),
    ("invalid utf-8", b"\xff\xff", "UTF-8"),
    ("top_k zero", b'{"query_id": "q", "search_text": "x", "top_k": 0}', "top_k"),
    ("top_k a million", b'{"query_id": "q", "search_text": "x", "top_k": 1000000}', "top_k"),
    ("top_k as string", b'{"query_id": "q", "search_text": "x", "top_k": "5"}', "top_k"),
    (
        "number filter value",
        b'{"query_id": "q", "search_text": "x", "metadata_filter": {"service": 5}}',
        "metadata_filter",
    ),
    (
        "nested filter value",
        b'{"query_id": "q", "search_text": "x", "metadata_filter": {"service": {"$ne": 1}}}',
        "metadata_filter",
    ),
    (
        "unknown filter key",
        b'{"query_id": "q", "search_text": "x", "metadata_filter": {"tenant": "b"}}',
        "unknown metadata_filter key",
    ),
    ("empty search_text", b'{"query_id": "q", "search_text": ""}', "search_text"),
    ("blank search_text", b'{"query_id": "q", "search_text": "   "}', "search_text is empty"),
    (
        "negative weight",
        b'{"query_id": "q", "search_text": "x", "hybrid_params": {"dense_weight": -1}}',
        "dense_weight",
    ),
    (
        "both weights zero",
        b'{"query_id": "q", "search_text": "x", "hybrid_params": {"dense_weight": 0, "sparse_weight": 0}}',
        "at least one",
    ),
    ("unknown scope", b'{"query_id": "q", "search_text": "x", "scope": "everything"}', "scope"),
    ("scope as a list", b'{"query_id": "q", "search_text": "x", "scope": ["chunks"]}', "scope"),
    ("deeply nested json", b'{"query_id": "q", "search_text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "recursion"),
    ("missing query_id", b'{"search_text": "x"}', "query_id"),
    ("unknown field", b'{"query_id": "q", "search_text": "x", "filters": {}}', "filters"),
]


@pytest.fixture(scope="module")
async def env(kafka_bootstrap: str, redis_url: str) -> AsyncIterator[tuple[Daemon, PlainClient]]:
    name = unique(__name__)
    settings = isolated_settings(
        name, kafka_bootstrap, redis_url, ingest=IngestConfig(max_content_bytes=LIMIT, max_attempts=2)
    )
    async with daemon_and_client(settings, f"{name}.my-replies") as (daemon, client):
        yield daemon, client


async def test_every_bad_event_is_dead_lettered_and_the_partition_flows(env) -> None:
    """Every bad event on one key (one partition) is dead-lettered with its reason, under the
    original Kafka key; the next good event applies."""
    daemon, client = env
    assert len(EVENT_CASES) >= 35  # as many as docs/reliability.md says
    for _name, kind, raw, headers, _ in EVENT_CASES:
        topic = client.topics.documents if kind == "documents" else client.topics.transcripts
        await client.producer.send_and_wait(topic, raw, key=b"same-key", headers=headers)
    await client.send(
        client.topics.documents, json.loads(doc(doc_id="bad/after.md", content="still flowing")), key="same-key"
    )
    await client.send(
        client.topics.transcripts, json.loads(turn(agent_id="after", content="still flowing")), key="same-key"
    )

    async def good_applied() -> bool:
        return bool(await daemon.index.chunk_ids("bad/after.md")) and bool(
            await daemon.index.chunk_ids("transcript:after/s/1")
        )

    await eventually(good_applied, what="good events after the bad ones")
    dead = await read_dlq(client, len(EVENT_CASES))
    assert len(dead) == len(EVENT_CASES)
    by_text = {}
    for d in dead:
        by_text.setdefault(d["original_b64"], []).append(d)
    import base64

    for name, _kind, raw, _, fragment in EVENT_CASES:
        records = by_text.get(base64.b64encode(raw).decode())
        assert records, f"no DLQ record for {name}"
        assert any(fragment in r["reason"] for r in records), (name, [r["reason"] for r in records])
        assert all(r["error_code"] == "invalid_event" for r in records)
        assert all(r["_kafka_key_hex"] == b"same-key".hex() and r["key"] == "same-key" for r in records), name
    assert await daemon.index.chunk_ids("bad/x.md") == set()  # no bad upsert slipped through


async def test_a_bad_turn_is_dead_lettered_and_its_session_flows_on(env) -> None:
    """Bad turns in the middle of a session are dead-lettered with their reasons; the turns after them are
    indexed, with the good turns before as their context and nothing of the bad ones."""
    daemon, client = env
    key = "flow-agent/chat"

    def good(n: int, text: str) -> dict[str, Any]:
        return {"event_id": f"flow-{n}", "agent_id": "flow-agent", "session_id": "chat", "turn": n, "content": text}

    for n, text in ((1, "Melanie: the pottery class starts in June"), (2, "Caroline: I signed up for it")):
        await client.send(client.topics.transcripts, good(n, text), key=key)
    bad = [
        json.dumps({**good(3, ""), "event_id": "flow-bad-empty"}).encode(),
        json.dumps({**good(3, "z" * (LIMIT + 10)), "event_id": "flow-bad-huge"}).encode(),
        json.dumps({**good(3, "fine"), "turn": "three", "event_id": "flow-bad-type"}).encode(),
    ]
    for raw in bad:
        await client.producer.send_and_wait(client.topics.transcripts, raw, key=key.encode())
    await client.send(client.topics.transcripts, good(4, "Melanie: see you there"), key=key)

    async def flowed() -> bool:
        return bool(await daemon.index.chunk_ids("transcript:flow-agent/chat/4"))

    await eventually(flowed, what="the turn after the bad ones")
    assert not await daemon.index.chunk_ids("transcript:flow-agent/chat/3")
    [entry] = (await daemon.index.turn_entries(["transcript:flow-agent/chat/4"]))["transcript:flow-agent/chat/4"]
    assert "pottery class" in entry.context and "zzz" not in entry.context
    import base64

    mine = {base64.b64encode(raw).decode() for raw in bad}
    deadline = time.monotonic() + 30
    while len(dead := [d for d in await read_dlq(client, 10**6, timeout=2) if d["original_b64"] in mine]) < 3:
        assert time.monotonic() < deadline, dead
    reasons = " | ".join(sorted(d["reason"] for d in dead))
    assert "content is empty" in reasons and f"larger than {LIMIT}" in reasons and "turn" in reasons, reasons


@pytest.mark.parametrize(("name", "raw", "fragment"), QUERY_CASES, ids=[c[0] for c in QUERY_CASES])
async def test_bad_queries_get_error_replies(env, name: str, raw: bytes, fragment: str) -> None:
    """Each bad request is answered with invalid_request and a message naming the problem."""
    _, client = env
    _, reply = await client.ask(raw)
    assert reply["error"]["code"] == "invalid_request", reply
    assert fragment in reply["error"]["message"], reply


async def test_syntax_attacks_stay_inside_the_filter(env) -> None:
    """RediSearch syntax in search_text or filter values never widens the filter."""
    daemon, client = env
    for i, svc in enumerate(["billing-service", "auth-service"]):
        await client.send(
            client.topics.documents,
            json.loads(doc(doc_id=f"atk/{i}", content=f"{svc} pool timeout", metadata={"service": svc})),
        )
    await eventually(lambda: _has(daemon, "atk/1"), what="attack corpus indexed")
    for text in ["@service:{auth\\-service} | *", "* -foo", '"pool" | (timeout) ~x', "}{)(][|@*%$"]:
        _, reply = await client.ask(
            {"query_id": "a", "search_text": text, "top_k": 10, "metadata_filter": {"service": "billing-service"}}
        )
        assert "results" in reply, reply
        assert {r["metadata"].get("service") for r in reply["results"]} <= {"billing-service"}
    for value in ["billing-service} | @service:{auth-service", "*", "auth\\-service"]:
        _, reply = await client.ask(
            {"query_id": "b", "search_text": "pool timeout", "top_k": 10, "metadata_filter": {"service": value}}
        )
        assert reply["results"] == [], (value, reply)
    _, reply = await client.ask({"query_id": "death", "search_text": "(is|an|hip)", "top_k": 3})
    assert "results" in reply
    await daemon.index.ping()


async def _has(daemon: Daemon, doc_id: str) -> bool:
    return bool(await daemon.index.chunk_ids(doc_id))


async def test_missing_and_garbage_headers(env) -> None:
    """No headers: reply on the default topic. A garbage reply_to: an error reply there, never a
    crash. A correlation_id that is not UTF-8: answered, with U+FFFD for the bad bytes."""
    _, client = env
    other = PlainClient(client.bootstrap, client.topics, client.topics.replies)
    await other.start()
    try:
        await other.send(client.topics.requests, {"query_id": "nohdr", "search_text": "pool", "top_k": 1})
        cid = uuid.uuid4().hex
        await other.send(
            client.topics.requests,
            {"query_id": "garbage", "search_text": "pool"},
            headers=[("reply_to", b"\xff\xfe bad topic!"), ("correlation_id", cid.encode())],
        )
        _, reply = await other.reply(cid)
        assert reply["error"]["code"] == "invalid_request" and "reply_to" in reply["error"]["message"]
        # A correlation_id that is not UTF-8 comes back with U+FFFD for its bad byte.
        cid = uuid.uuid4().hex
        await other.send(
            client.topics.requests,
            {"query_id": "binary-cid", "search_text": "pool", "top_k": 1},
            headers=[("reply_to", client.topics.replies.encode()), ("correlation_id", b"\xff" + cid.encode())],
        )
        _, binary = await other.reply("\ufffd" + cid)
        assert binary["query_id"] == "binary-cid" and "results" in binary
        _, ok = await client.ask({"query_id": "alive", "search_text": "pool", "top_k": 1})
        assert "results" in ok
    finally:
        await other.stop()


async def test_poison_event_is_dead_lettered_after_max_attempts(env) -> None:
    """An event whose handling keeps failing goes to the DLQ after max_attempts; its neighbours are applied."""
    daemon, client = env
    original = daemon.ingestor.apply
    pill_calls: list[float] = []

    async def buggy(items):  # a bug that only this document triggers
        if any(i.doc_id == "poison/pill.md" for i in items):
            pill_calls.append(time.monotonic())
            raise RuntimeError("boom: unexpected bug")
        return await original(items)

    daemon.ingestor.apply = buggy  # type: ignore[method-assign]
    try:
        key = "poison-key"
        await client.send(
            client.topics.documents, json.loads(doc(doc_id="poison/before.md", content="before")), key=key
        )
        await client.send(client.topics.documents, json.loads(doc(doc_id="poison/pill.md", content="pill")), key=key)
        await client.send(client.topics.documents, json.loads(doc(doc_id="poison/after.md", content="after")), key=key)
        await eventually(lambda: _has(daemon, "poison/after.md"), timeout=60, what="events after the poison one")
        assert await _has(daemon, "poison/before.md") and not await _has(daemon, "poison/pill.md")
        dead = [d for d in await read_dlq(client, len(EVENT_CASES) + 1) if d["error_code"] == "poison"]
        assert len(dead) == 1 and dead[0]["attempts"] == 2 and "boom: unexpected bug" in dead[0]["reason"]
        # the failed attempt was backed off (retry_initial_s, 0.2 s) before the redelivery
        gaps = [b - a for a, b in itertools.pairwise(pill_calls)]
        assert max(gaps) >= 0.2, gaps
    finally:
        daemon.ingestor.apply = original  # type: ignore[method-assign]


async def test_a_redelivered_batch_does_not_dead_letter_twice(env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch that fails right after its dead letter went out is redelivered whole: its bad
    event reaches the DLQ once, not once per delivery, and the good event behind it is applied."""
    daemon, client = env
    mark = uuid.uuid4().hex
    original = Ingestion._publish_dead
    deliveries = 0

    async def failing_after_the_dlq(self: Ingestion, record: Any, stamp: int) -> None:
        nonlocal deliveries
        await original(self, record, stamp)
        if mark in (record.original_text or ""):  # only this test's batch
            deliveries += 1
            if deliveries <= 2:
                raise BackendUnavailable("broker gone before the commit (test)")

    monkeypatch.setattr(Ingestion, "_publish_dead", failing_after_the_dlq)
    key = f"redelivered-{mark}"
    await client.send(client.topics.documents, f"{{broken {mark}".encode(), key=key)
    await client.send(client.topics.documents, json.loads(doc(doc_id=f"redelivered/{mark}.md")), key=key)
    await eventually(lambda: _has(daemon, f"redelivered/{mark}.md"), timeout=60, what="the good event")

    async def third_delivery() -> bool:  # the dead letter went out on the first
        return deliveries >= 3

    await eventually(third_delivery, timeout=60, what="the batch delivered a third time")
    dead = [d for d in await read_dlq(client, 10**6, timeout=5) if mark in (d.get("original_text") or "")]
    assert len(dead) == 1 and "Invalid JSON" in dead[0]["reason"], dead
