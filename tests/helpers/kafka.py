"""A plain aiokafka client of the contract, and a reader of the dead-letter topic."""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumers.config import Topics

if TYPE_CHECKING:
    pass


class PlainClient:
    """What any Kafka client does: JSON in, reply_to + correlation_id headers, read replies."""

    def __init__(self, bootstrap: str, topics: Topics, reply_topic: str) -> None:
        self.bootstrap, self.topics, self.reply_topic = bootstrap, topics, reply_topic
        self.producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        self.replies = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=5)
        self.seen: dict[str, tuple[dict[str, bytes], dict[str, Any]]] = {}

    async def start(self) -> None:
        await self.producer.start()
        await self.replies.start()
        tps = [TopicPartition(self.reply_topic, p) for p in self.replies.partitions_for_topic(self.reply_topic) or []]
        self.replies.assign(tps)
        await self.replies.seek_to_beginning(*tps)

    async def stop(self) -> None:
        await self.producer.stop()
        await self.replies.stop()

    async def send(
        self, topic: str, payload: Any, key: str = "k", headers: list[tuple[str, bytes]] | None = None
    ) -> None:
        value = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        await self.producer.send_and_wait(topic, value, key=key.encode(), headers=headers or [])

    async def ask(
        self, payload: Any, *, reply_to: str | None = None, timeout: float = 20.0
    ) -> tuple[dict[str, bytes], dict[str, Any]]:
        cid = uuid.uuid4().hex
        headers = [("correlation_id", cid.encode())]
        headers.append(("reply_to", (reply_to or self.reply_topic).encode()))
        await self.send(self.topics.requests, payload, headers=headers)
        return await self.reply(cid, timeout)

    async def reply(self, cid: str, timeout: float = 20.0) -> tuple[dict[str, bytes], dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while cid not in self.seen:
            if time.monotonic() > deadline:
                raise AssertionError(f"no reply for correlation_id {cid}")
            batch = await self.replies.getmany(timeout_ms=100)
            for records in batch.values():
                for r in records:
                    h = dict(r.headers)
                    self.seen[h.get("correlation_id", b"").decode()] = (h, json.loads(r.value))
        return self.seen.pop(cid)


async def read_dlq(client: PlainClient, want: int, timeout: float = 30) -> list[dict[str, Any]]:
    """Dead letters from the start of the DLQ topic, until ``want`` are read or ``timeout``
    (each with its record's Kafka key in hex as ``_kafka_key_hex``)."""
    consumer = AIOKafkaConsumer(
        client.topics.dlq,
        bootstrap_servers=client.bootstrap,
        auto_offset_reset="earliest",
        group_id=f"dlq-reader-{uuid.uuid4().hex}",
        fetch_max_wait_ms=5,
    )
    await consumer.start()
    out: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout
        while len(out) < want and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                # The record's own Kafka key rides along (as hex, so a record stays plain JSON),
                # under a name no DLQ body has.
                out += [{**json.loads(r.value), "_kafka_key_hex": r.key and r.key.hex()} for r in records]
    finally:
        await consumer.stop()
    return out
