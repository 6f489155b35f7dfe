"""Listings for people browsing the memory on a real index: the directory kept with the
chunks (``ChunkIndex.documents`` / ``.agents``) and the aggregation (``ChunkIndex.groups``)
it stands in for."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aredis

from memory import keys
from memory.config import IndexConfig
from memory.conversation import id_part
from memory.index import MAX_PAGE, ChunkIndex
from memory.records import ChunkRecord
from tests.conftest import unique
from tests.integration.test_sliced_writes import chunks, vectors

pytestmark = pytest.mark.integration

#: A nanosecond version (the LangGraph store's): above 2**53, a double would round it.
BIG_VERSION = 1_733_112_345_678_901_234


@pytest.fixture
async def index(redis_url: str) -> AsyncIterator[ChunkIndex]:
    client = aredis.from_url(redis_url)
    idx = ChunkIndex(client=client, cfg=IndexConfig(name=unique(__name__)), dims=384)
    await idx.drop()
    await idx.ensure()
    yield idx
    await idx.drop()
    await client.aclose()


@pytest.mark.parametrize("directory", [True, False], ids=["directory", "older generation"])
async def test_a_documents_listing_shows_each_docs_chunks_time_and_last_version(
    index: ChunkIndex, directory: bool
) -> None:
    """Per doc, in code point order: its chunk count, latest time and last applied version (a
    nanosecond one exact), a rewritten doc at its new version, a deleted one gone, and never
    another tenant's doc; the same from a generation without a directory (aggregated)."""
    if not directory:
        await index._r.delete(keys.directory_flag(index.cfg.name, await index._generation()))
    assert await index.has_directory() is directory
    await index.apply("b.md", 1, chunks(1, 3, "bravo", doc_id="b.md"), vectors(3, 1))
    await index.apply("b.md", 4, chunks(4, 2, "bravo", doc_id="b.md"), vectors(2, 2))
    await index.apply("a.md", BIG_VERSION, chunks(7, 1, "alpha", doc_id="a.md"), vectors(1, 3))
    await index.apply("c.md", 2, chunks(2, 2, "charlie", doc_id="c.md"), vectors(2, 4))
    await index.apply("c.md", 3, [], vectors(0, 5))  # deleted: a tombstone version, no chunks
    other = [dataclasses.replace(c, tenant="acme") for c in chunks(9, 5, "zulu", doc_id="a.md")]
    await index.apply("a.md", 9, other, vectors(5, 6), "acme")
    found = await index.documents("default", limit=10)
    assert [(g.value, g.chunks, g.last, g.version) for g in found] == [
        ("a.md", 1, 1_700_000_000.0 + 7, BIG_VERSION),
        ("b.md", 2, 1_700_000_000.0 + 4, 4),
    ]
    page = await index.documents("default", limit=1, offset=1)
    assert [g.value for g in page] == ["b.md"]
    assert len(await index.documents("default", limit=MAX_PAGE + 1)) == 2  # a page and "more?"
    theirs = await index.documents("acme", limit=10)
    assert [(g.value, g.chunks, g.version) for g in theirs] == [("a.md", 5, 9)]


def _turn(tenant: str, agent: str, session: str, turn: int, n: int, at: int) -> list[ChunkRecord]:
    doc_id = f"transcript:{id_part(agent)}/{session}/{turn}"
    return [
        ChunkRecord(
            chunk_id=f"{doc_id}_p{i}",
            doc_id=doc_id,
            position=i,
            text=f"turn {turn} part {i} of {agent}",
            kind="transcript",
            source=f"{agent}/{session}",
            tags={"agent_id": agent, "session_id": session, "kind": "transcript", "doc_id": doc_id, "source": ""},
            metadata={"turn": turn},
            version=0,
            timestamp=1_700_000_000.0 + at,
            tenant=tenant,
        )
        for i in range(n)
    ]


async def _listed(index: ChunkIndex, tenant: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    docs = await index.documents(tenant, limit=500)
    agents = await index.agents(tenant, limit=500)
    return (
        [(g.value, g.chunks, g.last, g.version) for g in docs],
        [(g.value, g.chunks, g.last) for g in agents],
    )


async def _aggregated(index: ChunkIndex, tenant: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    docs = await index.groups("doc_id", {"tenant": tenant, "kind": "document"}, limit=500)
    agents = await index.groups("agent_id", {"tenant": tenant, "kind": "transcript"}, limit=500)
    return (
        [(g.value, g.chunks, g.last, g.version) for g in docs],
        [(g.value, g.chunks, g.last) for g in agents],
    )


async def test_the_directory_lists_exactly_what_the_chunks_hold_through_any_changes(redis_url: str) -> None:
    """After 150 random writes (turns of agents whose ids need escaping, rewritten with more or
    fewer chunks, redelivered, forgotten; documents edited, deleted, written in slices;
    community summaries; two tenants), the directory's listings equal the aggregation over
    the chunks, and a reindex's copies into a new generation list the same again."""
    client = aredis.from_url(redis_url)
    cfg = IndexConfig(name=unique(__name__), write_slice_chunks=4)
    index = ChunkIndex(client=client, cfg=cfg, dims=384)
    copy = ChunkIndex(client=client, cfg=cfg, dims=384, generation=7)
    await index.drop()
    await index.ensure()
    try:
        rng = random.Random(26)
        agents, tenants, versions = ["ops/east", "ops", "a%2Fb", "zed"], ["default", "acme"], dict[str, int]()
        written: set[tuple[str, str]] = set()
        for step in range(150):
            tenant, kind = rng.choice(tenants), rng.random()
            if kind < 0.6:
                agent, session, turn = rng.choice(agents), rng.choice(["s1", "s2"]), rng.randrange(5)
                n = rng.choice([0, 1, 1, 2, 3])  # 0: forgotten
                recs = _turn(tenant, agent, session, turn, n, step)
                doc_id = recs[0].doc_id if recs else _turn(tenant, agent, session, turn, 1, 0)[0].doc_id
                await index.apply(doc_id, None, recs, vectors(n, step), tenant)
            else:
                doc_id = rng.choice(["guide.md", "notes/été.md", "community:c1", "z.md"])
                version = versions.get(f"{tenant}/{doc_id}", 0) + 1
                versions[f"{tenant}/{doc_id}"] = version
                n = rng.choice([0, 1, 2, 9])  # 9: in slices of 4
                recs = [
                    dataclasses.replace(
                        c,
                        tenant=tenant,
                        timestamp=1_700_000_000.0 + step,
                        kind="community" if doc_id.startswith("community:") else "document",
                    )
                    for c in chunks(version, n, "word", doc_id=doc_id)
                ]
                await index.apply(doc_id, version, recs, vectors(n, step), tenant)
            written.add((tenant, doc_id))
        for tenant in tenants:
            listed, aggregated = await _listed(index, tenant), await _aggregated(index, tenant)
            assert listed == aggregated
            assert listed[0] and listed[1], "the random walk left something to list"
            assert "community:c1" not in [d[0] for d in listed[0]]
        assert {a for a, *_ in (await _listed(index, "default"))[1]} <= set(agents)

        await copy.ensure()
        assert await copy.has_directory()
        source = await index._generation()
        # What a replay wrote into the new generation first: copies replace older versions.
        for doc_id in ("guide.md", "z.md"):
            if ("default", doc_id) in written:
                await copy.apply(doc_id, 0, chunks(0, 3, "old", doc_id=doc_id), vectors(3, 99))
        for tenant, doc_id in sorted(written):
            await copy.copy_doc(source, tenant, doc_id)
        for tenant in tenants:
            assert await _listed(copy, tenant) == await _listed(index, tenant)
    finally:
        await copy.drop()
        await index.drop()
        await client.aclose()


async def test_an_agent_leaves_the_listing_with_its_last_turn(index: ChunkIndex) -> None:
    """Forgetting an agent's newest turn moves its latest time back; forgetting its last
    turn takes it off the listing."""
    first, second = _turn("default", "planner", "s1", 0, 2, 10), _turn("default", "planner", "s1", 1, 1, 20)
    await index.apply(first[0].doc_id, None, first, vectors(2, 1))
    await index.apply(second[0].doc_id, None, second, vectors(1, 2))
    assert [(g.value, g.chunks, g.last) for g in await index.agents("default", limit=10)] == [
        ("planner", 3, 1_700_000_020.0)
    ]
    await index.apply(second[0].doc_id, None, [], vectors(0, 3))
    assert [(g.value, g.chunks, g.last) for g in await index.agents("default", limit=10)] == [
        ("planner", 2, 1_700_000_010.0)
    ]
    await index.apply(first[0].doc_id, None, [], vectors(0, 4))
    assert await index.agents("default", limit=10) == []


async def test_an_agent_whose_id_holds_a_backslash_a_quote_or_a_line_break_lists_its_sessions(
    index: ChunkIndex,
) -> None:
    """The sessions of one agent are grouped under a filter on its id: ids a RediSearch
    expression string cannot hold still list exactly their own sessions."""
    agents = ["CORP\\ops", 'say "hi"', "two\nlines", "plain"]
    for n, agent in enumerate(agents):
        turn = _turn("default", agent, f"s-{n}", 0, 1, n)
        await index.apply(turn[0].doc_id, None, turn, vectors(1, n))
    for n, agent in enumerate(agents):
        found = await index.groups(
            "session_id", {"tenant": "default", "kind": "transcript"}, limit=10, where={"agent_id": agent}
        )
        assert [g.value for g in found] == [f"s-{n}"], agent


async def test_a_page_of_a_documents_chunks_reads_those_alone(index: ChunkIndex) -> None:
    """A page of a 12-chunk document reads the chunks at its positions (10 before 2 by number,
    not by text), and the count says how many there are; a page past the end reads none."""
    await index.apply("big.md", 1, chunks(1, 12, "bravo", doc_id="big.md"), vectors(12, 1))
    page = (await index.turns(["big.md"], "default", page=(8, 3))).get("big.md", [])
    assert [c.chunk_id for c in page] == ["big.md_p8", "big.md_p9", "big.md_p10"]
    assert await index.chunk_count("big.md", "default") == 12
    assert await index.chunk_count("big.md", "acme") == 0
    assert (await index.turns(["big.md"], "default", page=(12, 3))).get("big.md") is None
