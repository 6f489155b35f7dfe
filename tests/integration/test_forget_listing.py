"""An agent-wide forget lists the agent's stored turns page by page (offset paging, 1000 chunks
a page). If another daemon deletes some of that agent's turns between two pages (a session
forget keyed agent/session, on another partition), every later chunk moves up by as many
places, and a single pass would skip that many turns, never forgotten. The listing runs
again until a pass finds nothing new.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import redis.asyncio as aredis

from consumers.events import ForgetEvent, TranscriptEvent
from memory.chunking import chunk_id
from memory.config import ChunkingConfig, IndexConfig, IngestConfig
from memory.filters import BASE_FILTER_KEYS
from memory.index import ChunkIndex
from memory.ingest import Ingestor
from memory.records import ChunkRecord, MemoryItem
from tests.conftest import unique

pytestmark = pytest.mark.integration

AGENT = "pager"


def _turn(session: str, n: int, ts: float) -> MemoryItem:
    ev = TranscriptEvent(event_id=f"{session}{n}", agent_id=AGENT, session_id=session, turn=n, content=f"turn {n}")
    return dataclasses.replace(ev.to_item(BASE_FILTER_KEYS), timestamp=ts)


def _forget(session: str | None) -> MemoryItem:
    ev = ForgetEvent(event_id="f", op="forget", agent_id=AGENT, session_id=session, all_sessions=session is None)
    return ev.to_item(BASE_FILTER_KEYS)


async def _store(index: ChunkIndex, item: MemoryItem, dims: int) -> None:
    """What the ingestor writes for a one-chunk turn (a random vector: no model needed here)."""
    rec = ChunkRecord(
        chunk_id=chunk_id(item.doc_id, 0),
        doc_id=item.doc_id,
        position=0,
        text=item.content,
        kind=item.kind,
        source=item.source,
        tags={**item.tags, "doc_id": item.doc_id, "kind": item.kind, "source": item.source},
        metadata=item.metadata,
        version=0,
        timestamp=item.timestamp,
        tenant=item.tenant,
    )
    vec = np.random.default_rng(0).random((1, dims), dtype=np.float32)
    await index.apply(item.doc_id, None, [rec], vec, item.tenant)


class SearchSpy:
    """The real search object; after the first listing page, runs ``between`` once."""

    def __init__(self, inner, between) -> None:
        self.inner, self.between, self.calls = inner, between, 0

    async def search(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 2:
            await self.between()
        return await self.inner.search(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.timeout(300)
async def test_agent_wide_forget_deletes_every_turn_despite_a_concurrent_session_forget(
    redis_url: str, embedder
) -> None:
    client = aredis.from_url(redis_url)
    name = unique("forget-paging")
    index = ChunkIndex(client=client, cfg=IndexConfig(name=name), dims=embedder.dims)
    await index.drop()
    await index.ensure()
    # this daemon: the agent-wide forget; the other daemon: a forget of session s1
    ours = Ingestor(index=index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
    other_index = ChunkIndex(client=client, cfg=IndexConfig(name=name), dims=embedder.dims)
    other = Ingestor(index=other_index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
    try:
        s1 = [_turn("s1", n, ts=1.0 + n) for n in range(5)]  # the oldest turns
        s2 = [_turn("s2", n, ts=100.0 + n) for n in range(1000)]
        for it in [*s1, *s2]:
            await _store(index, it, embedder.dims)

        async def other_daemon_forgets_s1() -> None:
            report = await other.apply([_forget("s1")])
            assert not report.failed

        spy = SearchSpy(index._ft(), other_daemon_forgets_s1)
        index._search = spy  # the listing's FT.SEARCH calls go through the spy
        report = await ours.apply([_forget(None)])
        assert spy.calls >= 2 and not report.failed
        left = [it.doc_id for it in [*s1, *s2] if await index.chunk_ids(it.doc_id)]
        assert left == [], f"{len(left)} turns survived the agent-wide forget: {left}"
    finally:
        await index.drop()
        await client.aclose()
