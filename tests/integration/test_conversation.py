"""Conversation-aware indexing of transcript turns, against a real Redis with RediSearch and the real model."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aredis

from consumers.events import ForgetEvent, TranscriptEvent
from memory.config import ChunkingConfig, IndexConfig, IngestConfig, RetrievalConfig
from memory.conversation import vector_text
from memory.filters import BASE_FILTER_KEYS
from memory.index import ChunkIndex
from memory.ingest import Ingestor
from memory.keys import chunk_pattern
from memory.records import MemoryItem
from memory.retrieval import Retriever
from memory.search_spec import SearchSpec
from tests.conftest import unique
from tests.helpers.stacks import settled

pytestmark = pytest.mark.integration

FIELDS = ("text", "terms", "context", "context_vec")


def turn(
    agent: str, session: str, n: int, content: str, when: str = "2023-05-08T13:56:00Z", tenant: str = "default"
) -> MemoryItem:
    event = TranscriptEvent.model_validate_json(
        json.dumps(
            {
                "event_id": f"{agent}/{session}/{n}",
                "agent_id": agent,
                "session_id": session,
                "turn": n,
                "content": content,
                "timestamp": when,
            }
        )
    )
    return event.to_item(BASE_FILTER_KEYS, tenant)


def forget(agent: str, session: str) -> MemoryItem:
    return ForgetEvent(event_id=f"forget-{agent}-{session}", op="forget", agent_id=agent, session_id=session).to_item(
        BASE_FILTER_KEYS
    )


async def stack(redis_url: str, embedder: Any, name: str) -> tuple[aredis.Redis, ChunkIndex, Ingestor, Retriever]:
    client = aredis.from_url(redis_url)
    index = ChunkIndex(client=client, cfg=IndexConfig(name=unique(name)), dims=embedder.dims)
    await index.drop()
    await index.ensure()
    ingestor = Ingestor(index=index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
    return client, index, ingestor, Retriever(index=index, embedder=embedder, cfg=RetrievalConfig())


async def stored_turns(client: aredis.Redis, index: ChunkIndex) -> dict[str, dict[str, Any]]:
    """Every chunk hash of the index: chunk id -> the indexed fields and the vector."""
    out: dict[str, dict[str, Any]] = {}
    async for key in client.scan_iter(match=chunk_pattern(index.cfg.name), count=1000):
        values = await client.hmget(key, [*FIELDS, "vector", "chunk_id"])
        row = {f: (v or b"").decode() for f, v in zip(FIELDS, values[: len(FIELDS)], strict=True)}
        row["vector"] = np.frombuffer(values[len(FIELDS)], dtype=np.float32)
        out[values[-1].decode()] = row
    return out


@pytest.fixture
async def cleanup() -> AsyncIterator[list[tuple[aredis.Redis, ChunkIndex]]]:
    made: list[tuple[aredis.Redis, ChunkIndex]] = []
    yield made
    for client, index in made:
        await index.drop()
        await client.aclose()


SESSION = [
    "Melanie: Did you finish the pottery class you signed up for in the spring?",
    "Caroline: Yes, yesterday!",
    "Melanie: That is wonderful, congratulations.",
    "Caroline: Thanks. How are the kids doing?",
    "Melanie: They started swimming lessons at the lake.",
    "Caroline: Lovely. I read a book about adoption agencies last week.",
    "Melanie: Which one did you like best?",
    "Caroline: The one about foster care in Ohio.",
]
OTHER = [
    "Caroline: I painted a sunset over the harbour on Sunday.",
    "Caroline: Yes, I love my new running shoes.",
    "Caroline: Yes, the concert was loud and fun.",
    "Caroline: I went hiking with my brother in the mountains.",
]


async def test_a_turn_is_found_by_its_neighbours_words(redis_url: str, embedder: Any, cleanup: list[Any]) -> None:
    """A reply that holds none of the question's words ("Yes, yesterday!") is found through the turn it answers,
    and is returned as itself."""
    client, index, ingestor, retriever = await stack(redis_url, embedder, "neighbours")
    cleanup.append((client, index))
    items = [turn("caro", "s1", n + 1, text) for n, text in enumerate(SESSION)]
    items += [turn("caro", f"s{n + 2}", 1, text) for n, text in enumerate(OTHER)]
    report = await ingestor.apply(items)
    assert not report.failed
    for dense, sparse in ((None, None), (0.0, None)):
        out = await retriever.search(
            SearchSpec(
                text="When did Caroline finish her pottery class?",
                top_k=3,
                dense_weight=dense,
                sparse_weight=sparse,
                metadata_filter={"agent_id": "caro"},
            )
        )
        ids = [h.chunk.doc_id for h in out.hits]
        assert "transcript:caro/s1/2" in ids, ids
        hit = next(h for h in out.hits if h.chunk.doc_id == "transcript:caro/s1/2")
        assert hit.chunk.text == "Caroline: Yes, yesterday!"


async def test_a_turn_is_found_by_the_day_it_was_said(redis_url: str, embedder: Any, cleanup: list[Any]) -> None:
    """Of two sessions that said the same thing on different days, a question naming the day finds that day's."""
    client, index, ingestor, retriever = await stack(redis_url, embedder, "days")
    cleanup.append((client, index))
    said = "Planner: we decided to ship the release behind a feature flag."
    await ingestor.apply(
        [
            turn("p", "monday", 1, said, when="2023-05-08T10:00:00Z"),
            turn("p", "tuesday", 1, said, when="2023-05-09T10:00:00Z"),
        ]
    )
    for text, day in (("What did we decide on 9 May 2023?", "tuesday"), ("What was decided on May 8, 2023?", "monday")):
        out = await retriever.search(SearchSpec(text=text, top_k=2, metadata_filter={"agent_id": "p"}))
        assert out.hits[0].chunk.doc_id == f"transcript:p/{day}/1", text


async def test_redelivered_and_reordered_turns_leave_the_same_index(
    redis_url: str, embedder: Any, cleanup: list[Any]
) -> None:
    """Turns applied in order one by one, and the same turns shuffled, redelivered and batched at random, leave
    every turn indexed with the same text, terms and context (and the same vector)."""
    items = [turn("a", "s", n, text) for n, text in enumerate(SESSION)]
    items += [turn("a", "s2", n, text) for n, text in enumerate(OTHER)]
    client, in_order, ingestor, _ = await stack(redis_url, embedder, "in-order")
    cleanup.append((client, in_order))
    for it in items:
        assert not (await ingestor.apply([it])).failed
    want = await stored_turns(client, in_order)
    assert len(want) == len(items)
    assert want["transcript:a/s/1_p0"]["context"].startswith(SESSION[0])

    rng = random.Random(5)
    for attempt in range(3):
        client2, shuffled, ingestor2, _ = await stack(redis_url, embedder, f"shuffled-{attempt}")
        cleanup.append((client2, shuffled))
        stream = items + rng.sample(items, 5)  # redeliveries
        rng.shuffle(stream)
        while stream:
            n = rng.randint(1, 4)
            batch, stream = stream[:n], stream[n:]
            assert not (await ingestor2.apply(batch)).failed
        got = await stored_turns(client2, shuffled)
        assert set(got) == set(want)
        for cid, row in want.items():
            for f in FIELDS:
                assert got[cid][f] == row[f], (attempt, cid, f)
            np.testing.assert_allclose(got[cid]["vector"], row["vector"], atol=2e-3)


async def test_a_rewritten_turn_reindexes_its_neighbours(redis_url: str, embedder: Any, cleanup: list[Any]) -> None:
    """A turn published again with new words changes the context of the turns around it, and the vectors of the
    turns that read it as a previous turn, and nothing else."""
    client, index, ingestor, _ = await stack(redis_url, embedder, "rewrite")
    cleanup.append((client, index))
    await ingestor.apply([turn("a", "s", n, text) for n, text in enumerate(SESSION)])
    before = await stored_turns(client, index)
    await ingestor.apply([turn("a", "s", 3, "Caroline: Thanks. Did the zebra finches hatch?")])
    after = await stored_turns(client, index)
    changed = {cid for cid in before if before[cid]["context"] != after[cid]["context"]}
    assert changed == {f"transcript:a/s/{n}_p0" for n in (1, 2, 4, 5, 6)}
    for n in (4, 5):  # the two turns that read turn 3 before their own text
        row = after[f"transcript:a/s/{n}_p0"]
        assert "zebra finches" in row["context_vec"]
        [fresh] = await embedder.embed_documents([vector_text(row["text"], row["context_vec"])])
        np.testing.assert_allclose(row["vector"], fresh, atol=2e-3)
    for n in (0, 1, 2, 6, 7):
        cid = f"transcript:a/s/{n}_p0"
        np.testing.assert_allclose(after[cid]["vector"], before[cid]["vector"], atol=1e-6)
    assert "zebra" in after["transcript:a/s/2_p0"]["terms"].split()


async def test_forgetting_a_session_leaves_no_trace_in_any_other_turn(
    redis_url: str, embedder: Any, cleanup: list[Any]
) -> None:
    """After a session is forgotten no stored turn holds its words, and a turn of that session published after
    the forget is indexed without them."""
    client, index, ingestor, _ = await stack(redis_url, embedder, "forget")
    cleanup.append((client, index))
    secret = [f"Melanie: the vault code is quokka{n} near the marsupial exhibit" for n in range(5)]
    await ingestor.apply([turn("a", "s1", n, t) for n, t in enumerate(secret)])
    await ingestor.apply([turn("a", "s2", n, t) for n, t in enumerate(OTHER)])
    await ingestor.apply([turn("b", "s1", n, t) for n, t in enumerate(SESSION)])
    assert any("quokka" in row["context"] for row in (await stored_turns(client, index)).values())
    await ingestor.apply([forget("a", "s1"), turn("a", "s1", 5, "Caroline: let us start over, new topic.")])
    rows = await stored_turns(client, index)
    assert "transcript:a/s1/5_p0" in rows and "transcript:a/s1/4_p0" not in rows
    for cid, row in rows.items():
        for f in FIELDS:
            assert "quokka" not in row[f] and "marsupi" not in row[f], (cid, f)


async def test_forgetting_one_turn_takes_its_words_out_of_the_turns_around_it(
    redis_url: str, embedder: Any, cleanup: list[Any]
) -> None:
    """One turn forgotten: it is gone, the other turns stay, and none of them holds its words in
    its terms or context any more; the turns after it are embedded again without it."""
    client, index, ingestor, _ = await stack(redis_url, embedder, "forget-turn")
    cleanup.append((client, index))
    said = [f"Caroline: step {n} of the plan went fine." for n in range(26)]  # turns 20-25 start with "2" too
    said[2] = "Caroline: my vault code is quokka77 near the marsupial exhibit."
    await ingestor.apply([turn("a", "s1", n, t) for n, t in enumerate(said)])
    assert sum("quokka" in row["context"] for row in (await stored_turns(client, index)).values()) >= 4
    event = ForgetEvent(event_id="forget-a-s1-2", op="forget", agent_id="a", session_id="s1", turn=2)
    report = await ingestor.apply([event.to_item(BASE_FILTER_KEYS)])
    assert not report.failed
    rows = await stored_turns(client, index)
    assert sorted(rows) == sorted(f"transcript:a/s1/{n}_p0" for n in range(26) if n != 2)
    for cid, row in rows.items():
        for f in FIELDS:
            assert "quokka" not in row[f] and "marsupi" not in row[f], (cid, f)
    [fresh] = await embedder.embed_documents([vector_text(said[3], rows["transcript:a/s1/3_p0"]["context_vec"])])
    np.testing.assert_allclose(rows["transcript:a/s1/3_p0"]["vector"], fresh, atol=2e-3)


async def test_context_never_crosses_tenants(redis_url: str, embedder: Any, cleanup: list[Any]) -> None:
    """Two tenants with the same agent and session ids: each tenant's turns are indexed with its own neighbours
    only, and a query in one tenant never returns the other's words."""
    client, index, ingestor, retriever = await stack(redis_url, embedder, "tenants")
    cleanup.append((client, index))
    await ingestor.apply([turn("a", "s", n, f"Melanie: acme secret plan number {n}", tenant="acme") for n in range(4)])
    await ingestor.apply([turn("a", "s", n, f"Caroline: globex weather report {n}", tenant="globex") for n in range(4)])
    seen = 0
    async for key in client.scan_iter(match=f"{index.cfg.name}:g*:chunk:*", count=1000):
        tenant = key.decode().split(":chunk:")[1].split(":")[0]
        context, terms = (v.decode() for v in await client.hmget(key, ["context", "terms"]))
        other = "globex" if tenant == "acme" else "acme"
        assert other not in context and other not in terms.split(), (key, context)
        seen += 1
    assert seen == 8
    out = await retriever.search(SearchSpec(text="globex weather report", top_k=10, tenant="acme"))
    assert out.hits and all("globex" not in h.chunk.text for h in out.hits)


async def test_a_question_naming_a_speaker_lifts_that_speakers_turns(
    redis_url: str, embedder: Any, cleanup: list[Any]
) -> None:
    """The turns of the one a question names get the speaker list (rank 1, its weight over
    k + 1 added to their score); another speaker's turns do not; weight 0 turns it off."""
    client, index, ingestor, retriever = await stack(redis_url, embedder, "speakers")
    cleanup.append((client, index))
    said = ["Alice: We adopted a kitten from the shelter.", "Bob: We adopted a puppy from the shelter."]
    report = await ingestor.apply([turn("pets", "s1", n + 1, text) for n, text in enumerate(said)])
    assert not report.failed
    stored = {h[b"chunk_id"].decode(): h for h in [await client.hgetall(k) async for k in _keys(client, index)]}
    assert stored["transcript:pets/s1/2_p0"][b"speaker"] == b"assistant|bob|pets"  # the agent's own turn
    question = "What pet did Bob adopt from the shelter?"
    only = {"agent_id": "pets"}
    await settled(retriever._index._r, retriever._index.cfg.name)  # the same BM25 statistics for both
    on = await retriever.search(SearchSpec(text=question, top_k=2, metadata_filter=only))
    off = await retriever.search(SearchSpec(text=question, top_k=2, metadata_filter=only, speaker_weight=0.0))
    lifted = {h.chunk.doc_id: h for h in on.hits}
    plain = {h.chunk.doc_id: h for h in off.hits}
    bob, alice = "transcript:pets/s1/2", "transcript:pets/s1/1"
    assert lifted[bob].ranks["speaker"] == 1 and "speaker" not in lifted[alice].ranks
    assert all("speaker" not in h.ranks for h in off.hits)
    k = RetrievalConfig().rrf_k
    assert lifted[bob].score == pytest.approx(plain[bob].score + RetrievalConfig().speaker_weight / (k + 1))
    assert lifted[alice].score == pytest.approx(plain[alice].score)


async def _keys(client: aredis.Redis, index: ChunkIndex) -> AsyncIterator[bytes]:
    async for key in client.scan_iter(match=chunk_pattern(index.cfg.name), count=1000):
        yield key
