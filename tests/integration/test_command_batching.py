"""Read commands of one event-loop turn sent together (``memory.index.batching``), on a real Redis.

What the batcher must keep of ``execute_command``: each caller gets its own reply and its
own error, a lost connection reaches every caller, a cancelled caller leaves the others be,
and the search's read of the winners survives a Redis that forgot its script.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from memory.config import ChunkingConfig, IndexConfig, IngestConfig, RetrievalConfig
from memory.index import ChunkIndex
from memory.index.batching import CommandBatcher
from memory.ingest import Ingestor
from memory.records import MemoryItem
from memory.retrieval import Retriever
from memory.search_spec import SearchSpec
from tests.conftest import unique

pytestmark = pytest.mark.integration


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aredis.Redis]:
    c = aredis.from_url(redis_url, client_name=unique("batching"))
    yield c
    await c.aclose()


async def connections_named(redis_url: str, name: str) -> int:
    async with aredis.from_url(redis_url) as other:
        return sum(1 for c in await other.client_list() if c.get("name") == name)


async def test_commands_of_one_turn_share_one_connection_and_keep_their_replies(
    client: aredis.Redis, redis_url: str
) -> None:
    batcher = CommandBatcher(client)
    replies = await asyncio.gather(*(batcher.execute("ECHO", f"reply {i}") for i in range(20)))
    assert replies == [f"reply {i}".encode() for i in range(20)]
    # Sent one by one, twenty concurrent commands take twenty pooled connections.
    assert await connections_named(redis_url, client.connection_pool.connection_kwargs["client_name"]) == 1


async def test_each_caller_gets_its_own_error(client: aredis.Redis) -> None:
    batcher = CommandBatcher(client)
    ok, bad, also_ok = await asyncio.gather(
        batcher.execute("ECHO", "first"),
        batcher.execute("FT.SEARCH", unique("no-such-index"), "*"),
        batcher.execute("ECHO", "last"),
        return_exceptions=True,
    )
    assert (ok, also_ok) == (b"first", b"last")
    assert isinstance(bad, ResponseError)
    # Alone, the error is raised as execute_command raises it.
    with pytest.raises(ResponseError):
        await batcher.execute("FT.SEARCH", unique("no-such-index"), "*")


async def test_a_lost_connection_reaches_every_caller() -> None:
    # Port 1: nothing listens; the pipeline fails to connect for all of them.
    gone = aredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1, retry=None)
    try:
        batcher = CommandBatcher(gone)
        results = await asyncio.gather(*(batcher.execute("ECHO", "x") for _ in range(3)), return_exceptions=True)
        assert all(isinstance(r, RedisConnectionError) for r in results), results
        assert len({id(r) for r in results}) == 3  # each caller its own exception
    finally:
        await gone.aclose()


async def test_a_caller_cancelled_while_its_batch_is_in_flight_leaves_the_others_their_replies(
    client: aredis.Redis,
) -> None:
    batcher = CommandBatcher(client)
    # A script that keeps Redis busy for a while, sent in one pipeline with an ECHO.
    slow = asyncio.ensure_future(batcher.execute("EVAL", "local i = 0 while i < 2e7 do i = i + 1 end return 1", 0))
    quick = asyncio.ensure_future(batcher.execute("ECHO", "still here"))
    await asyncio.sleep(0.05)
    assert not slow.done()
    slow.cancel()
    assert await asyncio.wait_for(quick, 30) == b"still here"
    assert slow.cancelled()
    assert await batcher.execute("ECHO", "after") == b"after"


async def test_a_cancelled_caller_leaves_the_others_their_replies(client: aredis.Redis) -> None:
    batcher = CommandBatcher(client)
    first = asyncio.ensure_future(batcher.execute("ECHO", "a"))
    dropped = asyncio.ensure_future(batcher.execute("ECHO", "b"))
    last = asyncio.ensure_future(batcher.execute("ECHO", "c"))
    await asyncio.sleep(0)  # all three queued, nothing sent yet
    dropped.cancel()
    assert await first == b"a"
    assert await last == b"c"
    assert dropped.cancelled()
    assert await batcher.execute("ECHO", "after") == b"after"  # nothing left out of step


async def test_the_winners_are_read_after_redis_forgot_the_script(redis_url: str, embedder: Any) -> None:
    async with aredis.from_url(redis_url) as client:
        index = ChunkIndex(client=client, cfg=IndexConfig(name=unique("batching")), dims=embedder.dims)
        await index.ensure()
        try:
            ingestor = Ingestor(index=index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
            texts = [f"the {w} rollout paged the on-call engineer" for w in ("canary", "billing", "search")]
            await ingestor.apply(
                [MemoryItem(op="upsert", doc_id=f"doc-{i}", version=1, content=t) for i, t in enumerate(texts)]
            )
            retriever = Retriever(index=index, embedder=embedder, cfg=RetrievalConfig())
            spec = SearchSpec(text="canary rollout", top_k=3)
            before = await retriever.search(spec)
            await client.script_flush()
            alone = await retriever.search(spec)  # the read of the winners sent alone
            await client.script_flush()
            together = await asyncio.gather(*(retriever.search(spec) for _ in range(4)))  # in one pipeline
            for after in (alone, *together):
                assert [h.chunk.text for h in after.hits] == [h.chunk.text for h in before.hits]
            assert before.hits and before.hits[0].chunk.doc_id == "doc-0"
        finally:
            await index.drop()
