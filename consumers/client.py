"""A small typed async client of the wire contract, on plain aiokafka.

Any language's Kafka client can do the same: publish JSON, set ``reply_to`` and
``correlation_id`` headers (and optionally ``reply_partition``), read the reply topic (or
that partition of it) for the matching ``correlation_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from consumers.config import Topics
from consumers.models import ErrorReply, QueryReply
from consumers.replies import REPLY_PARTITION_HEADER
from memory.errors import BackendUnavailable, MemdError, NotFound


class QueryFailed(MemdError):
    """The daemon answered with an error reply; ``code`` is the reply's error code."""

    def __init__(self, reply: ErrorReply) -> None:
        super().__init__(f"{reply.error.code}: {reply.error.message}")
        self.reply = reply
        self.error_code = reply.error.code


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
        reply_fetch_wait_ms: int = 5,
        timeout_s: float = 30.0,
        kafka_options: dict[str, Any] | None = None,
    ) -> None:
        """``reply_partition``: read only this partition of the reply topic, and ask the daemon
        to reply there (the ``reply_partition`` header). Give each client sharing a reply topic
        its own, so none reads the others' replies. Without it, the client reads every
        partition.

        ``reply_fetch_wait_ms``: how long the broker may hold the reply reader's fetch. Apache
        Kafka answers it when a reply lands, so a long wait (500) costs nothing there and
        saves polling; tansu (the embedded broker) may hold it to the end, hence 5.
        """
        if reply_partition is not None and reply_partition < 0:
            raise ValueError("reply_partition must be >= 0")
        self._bootstrap = bootstrap
        self.topics = topics or Topics()
        self._reply_topic = reply_topic or self.topics.replies
        self._reply_partition = reply_partition
        self._reply_wait_ms = reply_fetch_wait_ms
        self._timeout = timeout_s
        self._options = dict(kafka_options or {})
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._pending: dict[str, asyncio.Future[bytes]] = {}
        self._reader: asyncio.Task[None] | None = None

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
        self._producer = AIOKafkaProducer(bootstrap_servers=self._bootstrap, acks="all", linger_ms=0, **self._options)
        try:
            await self._producer.start()
        except KafkaError as exc:
            raise BackendUnavailable(f"kafka at {self._bootstrap} unreachable: {exc}") from exc

    async def _ensure_reader(self) -> None:
        if self._reader is not None:
            return
        # No consumer group: every client reads the reply partitions (all, or its own) from
        # "now" and picks its own correlation ids, so many clients can share one reply topic.
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            fetch_max_wait_ms=self._reply_wait_ms,
            enable_auto_commit=False,
            **self._options,
        )
        await consumer.start()
        parts = consumer.partitions_for_topic(self._reply_topic)
        missing = None
        if not parts:
            missing = f"reply topic {self._reply_topic!r} does not exist"
        elif self._reply_partition is not None and self._reply_partition not in parts:
            missing = f"reply topic {self._reply_topic!r} has no partition {self._reply_partition}"
        if missing is not None:
            # One turn of the loop first: aiokafka's stop() awaits a task it cancels, and a task
            # cancelled before it ever ran raises CancelledError out of stop().
            await asyncio.sleep(0)
            await consumer.stop()
            raise NotFound(missing)
        if self._reply_partition is not None:
            parts = {self._reply_partition}
        tps = [TopicPartition(self._reply_topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)
        self._consumer = consumer
        self._reader = asyncio.create_task(self._read_replies())

    async def _read_replies(self) -> None:
        assert self._consumer is not None
        async for msg in self._consumer:
            headers = {k: v for k, v in (msg.headers or ())}
            cid = (headers.get("correlation_id") or b"").decode("utf-8", "replace")
            fut = self._pending.pop(cid, None)
            if fut is not None and not fut.done():
                fut.set_result(msg.value or b"")

    async def close(self) -> None:
        """Disconnect."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()

    async def _send(
        self, topic: str, payload: Mapping[str, Any], key: str, headers: list[tuple[str, bytes]] | None = None
    ) -> None:
        if self._producer is None:
            raise RuntimeError("client not started")
        try:
            await self._producer.send_and_wait(
                topic, json.dumps(payload).encode(), key=key.encode(), headers=headers or []
            )
        except KafkaError as exc:
            raise BackendUnavailable(f"publish to {topic} failed: {exc}") from exc

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
    ) -> QueryReply:
        """Ask a query and wait for its reply.

        Raises:
            QueryFailed: the daemon replied with an error.
            TimeoutError: no reply within the client's timeout.
        """
        await self._ensure_reader()
        hybrid: dict[str, Any] = {}
        if dense_weight is not None:
            hybrid["dense_weight"] = dense_weight
        if sparse_weight is not None:
            hybrid["sparse_weight"] = sparse_weight
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
        cid = uuid.uuid4().hex
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[cid] = fut
        headers = [("reply_to", self._reply_topic.encode()), ("correlation_id", cid.encode())]
        if self._reply_partition is not None:
            headers.append((REPLY_PARTITION_HEADER, str(self._reply_partition).encode()))
        try:
            await self._send(self.topics.requests, payload, key=payload["query_id"], headers=headers)
            raw = await asyncio.wait_for(fut, timeout=self._timeout)
        finally:
            self._pending.pop(cid, None)
        data = json.loads(raw)
        if "error" in data:
            raise QueryFailed(ErrorReply.model_validate(data))
        return QueryReply.model_validate(data)

    async def publish_document(
        self,
        doc_id: str,
        content: str,
        *,
        version: int | None = None,
        source: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> int:
        """Upsert a document; returns the version used (wall-clock based when not given)."""
        version = default_version() if version is None else version
        payload = {
            "event_id": uuid.uuid4().hex,
            "op": "upsert",
            "doc_id": doc_id,
            "version": version,
            "source": source or doc_id,
            "content": content,
            "metadata": dict(metadata or {}),
        }
        await self._send(self.topics.documents, payload, key=doc_id)
        return version

    async def delete_document(self, doc_id: str, *, version: int | None = None) -> int:
        """Delete a document; returns the version used."""
        version = default_version() if version is None else version
        payload = {"event_id": uuid.uuid4().hex, "op": "delete", "doc_id": doc_id, "version": version}
        await self._send(self.topics.documents, payload, key=doc_id)
        return version

    async def publish_observation(
        self,
        *,
        agent_id: str,
        session_id: str,
        turn: int,
        content: str,
        role: str = "assistant",
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Record one transcript turn or observation."""
        payload = {
            "event_id": uuid.uuid4().hex,
            "agent_id": agent_id,
            "session_id": session_id,
            "turn": turn,
            "role": role,
            "content": content,
            "metadata": dict(metadata or {}),
        }
        await self._send(self.topics.transcripts, payload, key=f"{agent_id}/{session_id}")
