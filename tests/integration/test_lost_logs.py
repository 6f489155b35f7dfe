"""A consumer is rewound only from a log the broker lost, never from a healthy one whose
producer batched its records (tansu's end offsets count the last batch as one record)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumers.kafka_clients import lost_partitions, past_log_end
from daemon.lost_logs import log_ends
from daemon.topics import ensure_topics
from tests.conftest import unique

pytestmark = pytest.mark.integration


def test_a_position_is_past_the_end_only_when_watermark_and_end_offset_agree() -> None:
    assert past_log_end(120, 100, 90)
    assert not past_log_end(100, 100, 1)  # read to the end of a batched log: tansu's end offset is 1
    assert not past_log_end(120, 130, 90)  # the watermark of the last fetch says the log goes on
    assert not past_log_end(120, None, 90)  # no fetch yet: nothing known
    assert not past_log_end(120, 100, None)


async def _consume(consumer: AIOKafkaConsumer, n: int) -> int:
    got = 0
    for _ in range(50):
        batch = await consumer.getmany(timeout_ms=200)
        got += sum(len(v) for v in batch.values())
        if got >= n:
            break
    return got


async def test_a_consumer_at_the_end_of_a_batched_log_stays_and_one_past_a_shorter_log_is_found(
    kafka_bootstrap: str,
) -> None:
    topic = unique("lost-logs")
    await ensure_topics(kafka_bootstrap, [topic], partitions=1, replication=1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=20)
    await producer.start()
    try:
        sent = [await producer.send(topic, b"r%d" % i, key=b"k") for i in range(100)]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka_bootstrap, enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=5
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        assert await _consume(consumer, 100) == 100
        assert await consumer.position(tp) == 100
        assert await lost_partitions(consumer) == []  # healthy, whatever the broker's end offsets say

        # A log shorter than the position, as after the broker lost it: the next fetch answers
        # nothing with a watermark below the position.
        consumer.seek(tp, 500)
        await consumer.getmany(timeout_ms=300)
        for _ in range(20):
            if consumer.highwater(tp) is not None:
                break
            await consumer.getmany(timeout_ms=100)
        assert await lost_partitions(consumer) == [(tp, 500, 100)]
    finally:
        await consumer.stop()


async def test_log_ends_are_the_watermark_where_the_end_offset_counts_a_batch_as_one(kafka_bootstrap: str) -> None:
    """Lag and "committed past the end" (/readyz, doctor) are measured against log_ends."""
    topic = unique("log-ends")
    await ensure_topics(kafka_bootstrap, [topic], partitions=2, replication=1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=20)
    await producer.start()
    try:
        sent = [await producer.send(topic, b"r%d" % i, partition=0) for i in range(40)]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    probe = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, fetch_max_wait_ms=5, max_partition_fetch_bytes=4096)
    await probe.start()
    try:
        tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        assert await log_ends(probe, tps) == {tps[0]: 40, tps[1]: 0}
    finally:
        await probe.stop()
