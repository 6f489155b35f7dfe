"""A daemon started with other settings than the index's does not join beside one that can use
it, and doctor names a running daemon that cannot (`daemon.presence`), through a real broker,
Redis and two daemons on one index."""

from __future__ import annotations

import pytest
import redis.asyncio as aredis

from daemon.doctor import diagnose
from daemon.presence import standings
from memory.config import ChunkingConfig
from memory.errors import IndexMismatch
from tests.conftest import unique
from tests.helpers import isolated_settings, start_daemon

pytestmark = pytest.mark.integration


async def test_a_daemon_that_cannot_use_the_index_does_not_join_beside_one_that_can(
    kafka_bootstrap: str, redis_url: str
) -> None:
    """Beside a daemon with the index's settings, one with another chunking refuses to start,
    saying why and how to mend it (it took half the partitions, failing their questions and
    holding their writes, while doctor was green). Alone it starts, as before (a reindex in
    another shell makes its index usable); once a daemon that can use the index joins it, doctor
    names the one that cannot. A daemon that stops withdraws its entry."""
    good = isolated_settings(unique("presence"), kafka_bootstrap, redis_url)
    wrong = good.model_copy(update={"chunking": ChunkingConfig(max_tokens=128, overlap=16)})
    first = await start_daemon(good)
    try:
        assert first.presence is not None
        await first.presence.say()
        with pytest.raises(IndexMismatch, match="so it does not start") as refused:
            await start_daemon(wrong)
        assert "chunking" in str(refused.value) and "agentmemd reindex" in str(refused.value)
        found = {f.check: f for f in await diagnose(good)}
        assert found["daemon settings"].ok and "1 daemon(s) running" in found["daemon settings"].detail, found
    finally:
        await first.stop()
    client = aredis.from_url(redis_url)
    try:
        assert await standings(client, good.index.name) == []  # withdrawn as it stopped
    finally:
        await client.aclose()

    alone = await start_daemon(wrong)  # nobody that can use the index: it starts, and says why not
    second = None
    try:
        second = await start_daemon(good)
        assert alone.presence is not None and second.presence is not None
        await alone.presence.say()
        await second.presence.say()
        said = {f.check: f for f in await diagnose(good)}["daemon settings"]
        assert not said.ok and "1 of 2 daemon(s) cannot use the index" in said.detail, said
        assert "chunking" in said.detail and "stop them" in said.fix, said
    finally:
        await alone.stop()
        if second is not None:
            await second.stop()
