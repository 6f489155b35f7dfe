"""The client's Kafka side: a producer that sends records, and a reply reader that hands each
reply to the request that waits for its ``correlation_id``.

``MemoryClient`` (``consumers.client``) is the typed façade over it. Of the contract, this
module knows the headers that ask for a reply and what a reply says: a write ack
(``WriteRejected`` when dead-lettered) or a request's reply (``QueryFailed`` when an error).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, MessageSizeTooLargeError

from consumers.encoding import encode
from consumers.errors import QueryFailed, WriteRejected
from consumers.events import WriteAck
from consumers.replies import REPLY_PARTITION_HEADER
from consumers.requests import ErrorReply
from memory.errors import BackendUnavailable, InvalidEvent, NotFound

log = structlog.get_logger()


async def cluster_metadata(consumer: AIOKafkaConsumer) -> Any:
    """The whole cluster's topics and partitions, read fresh (``.topics()``,
    ``.partitions_for_topic(t)``). A consumer's own metadata lists only the topics it tracks:
    none without a subscription (on Apache Kafka a bootstrap's empty topic list is answered
    with none), only its own after ``assign``, none created since. aiokafka has no public
    call returning partitions."""
    return await consumer._client.fetch_all_metadata()


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
        self._reply_topic = reply_topic
        self._reply_partition = reply_partition
        self._reply_wait_ms = reply_fetch_wait_ms
        self._idle_pause_s = reply_idle_pause_s
        self._pause_timer: asyncio.TimerHandle | None = None
        self._paused: AIOKafkaConsumer | None = None  # the reader's consumer while it is paused
        self._waking: asyncio.Task[None] | None = None
        self._timeout = timeout_s
        self._options = kafka_options
        self._max_request_size = max_request_size
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._pending: dict[str, asyncio.Future[bytes]] = {}
        self._reader: asyncio.Task[None] | None = None
        # Starting the reader awaits the broker: without the lock, queries racing to start it
        # would each start a consumer, and only the last would ever be stopped.
        self._reader_lock = asyncio.Lock()

    @property
    def reply_topic(self) -> str:
        """The topic this transport reads replies and acks on."""
        return self._reply_topic

    async def start(self) -> None:
        """Connect the producer.

        Raises:
            BackendUnavailable: the broker cannot be reached.
        """
        options = {"max_request_size": self._max_request_size, **self._options}
        self._producer = AIOKafkaProducer(bootstrap_servers=self._bootstrap, acks="all", linger_ms=0, **options)
        try:
            await self._producer.start()
        except KafkaError as exc:
            # A producer that failed to start still holds its client: closed here, or asyncio
            # reports it unclosed at exit, noise under every refusal.
            await _stop_quietly(self._producer, "producer")
            self._producer = None
            raise BackendUnavailable(f"kafka at {self._bootstrap} unreachable: {exc}") from exc

    async def _ensure_reader(self) -> None:
        """Start the reply reader, or a new one if the last one died.

        Raises:
            NotFound: the reply topic, or the reply partition asked for, does not exist.
            BackendUnavailable: the broker cannot be read.
        """
        async with self._reader_lock:
            if self._reader is not None and not self._reader.done():
                return
            # A dead reader already failed the queries it held; its consumer may still be open.
            await self._stop_reader()
            consumer = await self._start_consumer()
            self._consumer = consumer
            self._reader = asyncio.create_task(self._read_replies(consumer))

    async def _start_consumer(self) -> AIOKafkaConsumer:
        # No consumer group: every client reads the reply partitions (all, or its own) from
        # "now" and picks its own correlation ids, so many clients can share one reply topic.
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            fetch_max_wait_ms=self._reply_wait_ms,
            enable_auto_commit=False,
            **self._options,
        )
        try:
            try:
                await consumer.start()
                cluster = await cluster_metadata(consumer)
                tps = self._reply_partitions(cluster.partitions_for_topic(self._reply_topic))
                consumer.assign(tps)
                await consumer.seek_to_end(*tps)
                for tp in tps:
                    await consumer.position(tp)
            except KafkaError as exc:
                raise BackendUnavailable(f"reply topic {self._reply_topic!r} unreadable: {exc}") from exc
        except BaseException:
            # One turn of the loop first: aiokafka's stop() awaits a task it cancels, and a task
            # cancelled before it ever ran raises CancelledError out of stop().
            await asyncio.sleep(0)
            await _stop_quietly(consumer, "reply consumer")
            raise
        return consumer

    def _reply_partitions(self, parts: set[int] | None) -> list[TopicPartition]:
        """The reply partitions to read, of those the topic has (``None``: no such topic).

        Raises:
            NotFound: the topic, or the partition asked for, does not exist.
        """
        if not parts:
            raise NotFound(
                f"reply topic {self._reply_topic!r} does not exist: a daemon creates the shared topics as it "
                "starts (is one running against this broker?), an operator a tenant's with `agentmemd topics "
                "--tenant NAME` (is the tenant spelt right?); a reply topic of your own must be created first"
            )
        if self._reply_partition is not None:
            if self._reply_partition not in parts:
                raise NotFound(f"reply topic {self._reply_topic!r} has no partition {self._reply_partition}")
            parts = {self._reply_partition}
        return [TopicPartition(self._reply_topic, p) for p in sorted(parts)]

    async def _read_replies(self, consumer: AIOKafkaConsumer) -> None:
        why, cause = "stopped", None
        try:
            async for msg in consumer:
                headers = {k: v for k, v in (msg.headers or ())}
                cid = (headers.get("correlation_id") or b"").decode("utf-8", "replace")
                fut = self._pending.pop(cid, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg.value or b"")
        except asyncio.CancelledError:
            why = "was closed"
            raise
        except Exception as exc:  # whatever it was, nobody else would see it: the task just ends
            log.warning("client.reply_reader_failed", topic=self._reply_topic, error=f"{type(exc).__name__}: {exc}")
            why, cause = f"failed ({type(exc).__name__}: {exc})", exc
        finally:
            # Nothing reads their replies any more (the loop ended, failed, or the client was
            # closed under them): fail them now rather than at their timeouts. The next query
            # starts a new reader (the task is done from here on).
            message = f"the reply reader of {self._reply_topic!r} {why}; the next query restarts it"
            pending, self._pending = self._pending, {}
            for fut in pending.values():
                if not fut.done():
                    error = BackendUnavailable(message)
                    error.__cause__ = cause
                    fut.set_exception(error)

    async def _stop_reader(self) -> None:
        self._cancel_pause()
        reader, self._reader = self._reader, None
        consumer, self._consumer = self._consumer, None
        if reader is not None:
            reader.cancel()
            # asyncio.wait, unlike awaiting it, never raises what it raised; bounded, since a
            # cancellation can be lost inside a client library (wait_for on Python 3.11).
            await asyncio.wait([reader], timeout=5)
        if consumer is not None:
            await _stop_quietly(consumer, "reply consumer")
        if reader is not None and not reader.done():
            await asyncio.wait([reader], timeout=5)  # a stopped consumer ends its loop
            if not reader.done():
                log.warning("client.reply_reader_stuck", topic=self._reply_topic)

    async def close(self) -> None:
        """Stop the reply reader, its consumer and the producer.

        Each is stopped even if stopping another fails, or the reader died; such errors are
        logged (``client.stop_failed``), not raised.
        """
        try:
            async with self._reader_lock:  # a reader being started is stopped, not leaked
                await self._stop_reader()
        finally:
            producer, self._producer = self._producer, None
            if producer is not None:
                await _stop_quietly(producer, "producer")

    async def _send(self, topic: str, value: bytes, key: str, headers: list[tuple[str, bytes]] | None = None) -> int:
        """Send one record and wait for the broker to take it; returns its partition.

        Raises:
            InvalidEvent: the topic (or this producer) takes no record this large.
            BackendUnavailable: the broker could not take it.
        """
        if self._producer is None:
            raise RuntimeError("client not started")
        try:
            sent = await self._producer.send_and_wait(topic, value, key=key.encode(), headers=headers or [])
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
        await self._ensure_reader()
        raw = await self._exchange(topic, value, key, timeout_s, "ack (the event was sent and may still be applied)")
        ack = WriteAck.model_validate_json(raw)
        if ack.status == "dead_lettered":
            raise WriteRejected(ack)
        return ack

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
            QueryFailed: the daemon replied with an error.
            NotFound: the reply topic, or the reply partition, does not exist.
            BackendUnavailable: the broker cannot be reached, or the reply reader failed while
                this request waited (the next request starts a new one).
            TimeoutError: no reply within the client's timeout.
        """
        await self._ensure_reader()
        raw = await self._exchange(topic, encode(payload), payload["query_id"], None, "reply")
        data: dict[str, Any] = json.loads(raw)
        if "error" in data:
            raise QueryFailed(ErrorReply.model_validate(data))
        return data

    async def _exchange(self, topic: str, value: bytes, key: str, timeout_s: float | None, answer: str) -> bytes:
        """Publish a record with reply headers and wait for the reply with its correlation id.

        Raises:
            TimeoutError: no ``answer`` in time, saying where the record went and where the
                answer was awaited (a bare TimeoutError left users guessing).
        """
        cid = uuid.uuid4().hex
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[cid] = fut
        headers = [("reply_to", self._reply_topic.encode()), ("correlation_id", cid.encode())]
        if self._reply_partition is not None:
            headers.append((REPLY_PARTITION_HEADER, str(self._reply_partition).encode()))
        try:
            await self._wake_reader()
            partition = await self._send(topic, value, key, headers)
            wait = self._timeout if timeout_s is None else timeout_s
            try:
                return await asyncio.wait_for(fut, timeout=wait)
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
                    f"no {answer} from the memory daemon within {wait:g} s on {self._reply_topic}: is a "
                    f"daemon running and reading {topic}? Is it ready (`agentmemd doctor` says what it waits "
                    f"for){behind}? (in topic tenancy, the client needs the tenant)"
                ) from None
        finally:
            self._pending.pop(cid, None)
            if not self._pending:
                self._pause_later()
            if fut.done() and not fut.cancelled():
                fut.exception()  # seen: a reader failure during a failed send is no "never retrieved"

    # With tansu's short fetch waits an idle client's reader polled ~200 times a second; paused,
    # it sends no fetch at all (consumers.idle does the same for the daemon's subscribers).

    def _cancel_pause(self) -> None:
        if self._pause_timer is not None:
            self._pause_timer.cancel()
            self._pause_timer = None

    def _pause_later(self) -> None:
        """Pause the reader once no reply has been awaited for ``reply_idle_pause_s``."""
        self._cancel_pause()
        if self._idle_pause_s > 0:
            self._pause_timer = asyncio.get_running_loop().call_later(self._idle_pause_s, self._pause_reader)

    def _pause_reader(self) -> None:
        self._pause_timer = None
        consumer = self._consumer
        if self._pending or consumer is None or self._paused is not None:  # (waking: still paused)
            return
        consumer.pause(*consumer.assignment())
        self._paused = consumer

    async def _wake_reader(self) -> None:
        """Before a request is sent: a paused reader moved to the end of its partitions and
        resumed. Every request sent meanwhile waits for the same move: a reply sent before the
        move completed could be skipped by it."""
        self._cancel_pause()
        if self._paused is None:
            return
        if self._waking is None:
            self._waking = asyncio.create_task(self._catch_up(self._paused))
        await asyncio.shield(self._waking)

    async def _catch_up(self, consumer: AIOKafkaConsumer) -> None:
        replaced = consumer is not self._consumer  # a fresh reader starts at the end, unpaused
        try:
            if not replaced:
                tps = consumer.assignment()
                await consumer.seek_to_end(*tps)
                for tp in tps:
                    await consumer.position(tp)  # the reset done (it runs while paused)
        finally:
            # Resumed even if the move failed: reading the pile is slower, never deaf.
            consumer.resume(*consumer.assignment())
            self._paused = self._waking = None


async def _stop_quietly(client: AIOKafkaConsumer | AIOKafkaProducer, what: str) -> None:
    """Stop an aiokafka client; a failure is logged, so the caller goes on to stop the rest."""
    try:
        await client.stop()
    except Exception as exc:
        log.warning("client.stop_failed", client=what, error=f"{type(exc).__name__}: {exc}")
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # this close is being cancelled
        # With the broker gone, aiokafka's stop can end in its own task's cancellation: a failed
        # stop like any other, not a traceback in place of the caller's error.
        log.warning("client.stop_failed", client=what, error="CancelledError inside the client library")
