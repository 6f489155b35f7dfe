"""The client's Kafka side: a producer that sends records, and a reply reader
(``consumers.reply_reader``) that hands each reply to the request that waits for its
``correlation_id``.

``MemoryClient`` (``consumers.client``) is the typed façade over it. Of the contract, this
module knows the headers that ask for a reply and what a reply says: a write ack
(``WriteRejected`` when dead-lettered) or a request's reply (``QueryFailed`` when an error).
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, MessageSizeTooLargeError, UnknownError

from consumers.encoding import encode_request
from consumers.errors import QueryFailed, WriteRejected
from consumers.events import WriteAck
from consumers.kafka_clients import stop_quietly
from consumers.log_repeats import quiet_kafka_repeats
from consumers.replies import REPLY_PARTITION_HEADER
from consumers.reply_reader import LOST_LOG_CHECK_S, ReplyReader
from consumers.requests import ErrorReply
from memory.errors import BackendUnavailable, InvalidEvent, NotFound


class KafkaTransport:
    """Sends events and requests, and reads their replies back by correlation id."""

    def __init__(
        self,
        *,
        bootstrap: str,
        reply_topic: str,
        reply_partition: int | None,
        reply_fetch_wait_ms: int,
        reply_idle_pause_s: float,
        timeout_s: float,
        kafka_options: dict[str, Any],
        max_request_size: int,
        shared_topics: frozenset[str] = frozenset(),
    ) -> None:
        """The arguments are ``MemoryClient``'s, which documents them; ``max_request_size``:
        the largest record the producer sends (unless ``kafka_options`` says otherwise);
        ``shared_topics``: the contract's own topics, which an event may be sent to before
        they exist (a daemon creates them); any other (a tenant's) must exist first."""
        self._bootstrap = bootstrap
        self._shared_topics = shared_topics
        self._existing: set[str] = set()
        self._timeout = timeout_s
        self._options = kafka_options
        self._max_request_size = max_request_size
        self._producer: AIOKafkaProducer | None = None
        self._replies = ReplyReader(
            bootstrap=bootstrap,
            topic=reply_topic,
            partition=reply_partition,
            fetch_wait_ms=reply_fetch_wait_ms,
            idle_pause_s=reply_idle_pause_s,
            kafka_options=kafka_options,
        )

    @property
    def reply_topic(self) -> str:
        """The topic this transport reads replies and acks on."""
        return self._replies.topic

    async def start(self) -> None:
        """Connect the producer, within the client's timeout: a broker that takes connections
        and never answers (hung, stopped) would hold it for aiokafka's 40 s request timeout.

        Raises:
            BackendUnavailable: the broker cannot be reached, or did not answer in time.
        """
        quiet_kafka_repeats()
        options = {"max_request_size": self._max_request_size, **self._options}
        self._producer = AIOKafkaProducer(bootstrap_servers=self._bootstrap, acks="all", linger_ms=0, **options)
        deadline = asyncio.timeout(self._timeout)
        try:
            async with deadline:
                await self._producer.start()
        except (KafkaError, TimeoutError) as exc:
            if isinstance(exc, TimeoutError) and not deadline.expired():
                raise
            # A producer that failed to start still holds its client: closed here, or asyncio
            # reports it unclosed at exit, noise under every refusal.
            await stop_quietly(self._producer, "producer")
            self._producer = None
            said = f"no answer within {self._timeout:g} s" if isinstance(exc, TimeoutError) else str(exc)
            raise BackendUnavailable(f"kafka at {self._bootstrap} unreachable: {said}") from exc

    async def close(self) -> None:
        """Stop the reply reader, its consumer and the producer.

        Each is stopped even if stopping another fails, or the reader died; such errors are
        logged (``client.stop_failed``), not raised.
        """
        try:
            await self._replies.close()
        finally:
            producer, self._producer = self._producer, None
            if producer is not None:
                await stop_quietly(producer, "producer")

    async def _send(self, topic: str, value: bytes, key: str, headers: list[tuple[str, bytes]] | None = None) -> int:
        """Send one record and wait for the broker to take it; returns its partition.

        Raises:
            InvalidEvent: the topic (or this producer) takes no record this large.
            BackendUnavailable: the broker could not take it.
        """
        if self._producer is None:
            raise RuntimeError("client not started")
        send = functools.partial(self._producer.send_and_wait, topic, value, key=key.encode(), headers=headers or [])
        try:
            try:
                sent = await send()
            except UnknownError:
                # tansu, back from a restart, can answer a record with UnknownError as it stores a
                # batch the producer held while it was down; sent again, it is taken. (An event sent
                # twice is applied once, a question twice is answered twice to one waiter.)
                sent = await send()
        except MessageSizeTooLargeError as exc:
            # Not an outage, and retrying cannot help: the topic (or this producer) takes
            # smaller records than this event needs, e.g. a topic created by hand, or by a
            # broker that refused the daemon's config (daemon.topic_config_refused).
            raise InvalidEvent(
                f"{topic} (or this producer) refused a record of {len(value):,} bytes: the topic's "
                f"max.message.bytes, or the producer's max_request_size, is below it ({exc})"
            ) from exc
        except KafkaError as exc:
            raise BackendUnavailable(f"publish to {topic} failed: {exc}") from exc
        return int(sent.partition)

    async def publish(
        self, topic: str, value: bytes, key: str, *, wait: bool, timeout_s: float | None
    ) -> WriteAck | None:
        """Send an event; with ``wait``, ask for its ack (``reply_to`` + ``correlation_id``) and
        return it once the daemon's writes are searchable.

        Raises:
            WriteRejected: the daemon dead-lettered it.
            TimeoutError: no ack within ``timeout_s`` (the client's when None); the event was sent
                and may still be applied.
            NotFound: (without ``wait``) a tenant's topic that does not exist; nothing was sent.
        """
        if not wait:
            if topic not in self._shared_topics:
                await self._require(topic)
            await self._send(topic, value, key)
            return None
        raw = await self._exchange(topic, value, key, timeout_s, "ack (the event was sent and may still be applied)")
        ack = WriteAck.model_validate_json(raw)
        if ack.status == "dead_lettered":
            raise WriteRejected(ack)
        return ack

    async def _hand_over(
        self,
        topic: str,
        value: bytes,
        key: str,
        headers: list[tuple[str, bytes]],
        limit: tuple[float, float],
        answer: str,
    ) -> int:
        """Start or wake the reply reader and send the record within the call's ``limit`` (its
        timeout in seconds, and the loop time it ends): a broker that is down would otherwise
        hold each for as long as it stays down.

        Raises:
            NotFound: the reply topic, or the reply partition, does not exist.
            BackendUnavailable: the broker did not take the record by then.
        """
        deadline = asyncio.timeout_at(limit[1])
        try:
            async with deadline:
                await self._replies.ensure()
                await self._replies.wake()
                return await self._send(topic, value, key, headers)
        except TimeoutError:
            if not deadline.expired():
                raise  # not this deadline's
            # The record may still be in the producer's queue, sent if the broker comes back soon:
            # harmless for a question (its reply is read by no one), not for an event.
            later = "" if answer == "reply" else "; the event may still be sent if the broker is back within 40 s"
            raise BackendUnavailable(
                f"kafka at {self._bootstrap} took no record on {topic} within {limit[0]:g} s: is the broker "
                f"up (`agentmemd doctor` says)?{later}"
            ) from None

    async def _await_reply(self, fut: asyncio.Future[bytes], wait: float) -> bytes:
        """``fut``'s reply within ``wait`` s; past each ``LOST_LOG_CHECK_S`` without it, the reply
        reader is checked (beside the wait, never in its way) for a log the broker lost under it.

        Raises:
            TimeoutError: no reply within ``wait``.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not fut.done():
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError
            await asyncio.wait({fut}, timeout=min(left, LOST_LOG_CHECK_S))
            if not fut.done():
                self._replies.check_lost_log()
        return fut.result()

    async def _require(self, topic: str) -> None:
        """Fail unless ``topic`` exists: a broker that creates topics on first use (tansu, or
        Kafka's auto.create.topics.enable) would take an event for a misspelt tenant, and a
        daemon in topic tenancy would make a tenant of it. (An awaited write finds out by its
        reply topic; one sent without waiting had nothing to tell it.)

        Raises:
            NotFound: the topic does not exist.
            BackendUnavailable: the broker could not be asked.
        """
        if topic in self._existing:
            return
        if self._producer is None:
            raise RuntimeError("client not started")
        try:
            cluster = await self._producer.client.fetch_all_metadata()
        except KafkaError as exc:
            raise BackendUnavailable(f"kafka at {self._bootstrap}: topics unread: {exc}") from exc
        self._existing |= set(cluster.topics())
        if topic not in self._existing:
            raise NotFound(
                f"topic {topic!r} does not exist: is the tenant spelt right? An operator creates a tenant's "
                "topics with `agentmemd topics --tenant NAME`; nothing was sent"
            )

    async def ask(self, topic: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Publish a request and wait for its reply's JSON; an error reply raises ``QueryFailed``.

        Raises:
            InvalidRequest: the payload holds text that UTF-8 cannot carry.
            QueryFailed: the daemon replied with an error.
            NotFound: the reply topic, or the reply partition, does not exist.
            BackendUnavailable: the broker cannot be reached, or the reply reader failed while
                this request waited (the next request starts a new one).
            TimeoutError: no reply within the client's timeout.
        """
        value = encode_request(payload)
        raw = await self._exchange(topic, value, payload["query_id"], None, "reply")
        data: dict[str, Any] = json.loads(raw)
        if "error" in data:
            raise QueryFailed(ErrorReply.model_validate(data))
        return data

    async def _exchange(self, topic: str, value: bytes, key: str, timeout_s: float | None, answer: str) -> bytes:
        """Publish a record with reply headers and wait for the reply with its correlation id.

        Raises:
            BackendUnavailable: the broker took no record within the call's timeout.
            TimeoutError: no ``answer`` in time, saying where the record went and where the
                answer was awaited (a bare TimeoutError left users guessing).
        """
        cid = uuid.uuid4().hex
        replies = self._replies
        fut = replies.expect(cid)
        headers = [("reply_to", replies.topic.encode()), ("correlation_id", cid.encode())]
        if replies.partition is not None:
            headers.append((REPLY_PARTITION_HEADER, str(replies.partition).encode()))
        wait = self._timeout if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        try:
            partition = await self._hand_over(topic, value, key, headers, (wait, deadline), answer)
            try:
                return await self._await_reply(fut, deadline - loop.time())
            except TimeoutError:
                # A write waits for what came before it on its partition; a question for nothing.
                behind = (
                    f", or still busy with what came before it on partition {partition} (a large document "
                    "takes minutes to embed, and the status page's lag table says which partition one holds; "
                    "wait longer with timeout_s, or --timeout in the CLI)"
                    if answer != "reply"
                    else ", or overloaded (the status page shows its question latency)"
                )
                raise TimeoutError(
                    f"no {answer} from the memory daemon within {wait:g} s on {replies.topic}: is a "
                    f"daemon running and reading {topic}? Is it ready (`agentmemd doctor` says what it waits "
                    f"for){behind}?"
                ) from None
        finally:
            replies.done_with(cid, fut)
