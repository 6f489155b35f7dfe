"""Idle polling: the daemon's idle subscribers wait longer per fetch, and a client fetches
replies only while it awaits one (``consumers.idle``, ``MemoryClient``), on the real broker.

The waits are read from the subscribers' own aiokafka fetchers, the attribute aiokafka builds
each fetch request from: an aiokafka that renamed it fails here, not silently in production.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

import consumers.reply_reader
from consumers.client import MemoryClient
from consumers.config import ConsumerConfig
from daemon.instance import Daemon
from tests.conftest import unique
from tests.helpers import eventually
from tests.helpers.daemons import daemon_and_client
from tests.helpers.settings import isolated_settings

pytestmark = pytest.mark.integration

IDLE_AFTER_S = 4.0
IDLE_WAIT_MS = 400
PAUSE_S = 1.0
TEXT = "The billing pool resets with ERR_CONN_RESET_4F2A when pgbouncer restarts."


def fetch_waits(daemon: Daemon) -> dict[str, int]:
    """Each subscriber's fetch wait as its aiokafka fetcher will send it, by role."""
    return {
        str(sub.group_id).rsplit(".", 1)[-1]: sub.consumer._fetcher._fetch_max_wait_ms
        for sub in daemon.broker.subscribers
    }


def reply_partitions_paused(client: MemoryClient) -> bool:
    consumer: Any = client._transport._replies._consumer
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
        async with MemoryClient(
            bootstrap=kafka_bootstrap, topics=settings.topics, timeout_s=60, reply_idle_pause_s=PAUSE_S
        ) as client:

            async def paused() -> bool:
                return reply_partitions_paused(client)

            receipt = await client.publish_document("runbooks/billing.md", TEXT, version=1, wait=True)
            assert receipt.ack is not None and receipt.ack.status == "indexed"
            # The document's subscriber has its own wait back; the others, still idle, do not.
            assert fetch_waits(daemon) == {**own, "transcripts": IDLE_WAIT_MS, "requests": IDLE_WAIT_MS}
            # The client has awaited nothing for a while: its reply reader is paused, and the next
            # ask resumes it.
            await eventually(paused, timeout=PAUSE_S + 20, what="the client's reader paused")
            replies = await asyncio.gather(*(client.query("ERR_CONN_RESET_4F2A", top_k=3) for _ in range(8)))
            assert all(r.results and r.results[0].doc_id == "runbooks/billing.md" for r in replies)
            assert fetch_waits(daemon)["requests"] == own["requests"]
            assert not reply_partitions_paused(client)
            await eventually(paused, timeout=PAUSE_S + 20, what="the client's reader paused again")
            await eventually(all_idle, timeout=IDLE_AFTER_S + 30, what="backed off again")
            # The first question after the pause is answered (on tansu it may wait the idle wait once).
            reply = await client.query("pgbouncer restarts", top_k=3)
            assert reply.results[0].doc_id == "runbooks/billing.md"


class RecordingConsumer(AIOKafkaConsumer):
    """The client's real reply consumer, noting the offset of every record it returns."""

    read: ClassVar[list[tuple[int, int]]] = []

    async def getone(self, *partitions: Any) -> Any:
        record = await super().getone(*partitions)
        RecordingConsumer.read.append((record.partition, record.offset))
        return record


async def test_a_paused_client_skips_the_replies_others_got_meanwhile(
    kafka_bootstrap: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two clients on the default reply topic: while one is paused the other's replies pile up on
    the partitions it reads; its next question moves it past them first, and is answered."""
    name = unique(__name__)
    settings = isolated_settings(name, kafka_bootstrap, redis_url)
    async with daemon_and_client(settings) as (_daemon, _plain):
        busy = MemoryClient(bootstrap=kafka_bootstrap, topics=settings.topics, timeout_s=60)
        idle = MemoryClient(bootstrap=kafka_bootstrap, topics=settings.topics, timeout_s=60, reply_idle_pause_s=PAUSE_S)
        async with busy, idle:
            await busy.publish_document("runbooks/billing.md", TEXT, version=1, wait=True)
            RecordingConsumer.read = []
            monkeypatch.setattr(consumers.reply_reader, "AIOKafkaConsumer", RecordingConsumer)
            await idle.query("pgbouncer restarts", top_k=1)  # starts the idle client's reader
            monkeypatch.undo()
            assert isinstance(idle._transport._replies._consumer, RecordingConsumer) and RecordingConsumer.read

            async def paused() -> bool:
                return reply_partitions_paused(idle)

            await eventually(paused, timeout=PAUSE_S + 20, what="the idle client's reader paused")
            for _ in range(5):
                await asyncio.gather(*(busy.query("ERR_CONN_RESET_4F2A", top_k=3) for _ in range(8)))
            consumer: Any = idle._transport._replies._consumer
            before = len(RecordingConsumer.read)
            ends = await consumer.end_offsets(list(consumer.assignment()))
            reply = await idle.query("ERR_CONN_RESET_4F2A", top_k=3)
            assert reply.results[0].doc_id == "runbooks/billing.md"
            # Nothing of the pile was read: every record read since starts at the ends seen above.
            read = RecordingConsumer.read[before:]
            assert read and all(offset >= ends[TopicPartition(settings.topics.replies, p)] for p, offset in read)
