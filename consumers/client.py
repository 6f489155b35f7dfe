"""A small typed async client of the wire contract, on plain aiokafka.

Any language's Kafka client can do the same: publish JSON, set ``reply_to`` and
``correlation_id`` headers (and optionally ``reply_partition``), read the reply topic (or
that partition of it) for the matching ``correlation_id``.
"""

from __future__ import annotations

import asyncio
import json
import time
import unicodedata
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, MessageSizeTooLargeError

from consumers.config import Topics, event_record_bytes
from consumers.decoding import parse_event, tenant_from_topic
from consumers.errors import QueryFailed, WriteRejected
from consumers.models import (
    DocumentEvent,
    ErrorReply,
    ForgetEvent,
    GetReply,
    ListReply,
    QueryReply,
    TranscriptEvent,
    WriteAck,
)
from consumers.replies import REPLY_PARTITION_HEADER
from memory.config import DEFAULT_MAX_CONTENT_BYTES
from memory.errors import BackendUnavailable, InvalidEvent, InvalidRequest, NotFound

log = structlog.get_logger()


def _iso(t: datetime) -> str:
    """ISO 8601 for the wire; a naive time is UTC, as the daemon reads it."""
    return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).isoformat()


@dataclass(frozen=True, slots=True)
class Receipt:
    """What a publish sent (its event id, doc id and version) and, when it waited, the ack:
    ``indexed`` (searchable now) or ``ignored`` (an older version than the stored one)."""

    event_id: str
    doc_id: str
    version: int | None
    ack: WriteAck | None = None


def default_version() -> int:
    """A version that grows with wall-clock time (microseconds), for callers without their own."""
    return time.time_ns() // 1000


class MemoryClient:
    """Publish documents and observations, and ask queries over request/reply."""

    def __init__(
        self,
        *,
        bootstrap: str,
        topics: Topics | None = None,
        reply_topic: str | None = None,
        reply_partition: int | None = None,
        tenant: str | None = None,
        reply_fetch_wait_ms: int = 5,
        reply_idle_pause_s: float = 5.0,
        timeout_s: float = 30.0,
        kafka_options: dict[str, Any] | None = None,
        max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES,
    ) -> None:
        """``reply_partition``: read only this partition of the reply topic, and ask the daemon
        to reply there (the ``reply_partition`` header). Give each client sharing a reply topic
        its own, so none reads the others' replies. Without it, the client reads every
        partition.

        ``reply_fetch_wait_ms``: how long the broker may hold the reply reader's fetch. Apache
        Kafka answers it when a reply lands, so a long wait (500) costs nothing there and
        saves polling; tansu (the embedded broker) may hold it to the end, hence 5.

        ``reply_idle_pause_s``: after this long without a reply awaited, the reply reader is
        paused (an idle client polls not at all); the next request first moves it to the
        topic's end (one offsets request), so it never reads what other clients' replies piled
        up meanwhile. 0: never paused.

        ``tenant``: for a daemon in topic tenancy, the tenant every call publishes for (on
        ``<topic>.<tenant>``; a call's own ``tenant=`` wins), with replies read on
        ``<replies topic>.<tenant>`` unless ``reply_topic`` says otherwise. Without it, calls
        use the bare topics, which only a daemon in single tenancy reads.

        ``max_content_bytes``: the daemon's ``AGENTMEM_INGEST__MAX_CONTENT_BYTES``. Larger
        content is refused here, before anything is sent, and the producer takes records as
        large as an event within it needs (Kafka's 1 MiB default is smaller).

        Raises:
            InvalidRequest: ``tenant`` is no valid tenant name.
        """
        if reply_partition is not None and reply_partition < 0:
            raise ValueError("reply_partition must be >= 0")
        self._bootstrap = bootstrap
        self.topics = topics or Topics()
        self.tenant = tenant
        if tenant is not None:
            _tenant_topic(self.topics.replies, tenant)  # validates the name before anything connects
        default_reply = self.topics.replies if tenant is None else f"{self.topics.replies}.{tenant}"
        self._reply_topic = reply_topic or default_reply
        self._reply_partition = reply_partition
        self._reply_wait_ms = reply_fetch_wait_ms
        self._idle_pause_s = reply_idle_pause_s
        self._pause_timer: asyncio.TimerHandle | None = None
        self._paused: AIOKafkaConsumer | None = None  # the reader's consumer while it is paused
        self._waking: asyncio.Task[None] | None = None
        self._timeout = timeout_s
        self._options = dict(kafka_options or {})
        self._max_content_bytes = max_content_bytes
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._pending: dict[str, asyncio.Future[bytes]] = {}
        self._reader: asyncio.Task[None] | None = None
        # Starting the reader awaits the broker: without the lock, queries racing to start it
        # would each start a consumer, and only the last would ever be stopped.
        self._reader_lock = asyncio.Lock()

    async def __aenter__(self) -> MemoryClient:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Connect the producer.

        Raises:
            BackendUnavailable: the broker cannot be reached.
        """
        options = {"max_request_size": event_record_bytes(self._max_content_bytes), **self._options}
        self._producer = AIOKafkaProducer(bootstrap_servers=self._bootstrap, acks="all", linger_ms=0, **options)
        try:
            await self._producer.start()
        except KafkaError as exc:
            # A producer that failed to start still holds its client: closed here, or asyncio
            # reports it unclosed at exit (an operator saw that noise under every refusal).
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
                tps = self._reply_partitions(consumer.partitions_for_topic(self._reply_topic))
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
            raise NotFound(f"reply topic {self._reply_topic!r} does not exist")
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
        """Disconnect: stop the reply reader, its consumer and the producer.

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

    async def _send(
        self, topic: str, payload: Mapping[str, Any], key: str, headers: list[tuple[str, bytes]] | None = None
    ) -> None:
        await self._send_bytes(topic, _encode(payload), key, headers)

    async def _send_bytes(
        self, topic: str, value: bytes, key: str, headers: list[tuple[str, bytes]] | None = None
    ) -> None:
        if self._producer is None:
            raise RuntimeError("client not started")
        try:
            await self._producer.send_and_wait(topic, value, key=key.encode(), headers=headers or [])
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

    async def _publish(
        self, topic: str, value: bytes, key: str, *, wait: bool, timeout_s: float | None
    ) -> WriteAck | None:
        """Send an event; with ``wait``, ask for its ack (``reply_to`` + ``correlation_id``) and
        return it once the daemon's writes are searchable.

        Raises:
            WriteRejected: the daemon dead-lettered it.
            TimeoutError: no ack within ``timeout_s`` (the client's when None); the event was sent
                and may still be applied.
        """
        if not wait:
            await self._send_bytes(topic, value, key)
            return None
        await self._ensure_reader()
        raw = await self._exchange(topic, value, key, timeout_s)
        ack = WriteAck.model_validate_json(raw)
        if ack.status == "dead_lettered":
            raise WriteRejected(ack)
        return ack

    async def _exchange(self, topic: str, value: bytes, key: str, timeout_s: float | None) -> bytes:
        """Publish a record with reply headers and wait for the reply with its correlation id."""
        cid = uuid.uuid4().hex
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[cid] = fut
        headers = [("reply_to", self._reply_topic.encode()), ("correlation_id", cid.encode())]
        if self._reply_partition is not None:
            headers.append((REPLY_PARTITION_HEADER, str(self._reply_partition).encode()))
        try:
            await self._wake_reader()
            await self._send_bytes(topic, value, key, headers)
            return await asyncio.wait_for(fut, timeout=self._timeout if timeout_s is None else timeout_s)
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

    def check_event(self, model: type[DocumentEvent] | type[TranscriptEvent], payload: Mapping[str, Any]) -> bytes:
        """``payload`` encoded, once it passed the checks the daemon runs on it (the contract's
        models, and the content limit); what the daemon would dead-letter fails here instead.

        Raises:
            InvalidEvent: the daemon would refuse it, with the reason.
        """
        try:
            value = _encode(payload)
            event = parse_event(value, model)  # the daemon's own parsing, and its reasons
            if isinstance(event, DocumentEvent):
                event.to_item(())  # an upsert's content rules
        except UnicodeEncodeError as exc:  # a lone surrogate, e.g. from undecodable argv bytes
            raise InvalidEvent(f"not sendable as UTF-8 text: {exc}") from exc
        except ValueError as exc:
            raise InvalidEvent(str(exc)) from exc
        content = payload.get("content")
        if isinstance(content, str) and not _has_token(content):
            # The daemon's tokenizer finds nothing in it, so it dead-letters it (memory.ingest).
            raise InvalidEvent("content has no tokens (only whitespace, format or control characters)")
        if isinstance(content, str) and (size := len(content.encode("utf-8"))) > self._max_content_bytes:
            raise InvalidEvent(
                f"content is {size:,} bytes, over the {self._max_content_bytes:,}-byte "
                "limit (AGENTMEM_INGEST__MAX_CONTENT_BYTES)"
            )
        if len(value) > (limit := event_record_bytes(self._max_content_bytes)):
            raise InvalidEvent(
                f"the event encodes to {len(value):,} bytes, over the {limit:,}-byte record limit of the event "
                "topics (twice the content limit): JSON escaping of its quotes, backslashes or control "
                "characters, or its metadata, takes it past; send less of it"
            )
        return value

    def _topic(self, base: str, tenant: str | None) -> str:
        """Where a call publishes: ``base`` itself, or the tenant's ``<base>.<tenant>``."""
        tenant = self.tenant if tenant is None else tenant
        return base if tenant is None else _tenant_topic(base, tenant)

    async def query(
        self,
        text: str,
        *,
        top_k: int = 5,
        metadata_filter: Mapping[str, str | Sequence[str]] | None = None,
        dense_weight: float | None = None,
        sparse_weight: float | None = None,
        rrf_k: int | None = None,
        query_id: str | None = None,
        identifier_weight: float | None = None,
        scope: Literal["chunks", "communities", "all"] | None = None,
        tenant: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        recency_weight: float | None = None,
        context_turns: int = 0,
    ) -> QueryReply:
        """Ask a query and wait for its reply.

        Args:
            text: what to search for.
            top_k: results wanted (1..100).
            metadata_filter: key -> value, or values (any of them).
            dense_weight: weight of the vector leg (0 skips it); the daemon's default if None.
            sparse_weight: weight of the BM25 leg (0 skips it); the daemon's default if None.
            rrf_k: the RRF constant; the daemon's default if None.
            query_id: echoed in the reply; a random one if None.
            identifier_weight: weight of the identifier leg (0 skips it); the daemon's default if None.
            scope: ``chunks``, ``communities`` or ``all`` (see docs/contract.md); the daemon's
                default (``chunks``) if None.
            tenant: ask this tenant's memory, on ``<requests topic>.<tenant>`` (for a daemon in
                topic tenancy); None: the client's tenant, else the requests topic itself. The
                reply still goes to this client's reply topic: a client built with ``tenant=``
                reads its tenant's own, keeping replies off the topic every tenant reads.
            since: only memories timestamped at or after this time (naive times are UTC).
            until: only memories timestamped at or before this time.
            recency_weight: weight of the recency list (the candidates newest first; 0 off);
                the daemon's default (0) if None.
            context_turns: also return this many turns before and after each transcript
                result (its ``context``), so an agent gets the exchange, not a fragment.

        Raises:
            QueryFailed: the daemon replied with an error.
            InvalidRequest: ``tenant`` is no valid tenant name.
            NotFound: the reply topic, or the reply partition, does not exist.
            BackendUnavailable: the broker cannot be reached, or the reply reader failed while
                this query waited (the next query starts a new one).
            TimeoutError: no reply within the client's timeout.
        """
        topic = self._topic(self.topics.requests, tenant)
        await self._ensure_reader()
        hybrid: dict[str, Any] = {}
        if dense_weight is not None:
            hybrid["dense_weight"] = dense_weight
        if sparse_weight is not None:
            hybrid["sparse_weight"] = sparse_weight
        if identifier_weight is not None:
            hybrid["identifier_weight"] = identifier_weight
        if recency_weight is not None:
            hybrid["recency_weight"] = recency_weight
        if rrf_k is not None:
            hybrid["rrf_k_constant"] = rrf_k
        payload: dict[str, Any] = {
            "query_id": query_id or f"q_{uuid.uuid4().hex[:12]}",
            "search_text": text,
            "top_k": top_k,
        }
        if hybrid:
            payload["hybrid_params"] = hybrid
        if metadata_filter:
            payload["metadata_filter"] = {k: v if isinstance(v, str) else list(v) for k, v in metadata_filter.items()}
        if scope is not None:
            payload["scope"] = scope
        if context_turns:
            payload["context_turns"] = context_turns
        window = {name: _iso(t) for name, t in (("since", since), ("until", until)) if t is not None}
        if window:
            payload["time_range"] = window
        data = await self._ask(topic, payload)
        return QueryReply.model_validate(data)

    async def get(
        self,
        doc_ids: Sequence[str] = (),
        *,
        turns: Sequence[tuple[str, str, int]] = (),
        metadata_filter: Mapping[str, str | Sequence[str]] | None = None,
        tenant: str | None = None,
        query_id: str | None = None,
    ) -> GetReply:
        """Look memories up by id: each doc's (or turn's, as ``(agent_id, session_id, turn)``)
        current version, content and metadata, or ``not_found``; in the order asked.

        Raises:
            QueryFailed: the daemon replied with an error (no ids, more than 100, a bad filter).
            BackendUnavailable, NotFound, TimeoutError: as for ``query``.
        """
        topic = self._topic(self.topics.requests, tenant)
        await self._ensure_reader()
        payload: dict[str, Any] = {
            "query_id": query_id or f"g_{uuid.uuid4().hex[:12]}",
            "op": "get",
            "doc_ids": list(doc_ids),
            "turns": [{"agent_id": a, "session_id": s, "turn": t} for a, s, t in turns],
        }
        if metadata_filter:
            payload["metadata_filter"] = {k: v if isinstance(v, str) else list(v) for k, v in metadata_filter.items()}
        return GetReply.model_validate(await self._ask(topic, payload))

    async def list_values(
        self,
        field: Literal["doc_id", "source"] = "doc_id",
        *,
        source_prefix: str = "",
        limit: int = 100,
        offset: int = 0,
        tenant: str | None = None,
        query_id: str | None = None,
    ) -> ListReply:
        """The distinct doc ids (or sources) of the tenant's documents whose source starts with
        ``source_prefix``, sorted, ``limit`` (1..1000) of them from ``offset``.

        Raises:
            QueryFailed: the daemon replied with an error (a limit out of range, say).
            BackendUnavailable, NotFound, TimeoutError: as for ``query``.
        """
        topic = self._topic(self.topics.requests, tenant)
        await self._ensure_reader()
        payload: dict[str, Any] = {
            "query_id": query_id or f"l_{uuid.uuid4().hex[:12]}",
            "op": "list",
            "field": field,
            "source_prefix": source_prefix,
            "limit": limit,
            "offset": offset,
        }
        return ListReply.model_validate(await self._ask(topic, payload))

    async def _ask(self, topic: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Publish a request and wait for its reply's JSON; an error reply raises ``QueryFailed``."""
        raw = await self._exchange(topic, _encode(payload), payload["query_id"], None)
        data: dict[str, Any] = json.loads(raw)
        if "error" in data:
            raise QueryFailed(ErrorReply.model_validate(data))
        return data

    def document_event(
        self,
        doc_id: str,
        content: str,
        *,
        version: int | None = None,
        source: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        timestamp: datetime | None = None,
    ) -> tuple[int, bytes]:
        """The upsert ``publish_document`` sends, checked and encoded, with its version; sends
        nothing (check a batch of documents before sending the first).

        Raises:
            InvalidEvent: the daemon would dead-letter it (blank content, content over the
                limit, a reserved doc_id, metadata out of bounds), with the reason.
        """
        version = default_version() if version is None else version
        payload = {
            "event_id": uuid.uuid4().hex,
            "op": "upsert",
            "doc_id": doc_id,
            "version": version,
            "source": source or doc_id,
            "content": content,
            "metadata": dict(metadata or {}),
            "timestamp": _iso(timestamp or datetime.now(UTC)),
        }
        return version, self.check_event(DocumentEvent, payload)

    async def publish_document(
        self,
        doc_id: str,
        content: str,
        *,
        version: int | None = None,
        source: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        tenant: str | None = None,
        timestamp: datetime | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Upsert a document; the receipt has the version used (wall-clock based when not given).

        ``tenant``: publish into this tenant's memory (topic tenancy; see ``query``).
        ``timestamp``: when it was written (what ``query(since=, until=)`` selects on); now
        when None (sent in the event, so a replay keeps it).
        ``wait``: return once the daemon acknowledged it (the receipt's ``ack``): a query sent
        after that finds it. ``timeout_s``: how long to wait (the client's timeout when None).

        Raises:
            InvalidEvent: the daemon would dead-letter it (see ``document_event``); nothing is sent.
            WriteRejected: (``wait``) the daemon dead-lettered it.
            BackendUnavailable: the broker could not take it.
            TimeoutError: (``wait``) no ack in time; the event was sent.
        """
        version, value = self.document_event(
            doc_id, content, version=version, source=source, metadata=metadata, timestamp=timestamp
        )
        ack = await self._publish(
            self._topic(self.topics.documents, tenant), value, doc_id, wait=wait, timeout_s=timeout_s
        )
        return Receipt(event_id=json.loads(value)["event_id"], doc_id=doc_id, version=version, ack=ack)

    async def delete_document(
        self,
        doc_id: str,
        *,
        version: int | None = None,
        tenant: str | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Delete a document; the receipt has the version used. ``tenant``, ``wait`` and
        ``timeout_s``: as for ``publish_document``."""
        version = default_version() if version is None else version
        event_id = uuid.uuid4().hex
        payload = {"event_id": event_id, "op": "delete", "doc_id": doc_id, "version": version}
        ack = await self._publish(
            self._topic(self.topics.documents, tenant), _encode(payload), doc_id, wait=wait, timeout_s=timeout_s
        )
        return Receipt(event_id=event_id, doc_id=doc_id, version=version, ack=ack)

    async def publish_observation(
        self,
        *,
        agent_id: str,
        session_id: str,
        turn: int,
        content: str,
        role: str = "assistant",
        metadata: Mapping[str, Any] | None = None,
        tenant: str | None = None,
        timestamp: datetime | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Record one transcript turn or observation. ``tenant``, ``timestamp``, ``wait`` and
        ``timeout_s``: as for ``publish_document``."""
        event_id = uuid.uuid4().hex
        payload = {
            "event_id": event_id,
            "agent_id": agent_id,
            "session_id": session_id,
            "turn": turn,
            "role": role,
            "content": content,
            "metadata": dict(metadata or {}),
        }
        payload["timestamp"] = _iso(timestamp or datetime.now(UTC))
        value = self.check_event(TranscriptEvent, payload)
        topic = self._topic(self.topics.transcripts, tenant)
        ack = await self._publish(topic, value, f"{agent_id}/{session_id}", wait=wait, timeout_s=timeout_s)
        doc_id = TranscriptEvent.model_validate_json(value).doc_id
        return Receipt(event_id=event_id, doc_id=doc_id, version=None, ack=ack)

    async def forget(
        self,
        *,
        agent_id: str,
        session_id: str | None = None,
        all_sessions: bool = False,
        tenant: str | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Forget every turn of a session, or with ``all_sessions=True`` of every session of the agent.

        Keyed as the session's turns are, so it applies after every turn of it published
        before; turns published later are kept. ``tenant``, ``wait`` and ``timeout_s``: as for
        ``publish_document`` (with ``wait``, once acknowledged no query finds those turns).

        Raises:
            InvalidRequest: neither or both of ``session_id`` and ``all_sessions``.
        """
        if (session_id is None) == (not all_sessions):
            raise InvalidRequest("forget takes a session_id or all_sessions=True (not both)")
        event_id = uuid.uuid4().hex
        payload: dict[str, Any] = {"event_id": event_id, "op": "forget", "agent_id": agent_id}
        if session_id is not None:
            payload["session_id"] = session_id
        else:
            payload["all_sessions"] = True
        key = agent_id if session_id is None else f"{agent_id}/{session_id}"
        topic = self._topic(self.topics.transcripts, tenant)
        ack = await self._publish(topic, _encode(payload), key, wait=wait, timeout_s=timeout_s)
        prefix = ForgetEvent.model_validate(payload).to_item(()).doc_id  # the turns' common prefix
        return Receipt(event_id=event_id, doc_id=prefix, version=None, ack=ack)


def _has_token(text: str) -> bool:
    """Whether ``text`` holds anything the model's tokenizer keeps: it drops whitespace, format
    characters (a zero-width space, a BOM) and control characters."""
    return any(not c.isspace() and unicodedata.category(c) not in ("Cc", "Cf") for c in text)


def _encode(payload: Mapping[str, Any]) -> bytes:
    # Not ASCII-escaped: non-ASCII text would grow 2-6 times on the wire.
    return json.dumps(payload, ensure_ascii=False).encode()


def _tenant_topic(base: str, tenant: str) -> str:
    """``<base>.<tenant>``, the topic a daemon in topic tenancy reads for ``tenant``.

    Raises:
        InvalidRequest: ``tenant`` is no valid tenant name (the daemon would dead-letter the
            record, or never read the topic).
    """
    topic = f"{base}.{tenant}"
    if tenant_from_topic(topic, base, "topic") != tenant:
        raise InvalidRequest(f"tenant {tenant!r} is not 1-64 of A-Z a-z 0-9 _ -")
    return topic


async def _stop_quietly(client: AIOKafkaConsumer | AIOKafkaProducer, what: str) -> None:
    """Stop an aiokafka client; a failure is logged, so the caller goes on to stop the rest."""
    try:
        await client.stop()
    except Exception as exc:
        log.warning("client.stop_failed", client=what, error=f"{type(exc).__name__}: {exc}")
