"""Idle polling: the daemon's idle subscribers wait longer per fetch, and a client fetches
replies only while it awaits one (``consumers.idle``, ``MemoryClient``), on the real broker.

The waits are read from the subscribers' own aiokafka fetchers, the attribute aiokafka builds
each fetch request from: an aiokafka that renamed it fails here, not silently in production.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from consumers.client import MemoryClient
from consumers.config import ConsumerConfig
from daemon.app import Daemon
from tests.conftest import unique
from tests.helpers import eventually
from tests.helpers.daemons import daemon_and_client
from tests.helpers.settings import isolated_settings

pytestmark = pytest.mark.integration

IDLE_AFTER_S = 4.0
IDLE_WAIT_MS = 400
TEXT = "The billing pool resets with ERR_CONN_RESET_4F2A when pgbouncer restarts."


def fetch_waits(daemon: Daemon) -> dict[str, int]:
    """Each subscriber's fetch wait as its aiokafka fetcher will send it, by role."""
    return {
        str(sub.group_id).rsplit(".", 1)[-1]: sub.consumer._fetcher._fetch_max_wait_ms
        for sub in daemon.broker.subscribers
    }


def reply_partitions_paused(client: MemoryClient) -> bool:
    consumer: Any = client._consumer
    return consumer is not None and bool(consumer.assignment()) and consumer.paused() == consumer.assignment()


async def test_idle_subscribers_wait_longer_and_their_next_record_restores_their_own_wait(
    kafka_bootstrap: str, redis_url: str
) -> None:
    name = unique(__name__)
    consumer = ConsumerConfig(group_id=name, idle_after_s=IDLE_AFTER_S, idle_fetch_max_wait_ms=IDLE_WAIT_MS)
    settings = isolated_settings(name, kafka_bootstrap, redis_url, consumer=consumer)
    own = {"documents": 20, "transcripts": 20, "requests": 5}
    assert (consumer.ingest_fetch_max_wait_ms, consumer.query_fetch_max_wait_ms) == (20, 5)
    async with daemon_and_client(settings) as (daemon, _plain):

        async def all_idle() -> bool:
            return fetch_waits(daemon) == dict.fromkeys(own, IDLE_WAIT_MS)

        await eventually(all_idle, timeout=IDLE_AFTER_S + 30, what="every subscriber backed off")
        async with MemoryClient(bootstrap=kafka_bootstrap, topics=settings.topics, timeout_s=60) as client:
            receipt = await client.publish_document("runbooks/billing.md", TEXT, version=1, wait=True)
            assert receipt.ack is not None and receipt.ack.status == "indexed"
            # The document's subscriber has its own wait back; the others, still idle, do not.
            assert fetch_waits(daemon) == {**own, "transcripts": IDLE_WAIT_MS, "requests": IDLE_WAIT_MS}
            # The client awaits nothing now: its reply reader is paused, and the next ask resumes it.
            assert reply_partitions_paused(client)
            replies = await asyncio.gather(*(client.query("ERR_CONN_RESET_4F2A", top_k=3) for _ in range(8)))
            assert all(r.results and r.results[0].doc_id == "runbooks/billing.md" for r in replies)
            assert fetch_waits(daemon)["requests"] == own["requests"]
            assert reply_partitions_paused(client)
            await eventually(all_idle, timeout=IDLE_AFTER_S + 30, what="backed off again")
            # The first question after the pause is answered (on tansu it may wait the idle wait once).
            reply = await client.query("pgbouncer restarts", top_k=3)
            assert reply.results[0].doc_id == "runbooks/billing.md"
