"""Where a query's reply goes: the ``reply_to`` topic and, if the asker names one, a partition.

Why a reply partition (the ``reply_partition`` header, as Spring Kafka's request/reply has
it): without one, every asker that shares a reply topic reads all of its partitions and
drops the other askers' replies, so n askers read n times the replies between them. With
one, an asker reads its own partition only.

(It does not let an asker on tansu wait on the broker instead of polling: with a request
handler running, tansu held a one-partition reply fetch for its whole wait, 252 ms median
at a 500 ms wait against 7 ms at 5 ms, so readers poll every 5 ms there. Apache Kafka answers
a waiting fetch when data arrives. See bench/README.md.)
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from memory.errors import BackendUnavailable, InvalidRequest

REPLY_PARTITION_HEADER = "reply_partition"
# Kafka caps a topic's partitions far below this; longer digit strings are garbage.
_MAX_DIGITS = 9


def parse_reply_partition(headers: list[tuple[str, bytes]] | None) -> int | None:
    """The partition a request's ``reply_partition`` header names, or None without one (pure).

    Raises:
        InvalidRequest: the header is not a non-negative decimal integer.
    """
    raw = dict(headers or ()).get(REPLY_PARTITION_HEADER)
    if raw is None:
        return None
    text = raw.decode("utf-8", errors="replace").strip()
    if not (text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS):
        raise InvalidRequest(f"{REPLY_PARTITION_HEADER} header {text[:40]!r} is not a partition number")
    return int(text)


class PartitionCounts:
    """How many partitions a topic has, from the broker's metadata (aiokafka caches it).

    Connected on first use: a deployment whose askers never name a reply partition never
    opens this connection.
    """

    def __init__(self, bootstrap: str, options: dict[str, Any] | None = None) -> None:
        self._bootstrap, self._options = bootstrap, dict(options or {})
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()

    async def count(self, topic: str) -> int:
        """Partitions of ``topic`` (0 when the broker does not know it).

        Raises:
            BackendUnavailable: the broker cannot be asked.
        """
        try:
            async with self._lock:
                if self._producer is None:
                    producer = AIOKafkaProducer(
                        bootstrap_servers=self._bootstrap, request_timeout_ms=10_000, **self._options
                    )
                    await producer.start()
                    self._producer = producer
            return len(await self._producer.partitions_for(topic) or ())
        except KafkaError as exc:
            raise BackendUnavailable(f"partitions of {topic!r} unknown: {exc}") from exc

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None


async def reply_partition(headers: list[tuple[str, bytes]] | None, topic: str, counts: PartitionCounts) -> int | None:
    """The validated partition of ``topic`` a reply goes to, or None (the default partitioner).

    Raises:
        InvalidRequest: the header is garbage or names a partition ``topic`` does not have.
        BackendUnavailable: the broker cannot say how many partitions ``topic`` has.
    """
    partition = parse_reply_partition(headers)
    if partition is None:
        return None
    have = await counts.count(topic)
    if partition >= have:
        raise InvalidRequest(
            f"{REPLY_PARTITION_HEADER} {partition} does not exist: topic {topic!r} has {have} partition(s)"
        )
    return partition
