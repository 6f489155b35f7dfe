"""Dropping a generation kept beside the active one (`agentmemd drop-generation`)."""

from __future__ import annotations

from typing import Any

import structlog

from daemon.settings import Settings
from memory.errors import NotFound, ReindexConflict, ReindexWouldLose
from memory.index import ChunkIndex, GenerationRegistry, translate_errors
from memory.schema import generation_of, info_index_name, key_root

log = structlog.get_logger()


async def drop_generation(settings: Settings, redis: Any, generation: int, *, force: bool = False) -> int:
    """Drop a generation kept beside the active one (``--keep-old``, a reindex that kept it,
    one left by a reindex that died): its index, chunk hashes and bookkeeping keys. Returns
    how many keys went.

    Raises:
        ReindexConflict: it is the active generation, or a live reindex is building it.
        ReindexWouldLose: a reindex kept it because the active one lacks some of its docs
            (unless ``force``).
        NotFound: no such generation.
    """
    registry = GenerationRegistry(redis, settings.index.name)
    async with translate_errors("generation drop"):
        why = (await registry.kept()).get(generation)
        if why and not force:
            raise ReindexWouldLose(
                f"generation {generation} was kept by a reindex: {why}. Dropping it loses those docs; "
                "pass --force to drop it anyway"
            )
        alias = await registry.alias_info()
        if alias is not None and generation_of(settings.index.name, info_index_name(alias)) == generation:
            raise ReindexConflict(
                f"generation {generation} is the active one: the alias {settings.index.name!r} points at it"
            )
        root = key_root(settings.index.name, generation)
        keys = [k async for k in redis.scan_iter(match=root + "*", count=1000)]
        if generation not in await registry.listed() and not keys:
            raise NotFound(f"index {settings.index.name!r} has no generation {generation}")
        await registry.unregister(generation)
    index = ChunkIndex(client=redis, cfg=settings.index, dims=1, generation=generation)
    await index.drop()
    log.info("reindex.generation_dropped", index=settings.index.name, generation=generation, keys=len(keys))
    return len(keys)
