"""A daemon started with other settings than the index's stands aside for one that can use it
(`daemon.presence`), through a real broker, Redis and two daemons on one index."""

from __future__ import annotations

import uuid

import pytest

from consumers.client import MemoryClient
from consumers.errors import QueryFailed
from daemon.doctor import diagnose
from memory.config import ChunkingConfig
from tests.conftest import unique
from tests.helpers import eventually, isolated_settings, start_daemon

pytestmark = pytest.mark.integration


async def test_a_daemon_that_cannot_use_the_index_stands_aside_for_one_that_can(
    kafka_bootstrap: str, redis_url: str
) -> None:
    """A second daemon with another chunking joins the groups, sees a daemon that can use the
    index and leaves them: every question is answered and every write applied by the first,
    and doctor names the second. Once the first stops, the second joins again and answers
    `unavailable` with the reason, rather than leaving askers to time out."""
    good = isolated_settings(unique("presence"), kafka_bootstrap, redis_url)
    wrong = good.model_copy(update={"chunking": ChunkingConfig(max_tokens=128, overlap=16)})
    first = await start_daemon(good)
    second = None
    try:
        second = await start_daemon(wrong)
        presence = second.presence
        assert presence is not None

        async def aside() -> bool:
            return presence.aside

        await eventually(aside, timeout=30, what="the second daemon standing aside")
        async with MemoryClient(bootstrap=kafka_bootstrap, topics=good.topics, timeout_s=30) as client:
            for n in range(6):  # two partitions, each key its own: both daemons' shares before
                sent = await client.publish_document(f"aside/{n}.md", f"note {n} about the kestrel", wait=True)
                assert sent.ack is not None and sent.ack.status == "indexed", sent
            for n in range(12):
                reply = await client.query(f"kestrel note {n}", top_k=3, query_id=uuid.uuid4().hex)
                assert reply.results, reply
        found = {f.check: f for f in await diagnose(good)}
        said = found["daemon settings"]
        assert not said.ok and "1 of 2 daemon(s) cannot use the index" in said.detail, said
        assert "standing aside" in said.detail and "chunking" in said.detail, said
        await first.stop()

        async def joined() -> bool:
            return not presence.aside

        await eventually(joined, timeout=45, what="the second daemon joining again")
        async with MemoryClient(bootstrap=kafka_bootstrap, topics=good.topics, timeout_s=30) as client:
            with pytest.raises(QueryFailed, match="unavailable"):
                await client.query("kestrel", top_k=3)
    finally:
        await first.stop()
        if second is not None:
            await second.stop()
