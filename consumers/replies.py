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
import time
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, UnknownTopicOrPartitionError
from aiokafka.protocol.metadata import MetadataRequest

from consumers.errors import UnknownReplyTopic
from consumers.topic_names import tenant_topic, topic_base, valid_topic
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


def default_reply_topic(replies: str, tenancy: str, tenant: str | None) -> str:
    """Where a reply goes without ``reply_to``: the replies topic, per tenant in topic tenancy.

    In topic tenancy a shared default would hand one tenant's chunks to every reader of it;
    ``<replies>.<tenant>`` is readable under the same ACLs as the tenant's other topics.
    A request on a topic that names no valid tenant has no tenant reply topic: the shared
    one gets its error (it carries nothing of any tenant).
    """
    if tenancy == "single" or tenant is None:
        return replies
    return tenant_topic(replies, tenant)


def own_reply_topic(replies: str, tenancy: str, tenant: str | None) -> str | None:
    """The reply topic a tenant's replies and acks must go to or under (``check_reply_to``'s
    ``own``): its own in topic tenancy; ``None`` (any) in single tenancy or for no tenant."""
    return None if tenancy != "topic" or tenant is None else default_reply_topic(replies, tenancy, tenant)


def shared_replies(replies: str, tenancy: str) -> str | None:
    """The replies topic that bounds every tenant's (``check_reply_to``'s ``replies``): in topic
    tenancy; ``None`` (no bound) in single tenancy."""
    return replies if tenancy == "topic" else None


def check_reply_to(topic: str, inputs: Sequence[str], own: str | None = None, replies: str | None = None) -> None:
    """Refuse a ``reply_to`` that is no valid topic name, is one of the daemon's inputs, or,
    in topic tenancy, is another tenant's reply topic (pure).

    ``inputs`` are the documents, transcripts, requests and DLQ topics; their tenant topics
    (``<input>.<tenant>``) count too. A reply published there would be read back as an event,
    a request or a dead letter. ``replies`` (topic tenancy only) is the replies topic, and
    ``own`` the record's tenant's, ``<replies>.<tenant>`` (None: its topic names no tenant): a
    reply may go there or under it (``<replies>.<tenant>.<name>``), or to the shared
    ``<replies>`` (an operator's client reads every tenant's answers there), never to a
    tenant's of another, which the daemon's own credentials could write to; a record of no
    tenant (on a bare topic) answers under no tenant's. Topics outside that namespace are the
    deployment's to name and protect.

    Raises:
        UnknownReplyTopic: with the reason.
    """
    if not valid_topic(topic):
        raise UnknownReplyTopic(f"reply_to header {topic!r} is not a valid topic name")
    if topic_base(topic, inputs) is not None:
        raise UnknownReplyTopic(f"reply_to {topic!r} is one of the daemon's input topics")
    if replies is None or (own is not None and (topic == own or topic.startswith(own + "."))):
        return
    if topic.startswith(replies + "."):
        mine = f"this tenant's replies go to {own!r}, a topic under it ({own}.<name>), or" if own else "go to"
        raise UnknownReplyTopic(
            f"reply_to {topic!r} is {'another' if own else 'a'} tenant's reply topic: {mine} the shared {replies!r}"
        )


# A lookup waits this long at most: a query worker must not hang on a topic nobody created.
LOOKUP_TIMEOUT_S = 3.0


class PartitionCounts:
    """How many partitions a topic has, from the broker's metadata (aiokafka caches it).

    Connected on first use: a deployment whose askers never name a reply partition never
    opens this connection. ``metadata_max_age_ms`` should be the reply producer's, so both
    learn of new partitions alike; a partition above the known count forces one refresh
    before it is refused.
    """

    def __init__(self, bootstrap: str, options: dict[str, Any] | None = None, *, metadata_max_age_ms: int = 5_000):
        self._bootstrap, self._options = bootstrap, dict(options or {})
        self._max_age_ms = metadata_max_age_ms
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()
        self._seen: dict[str, float] = {}  # topic -> until when it is known to exist (monotonic)

    async def _connected(self) -> AIOKafkaProducer:
        async with self._lock:
            if self._producer is None:
                producer = AIOKafkaProducer(
                    bootstrap_servers=self._bootstrap,
                    request_timeout_ms=int(LOOKUP_TIMEOUT_S * 1000),
                    metadata_max_age_ms=self._max_age_ms,
                    **self._options,
                )
                try:
                    await producer.start()
                except BaseException:
                    await producer.stop()  # its sockets and tasks, even half started
                    raise
                self._producer = producer
            return self._producer

    async def require(self, topic: str) -> None:
        """Check that ``topic`` exists, without ever creating it.

        A metadata request for one topic asks the broker to auto-create it where that is
        enabled (aiokafka's always do, as does Apache Kafka's default config, and tansu), so
        this asks with auto-creation off. Topics seen to exist are remembered for the
        metadata max age.

        Raises:
            UnknownReplyTopic: the broker does not know the topic.
            BackendUnavailable: the broker cannot be asked (within LOOKUP_TIMEOUT_S).
        """
        now = time.monotonic()
        if self._seen.get(topic, 0.0) > now:
            return
        try:
            producer = await self._connected()
            client = producer.client
            node = client.get_random_node()
            if node is None:
                await asyncio.wait_for(client.force_metadata_update(), LOOKUP_TIMEOUT_S)
                node = client.get_random_node()
            request = MetadataRequest([topic], allow_auto_topic_creation=False)
            response = await asyncio.wait_for(client.send(node, request), LOOKUP_TIMEOUT_S)
        except (KafkaError, TimeoutError) as exc:
            raise BackendUnavailable(f"cannot tell whether {topic!r} exists: {type(exc).__name__}: {exc}") from exc
        # Each topic entry starts (error_code, name, ...) in every version of the response.
        if not any(t[1] == topic and t[0] == 0 for t in response.topics):
            raise UnknownReplyTopic(f"reply_to topic {topic!r} does not exist")
        if len(self._seen) > 10_000:  # askers with ever new reply topics
            self._seen.clear()
        self._seen[topic] = now + self._max_age_ms / 1000

    async def count(self, topic: str, *, refresh: bool = False) -> int:
        """Partitions of ``topic``; ``refresh`` asks the broker first (else aiokafka's cache).

        Raises:
            UnknownReplyTopic: the broker does not know the topic.
            BackendUnavailable: the broker cannot be asked (within LOOKUP_TIMEOUT_S).
        """
        try:
            producer = await self._connected()
            if refresh:
                await asyncio.wait_for(producer.client.force_metadata_update(), LOOKUP_TIMEOUT_S)
            return len(await asyncio.wait_for(producer.partitions_for(topic), LOOKUP_TIMEOUT_S) or ())
        except UnknownTopicOrPartitionError as exc:
            raise UnknownReplyTopic(f"reply_to topic {topic!r} does not exist") from exc
        except (KafkaError, TimeoutError) as exc:
            raise BackendUnavailable(f"partitions of {topic!r} unknown: {type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        """Stop the producer whose metadata the counts are read from, if one was started."""
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.stop()


async def reply_partition(headers: list[tuple[str, bytes]] | None, topic: str, counts: PartitionCounts) -> int | None:
    """The validated partition of ``topic`` a reply goes to, or None (the default partitioner).

    Raises:
        InvalidRequest: the header is garbage or names a partition ``topic`` does not have.
        UnknownReplyTopic: ``topic`` does not exist.
        BackendUnavailable: the broker cannot say how many partitions ``topic`` has.
    """
    partition = parse_reply_partition(headers)
    if partition is None:
        return None
    have = await counts.count(topic)
    if partition >= have:  # partitions may have been added since aiokafka last looked
        have = await counts.count(topic, refresh=True)
    if partition >= have:
        raise InvalidRequest(
            f"{REPLY_PARTITION_HEADER} {partition} does not exist: topic {topic!r} has {have} partition(s)"
        )
    return partition


async def reply_route(
    topic: str,
    headers: list[tuple[str, bytes]] | None,
    counts: PartitionCounts,
    *,
    named: bool,
    inputs: Sequence[str],
    own: str | None = None,
    replies: str | None = None,
) -> int | None:
    """Check where a reply (a query's answer or a write's ack) may go; returns its partition.

    A topic the asker ``named`` (its ``reply_to``) must be a valid topic, none of the daemon's
    ``inputs``, under the tenant's ``own`` reply topic or the shared ``replies`` in topic tenancy, and exist: a reply
    never goes to garbage, an input or another tenant, and never makes a broker auto-create a
    topic (or waits on one nobody created).

    Raises:
        UnknownReplyTopic, InvalidRequest, BackendUnavailable: as ``check_reply_to``,
            ``PartitionCounts.require`` and ``reply_partition`` do.
    """
    if named:
        check_reply_to(topic, inputs, own, replies)
        await counts.require(topic)
    return await reply_partition(headers, topic, counts)
