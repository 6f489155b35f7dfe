"""The generation registry's errors reach the daemon translated, whichever call meets them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from daemon.launcher import free_port
from memory.errors import BackendUnavailable, ReindexConflict
from memory.index import GenerationRegistry
from tests.conftest import unique

CALLS: dict[str, Callable[[GenerationRegistry], Awaitable[object]]] = {
    "state": lambda r: r.state(),
    "adopted": lambda r: r.adopted(),
    "kept": lambda r: r.kept(),
    "unregister": lambda r: r.unregister(3),
    "listed": lambda r: r.listed(),
    "alias_info": lambda r: r.alias_info(),
    "heartbeat": lambda r: r.heartbeat("owner"),
    "release": lambda r: r.release("owner"),
}


@pytest.mark.parametrize("call", sorted(CALLS))
async def test_a_registry_without_redis_raises_backend_unavailable(call: str) -> None:
    """Each registry call made while Redis is unreachable raises ``BackendUnavailable``
    naming the registry, not a redis-py exception."""
    client = aredis.Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    try:
        with pytest.raises(BackendUnavailable, match="generations"):
            await CALLS[call](GenerationRegistry(client, "gone"))
    finally:
        await client.aclose()


async def test_registry_refusals_stay_reindex_conflicts(redis_url: str) -> None:
    """On a live Redis a refused change is still the registry's own error: a heartbeat for a
    slot nobody holds is a ``ReindexConflict``."""
    client = aredis.Redis.from_url(redis_url)
    try:
        with pytest.raises(ReindexConflict, match="taken over"):
            await GenerationRegistry(client, unique("registry")).heartbeat("nobody")
    finally:
        await client.aclose()
