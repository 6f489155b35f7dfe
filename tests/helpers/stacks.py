"""A memory of a test's own on the tests' Redis: its index, an ingestor and a retriever over it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis

from memory.config import ChunkingConfig, IndexConfig, IngestConfig, RetrievalConfig
from memory.index import ChunkIndex
from memory.ingest import Ingestor
from memory.retrieval import Retriever


@dataclass(frozen=True)
class Stack:
    client: aredis.Redis
    index: ChunkIndex
    ingestor: Ingestor
    retriever: Retriever


@contextlib.asynccontextmanager
async def memory_stack(redis_url: str, embedder: Any, name: str, **index_settings: Any) -> AsyncIterator[Stack]:
    """A fresh index named ``name`` (default settings but ``index_settings``), dropped when the block ends."""
    client = aredis.from_url(redis_url)
    index = ChunkIndex(client=client, cfg=IndexConfig(name=name, **index_settings), dims=embedder.dims)
    await index.drop()
    await index.ensure()
    ingestor = Ingestor(index=index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
    try:
        yield Stack(client, index, ingestor, Retriever(index=index, embedder=embedder, cfg=RetrievalConfig()))
    finally:
        await index.drop()
        await client.aclose()


async def settled(client: aredis.Redis, index_name: str) -> None:
    """Run RediSearch's GC on the index now, so that BM25's statistics hold still until the
    next write: the embedded Redis runs it every few seconds (``memory.server_policies``), and
    a run between two searches compared for equality changes their scores."""
    await client.execute_command("FT.DEBUG", "GC_FORCEINVOKE", index_name)
