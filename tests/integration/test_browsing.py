"""Group listings for people browsing the memory (``ChunkIndex.groups``) on a real index."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aredis

from memory.config import IndexConfig
from memory.index import ChunkIndex
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


async def test_a_documents_listing_shows_each_docs_chunks_time_and_last_version(index: ChunkIndex) -> None:
    """Per doc, in code point order: its chunk count, latest time and last applied version (a
    nanosecond one exact), a rewritten doc at its new version, a deleted one gone, and never
    another tenant's doc."""
    await index.apply("b.md", 1, chunks(1, 3, "bravo", doc_id="b.md"), vectors(3, 1))
    await index.apply("b.md", 4, chunks(4, 2, "bravo", doc_id="b.md"), vectors(2, 2))
    await index.apply("a.md", BIG_VERSION, chunks(7, 1, "alpha", doc_id="a.md"), vectors(1, 3))
    await index.apply("c.md", 2, chunks(2, 2, "charlie", doc_id="c.md"), vectors(2, 4))
    await index.apply("c.md", 3, [], vectors(0, 5))  # deleted: a tombstone version, no chunks
    other = [dataclasses.replace(c, tenant="acme") for c in chunks(9, 5, "zulu", doc_id="a.md")]
    await index.apply("a.md", 9, other, vectors(5, 6), "acme")
    found = await index.groups("doc_id", {"tenant": "default", "kind": "document"}, limit=10)
    assert [(g.value, g.chunks, g.last, g.version) for g in found] == [
        ("a.md", 1, 1_700_000_000.0 + 7, BIG_VERSION),
        ("b.md", 2, 1_700_000_000.0 + 4, 4),
    ]
    page = await index.groups("doc_id", {"tenant": "default", "kind": "document"}, limit=1, offset=1)
    assert [g.value for g in page] == ["b.md"]
    theirs = await index.groups("doc_id", {"tenant": "acme", "kind": "document"}, limit=10)
    assert [(g.value, g.chunks, g.version) for g in theirs] == [("a.md", 5, 9)]
