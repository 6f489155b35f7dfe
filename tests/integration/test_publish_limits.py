"""`agentmemd publish doc` and `MemoryClient` publish documents up to the daemon's 4 MiB content
limit, past aiokafka's default max_request_size (~1 MB). Against the real broker: the event
topics are created with room for such records, the client's producer sends them, and what the
daemon would refuse never leaves the client."""

from __future__ import annotations

import json
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from consumers.client import MemoryClient
from consumers.config import Topics
from daemon.topics import ensure_topics
from memory.errors import InvalidEvent

pytestmark = pytest.mark.integration


async def _records(bootstrap: str, topic: str) -> list[bytes]:
    tp = TopicPartition(topic, 0)
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=5)
    await reader.start()
    try:
        reader.assign([tp])
        await reader.seek_to_beginning(tp)
        end = (await reader.end_offsets([tp]))[tp]
        out: list[bytes] = []
        while len(out) < end:
            batch = await reader.getmany(tp, timeout_ms=1000)
            out += [r.value for r in batch.get(tp, []) if r.value is not None]
        return out
    finally:
        await reader.stop()


async def _topics(bootstrap: str, max_content_bytes: int) -> Topics:
    run = uuid.uuid4().hex[:10]  # a topic per test: each reads its topics from the start
    topics = Topics(documents=f"big.documents.{run}", transcripts=f"big.transcripts.{run}")
    created = await ensure_topics(
        bootstrap,
        [topics.documents, topics.transcripts],
        partitions=1,
        replication=1,
        configs=topics.configs(max_content_bytes, 3_600_000),
    )
    assert set(created) == {topics.documents, topics.transcripts}
    return topics


async def test_a_document_over_kafkas_default_record_size_is_published_whole(kafka_bootstrap: str) -> None:
    topics = await _topics(kafka_bootstrap, 4 * 1024 * 1024)
    content = "The pgbouncer pool drained; ERR_POOL_DRAIN_7 marks it. " * 27_000  # ~1.5 MB
    async with MemoryClient(bootstrap=kafka_bootstrap, topics=topics) as client:
        await client.publish_document("big/manual.md", content, version=3)
    [value] = await _records(kafka_bootstrap, topics.documents)
    assert len(value) > 1024 * 1024
    event = json.loads(value)
    assert event["content"] == content and event["version"] == 3


async def test_content_over_the_limit_or_blank_never_leaves_the_client(kafka_bootstrap: str) -> None:
    topics = await _topics(kafka_bootstrap, 4096)
    async with MemoryClient(bootstrap=kafka_bootstrap, topics=topics, max_content_bytes=4096) as client:
        with pytest.raises(InvalidEvent, match="over the 4,096-byte limit"):
            await client.publish_document("big/over.md", "y" * 5000)
        with pytest.raises(InvalidEvent, match="content is empty"):
            await client.publish_document("big/empty.md", "")
        with pytest.raises(InvalidEvent, match="content is empty"):
            await client.publish_observation(agent_id="a", session_id="s", turn=1, content="  ")
        await client.publish_document("big/fits.md", "z" * 4000)
    assert [json.loads(v)["doc_id"] for v in await _records(kafka_bootstrap, topics.documents)] == ["big/fits.md"]
    assert await _records(kafka_bootstrap, topics.transcripts) == []


async def test_a_record_too_large_for_the_producer_is_an_invalid_event_that_says_what_to_raise(
    kafka_bootstrap: str,
) -> None:
    """Not an outage (BackendUnavailable would be retried for ever): the message names the
    topic setting that takes it."""
    topics = await _topics(kafka_bootstrap, 4 * 1024 * 1024)
    options = {"max_request_size": 100_000}
    async with MemoryClient(bootstrap=kafka_bootstrap, topics=topics, kafka_options=options) as client:
        with pytest.raises(InvalidEvent, match=r"refused a record of .* max\.message\.bytes"):
            await client.publish_document("big/200k.md", "w " * 100_000)
