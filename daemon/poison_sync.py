"""Poison queries shared between daemons: the query texts an embedding worker crashed on."""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from memory.embedder import SentenceTransformerEmbedder
from memory.errors import MemdError
from memory.poison import SharedPoison

log = structlog.get_logger()

#: How often a daemon shares the query texts its embedding worker crashed on, and learns the
#: others' (memory.poison): a poison query costs each other daemon at most this long of exposure.
POISON_SYNC_S = 5.0


async def sync_poison(shared: SharedPoison, embedder: SentenceTransformerEmbedder, halt: asyncio.Event) -> None:
    """Until ``halt``, every ``POISON_SYNC_S``, push this daemon's poison queries and learn the others'."""
    while not halt.is_set():
        try:
            pushed, learned = await shared.sync(embedder)
        except MemdError as exc:  # Redis away: the local list still refuses what this daemon found
            log.warning("embed.poison_sync_failed", error=str(exc))
        else:
            if pushed or learned:
                log.info("embed.poison_synced", pushed=pushed, learned=learned)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(halt.wait(), timeout=POISON_SYNC_S)
