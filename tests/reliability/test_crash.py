"""kill -9 the daemon in the middle of 500+ events, restart it: the final Redis state equals
the state computed from the event log, chunk by chunk, and the graph matches a clean build.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aredis
from aiokafka import AIOKafkaProducer

from consumers.events import DocumentEvent, TranscriptEvent
from daemon.topics import ensure_topics
from graph.config import GraphConfig
from graph.ner import SpacyNer
from graph.service import GraphService
from graph.store import GraphStore
from memory.config import ChunkingConfig, IndexConfig, IngestConfig
from memory.filters import BASE_FILTER_KEYS
from memory.index import ChunkIndex
from memory.ingest import Ingestor
from memory.keys import chunk_pattern
from tests.conftest import unique
from tests.helpers import DaemonProcess, isolated_settings, settings_env, stored_chunks, wait_for_chunks

pytestmark = pytest.mark.integration

SERVICES = ["billing-service", "auth-service", "search-api", "ledger-service", "notify-worker"]
ERRORS = ["ERR_CONN_RESET_4F2A", "ERR_SESSION_EXPIRED_77", "ERR_SHARD_UNASSIGNED", "ERR_LEDGER_LOCK_9C1"]
KEYS = ["max_connections", "token_ttl", "refresh_interval", "lock_timeout", "pool_size"]


def event_log(seed: int = 7, docs: int = 60, sessions: int = 12) -> list[tuple[str, str, dict[str, Any]]]:
    """A reproducible log of (topic kind, key, payload): upserts, edits, deletes, stale replays, transcripts."""
    rng = random.Random(seed)
    log: list[tuple[str, str, dict[str, Any]]] = []
    per_doc: dict[str, list[dict[str, Any]]] = {}

    def text(tag: str) -> str:
        return (
            f"{tag}: {rng.choice(SERVICES)} failed with {rng.choice(ERRORS)}; "
            f"we changed {rng.choice(KEYS)} on {rng.choice(SERVICES)} after HTTP {rng.choice([502, 503, 504])}."
        )

    for d in range(docs):
        doc_id = f"crash/doc-{d:04d}.md"
        version = 0
        for _ in range(rng.randint(3, 9)):
            version += rng.randint(1, 3)
            op = "delete" if rng.random() < 0.15 else "upsert"
            payload: dict[str, Any] = {
                "event_id": f"{doc_id}@{version}",
                "op": op,
                "doc_id": doc_id,
                "version": version,
            }
            if op == "upsert":
                payload["content"] = text(f"{doc_id} v{version}")
                payload["metadata"] = {"service": rng.choice(SERVICES)}
            per_doc.setdefault(doc_id, []).append(payload)
        # a stale replay: an old version arriving after newer ones
        per_doc[doc_id].append(
            dict(rng.choice(per_doc[doc_id][:-1])) if len(per_doc[doc_id]) > 1 else per_doc[doc_id][0]
        )
    for s in range(sessions):
        for t in range(rng.randint(6, 14)):
            payload = {
                "event_id": f"s{s}t{t}",
                "agent_id": f"agent-{s % 7}",
                "session_id": f"sess-{s}",
                "turn": t,
                "role": rng.choice(["user", "assistant"]),
                "content": text(f"session {s} turn {t}"),
            }
            log.append(("transcripts", f"agent-{s % 7}/sess-{s}", payload))
            if rng.random() < 0.2:  # redelivery of the same turn with new text: last one wins
                log.append(
                    (
                        "transcripts",
                        f"agent-{s % 7}/sess-{s}",
                        {**payload, "content": text(f"session {s} turn {t} redo")},
                    )
                )
    queues = {k: list(v) for k, v in per_doc.items()}
    while queues:  # interleave docs, keeping each doc's own order
        doc_id = rng.choice(sorted(queues))
        log.append(("documents", doc_id, queues[doc_id].pop(0)))
        if not queues[doc_id]:
            del queues[doc_id]
    rng.shuffle(log)  # transcripts vs docs; per-key order is restored below
    ordered: list[tuple[str, str, dict[str, Any]]] = []
    by_key: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for entry in log:
        by_key.setdefault(entry[1], []).append(entry)
    positions = {k: 0 for k in by_key}
    for entry in log:  # same multiset, but each key's events in their original relative order
        k = entry[1]
        ordered.append(by_key[k][positions[k]])
        positions[k] += 1
    return ordered


def expected_state(log: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    """doc_id -> final event (highest version; None if deleted), transcript doc_id -> final text."""
    docs: dict[str, dict[str, Any]] = {}
    turns: dict[str, dict[str, Any]] = {}
    for kind, _, p in log:
        if kind == "documents":
            cur = docs.get(p["doc_id"])
            if cur is None or p["version"] > cur["version"]:
                docs[p["doc_id"]] = p
        else:
            turns[f"transcript:{p['agent_id']}/{p['session_id']}/{p['turn']}"] = p
    return {"docs": docs, "turns": turns}


def expected_chunks(state: dict[str, Any]) -> dict[str, str]:
    out = {f"{d}_p0": p["content"] for d, p in state["docs"].items() if p["op"] == "upsert"}
    out.update({f"{d}_p0": p["content"] for d, p in state["turns"].items()})
    return out


async def turn_fields(client: aredis.Redis, name: str) -> dict[str, tuple[str, ...]]:
    """Every transcript chunk of an index: chunk id -> its text, terms and contexts."""
    fields = ["chunk_id", "text", "terms", "context", "context_vec"]
    out: dict[str, tuple[str, ...]] = {}
    async for key in client.scan_iter(match=chunk_pattern(name) + ":transcript:*", count=1000):
        values = tuple((v or b"").decode() for v in await client.hmget(key, fields))
        out[values[0]] = values[1:]
    return out


# Two daemons' worth of ingestion (500+ events, turns embedded with their context) and two clean
# builds to compare with. The size suffices: the log still holds every kind of event (edits,
# deletes, stale replays, redelivered turns) on all 4 partitions, the kill is asserted to land
# mid-stream, and every event's outcome is checked; 2,000 events proved nothing more.
@pytest.mark.timeout(360)
async def test_kill_9_mid_stream_loses_and_duplicates_nothing(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path, embedder: Any
) -> None:
    """SIGKILL mid-ingestion, restart: every doc at its latest version, deletes gone, no duplicates, every turn's
    context as a clean build gives it, exact graph."""
    name = unique("crash-test")
    settings = isolated_settings(name, kafka_bootstrap, redis_url, topic_partitions=4)
    env = settings_env(settings) | {
        "AGENTMEM_GRAPH__SUMMARIZER_CONCURRENCY": "0",
        "AGENTMEM_GRAPH__DRIFT_THRESHOLD": "1000000",
    }
    log = event_log()
    assert len(log) >= 500
    state = expected_state(log)
    want = expected_chunks(state)
    await ensure_topics(kafka_bootstrap, settings.topics.all(), partitions=4, replication=1)

    client = aredis.from_url(redis_url)
    daemon = DaemonProcess(env, str(tmp_path / "daemon.log")).start()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = []
        for kind, key, payload in log:
            topic = settings.topics.documents if kind == "documents" else settings.topics.transcripts
            futures.append(await producer.send(topic, json.dumps(payload).encode(), key=key.encode()))
        await asyncio.gather(*futures)

        index = ChunkIndex(client=client, cfg=IndexConfig(name=name), dims=embedder.dims)
        deadline = time.monotonic() + 120
        while await index.count() < len(want) // 3:
            assert time.monotonic() < deadline, "ingestion never got a third of the way"
            await asyncio.sleep(0.05)
        daemon.kill()
        killed_at = await index.count()
        assert killed_at < len(want), "the kill came too late to prove anything"

        daemon = DaemonProcess(env, str(tmp_path / "daemon2.log")).start()
        got = await wait_for_chunks(client, name, want, timeout=240)
        assert got == want, f"{len(got)} chunks stored vs {len(want)} expected (killed at {killed_at})"
        assert await index.count() == len(want)
        for doc_id, p in state["docs"].items():
            assert await index.versions([doc_id]) == {doc_id: p["version"]}
        # The explorer's directory, written in the writes' own transactions, is as exact.
        for lister, field, kind in ((index.documents, "doc_id", "document"), (index.agents, "agent_id", "transcript")):
            listed = await lister("default", limit=500)
            assert listed, f"nothing listed by {field}"
            aggregated = await index.groups(field, {"tenant": "default", "kind": kind}, limit=500)
            # The aggregation's times are RediSearch's, rounded to 12 digits (10 ms).
            assert [(g.value, g.chunks, g.version) for g in listed] == [
                (g.value, g.chunks, g.version) for g in aggregated
            ]
            assert [g.last for g in listed] == pytest.approx([g.last for g in aggregated], abs=0.01)
        # Every turn is indexed with the context (its neighbours' words) a clean build gives it.
        clean_turns = ChunkIndex(client=client, cfg=IndexConfig(name=unique("crash-turns")), dims=embedder.dims)
        await clean_turns.ensure()
        turns_only = Ingestor(index=clean_turns, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
        await turns_only.apply(
            [TranscriptEvent.model_validate(p).to_item(BASE_FILTER_KEYS) for p in state["turns"].values()]
        )
        want_turns = await turn_fields(client, clean_turns.cfg.name)
        assert len(want_turns) == len(state["turns"])
        deadline = time.monotonic() + 60
        while (got_turns := await turn_fields(client, name)) != want_turns:
            wrong = sorted(c for c in want_turns if got_turns.get(c) != want_turns[c])
            assert time.monotonic() < deadline, f"{len(wrong)} turns' contexts differ from a clean build: {wrong[:3]}"
            await asyncio.sleep(0.2)
        await clean_turns.drop()
    finally:
        await producer.stop()
        daemon.stop()
    # Still so once the daemon has stopped: no work still running hid behind the first check.
    assert await stored_chunks(client, name) == want

    # the graph equals a clean build from the final documents alone
    ner = await SpacyNer.load("en_core_web_sm")
    fresh_name = unique("crash-fresh")
    fresh_index = ChunkIndex(client=client, cfg=IndexConfig(name=fresh_name), dims=embedder.dims)
    await fresh_index.ensure()
    fresh_graph = GraphService(
        store=GraphStore(client=client, name=fresh_name),
        index=fresh_index,
        embedder=embedder,
        ner=ner,
        cfg=GraphConfig(),
    )
    ingestor = Ingestor(
        index=fresh_index,
        embedder=embedder,
        chunking=ChunkingConfig(),
        cfg=IngestConfig(),
        hook=fresh_graph,
    )
    items = [
        DocumentEvent.model_validate(p).to_item(BASE_FILTER_KEYS) for p in state["docs"].values() if p["op"] == "upsert"
    ]
    items += [TranscriptEvent.model_validate(p).to_item(BASE_FILTER_KEYS) for p in state["turns"].values()]
    await ingestor.apply(items)
    crashed = GraphStore(client=client, name=name)
    clean = fresh_graph.store
    (n1, e1), (n2, e2) = await crashed.graph(), await clean.graph()
    if (set(n1), e1) != (set(n2), e2):
        docs = sorted(set(await crashed.doc_ids()) | set(await clean.doc_ids()))
        differ = {}
        for doc in docs:
            a, b = await crashed.contribution(doc), await clean.contribution(doc)
            # A delete's tombstone ({"d": 1}) adds what no contribution does: nothing.
            ea, eb = (a or {}).get("e") or {}, (b or {}).get("e") or {}
            if ((a or {}).get("x") or []) != ((b or {}).get("x") or []) or sorted(ea) != sorted(eb):
                differ[doc] = (a, b)
        logs = [
            line
            for f in ("daemon.log", "daemon2.log")
            if (tmp_path / f).exists()
            for line in (tmp_path / f).read_text().splitlines()
            if any(d in line for d in differ)
        ]
        shown = "\n".join(logs[-40:])
        raise AssertionError(f"graph differs from a clean build in {len(differ)} docs: {differ}\n{shown}")
    for key in sorted(n1)[:50]:
        assert await crashed.entity_docs(key) == await clean.entity_docs(key)
    ner.close()
    await client.aclose()
