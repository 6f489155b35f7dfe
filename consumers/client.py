"""A small typed async client of the wire contract, on plain aiokafka.

Any language's Kafka client can do the same: publish JSON, set ``reply_to`` and
``correlation_id`` headers (and optionally ``reply_partition``), read the reply topic (or
that partition of it) for the matching ``correlation_id``.

``MemoryClient`` is the typed façade: the records and the reply reader are
``consumers.transport``'s, the bodies and their checks before sending ``consumers.encoding``'s.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Literal

from consumers.config import Topics, event_record_bytes
from consumers.encoding import (
    ClientFilter,
    TurnRef,
    delete_body,
    document_body,
    encode,
    encode_event,
    forget_body,
    get_body,
    list_body,
    query_body,
    recent_body,
    tenant_topic,
    turn_body,
)
from consumers.errors import UnknownReplyTopic
from consumers.events import DocumentEvent, ForgetEvent, TranscriptEvent, WriteAck, forget_scope_error
from consumers.replies import check_reply_to, own_reply_topic
from consumers.requests import GetReply, ListReply, QueryReply
from consumers.transport import KafkaTransport
from memory.config import DEFAULT_MAX_CONTENT_BYTES
from memory.errors import InvalidRequest


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
        self.topics = topics or Topics()
        self.tenant = tenant
        if tenant is not None:
            tenant_topic(self.topics.replies, tenant)  # validates the name before anything connects
        default_reply = self.topics.replies if tenant is None else f"{self.topics.replies}.{tenant}"
        self._max_content_bytes = max_content_bytes
        self._transport = KafkaTransport(
            bootstrap=bootstrap,
            reply_topic=reply_topic or default_reply,
            reply_partition=reply_partition,
            reply_fetch_wait_ms=reply_fetch_wait_ms,
            reply_idle_pause_s=reply_idle_pause_s,
            timeout_s=timeout_s,
            kafka_options=dict(kafka_options or {}),
            max_request_size=event_record_bytes(max_content_bytes),
        )

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
        await self._transport.start()

    async def close(self) -> None:
        """Disconnect: stop the reply reader, its consumer and the producer.

        Each is stopped even if stopping another fails, or the reader died; such errors are
        logged (``client.stop_failed``), not raised.
        """
        await self._transport.close()

    def check_event(self, model: type[DocumentEvent] | type[TranscriptEvent], payload: Mapping[str, Any]) -> bytes:
        """``payload`` encoded, once it passed the checks the daemon runs on it (the contract's
        models, and the content limit); what the daemon would dead-letter fails here instead.

        Raises:
            InvalidEvent: the daemon would refuse it, with the reason.
        """
        return encode_event(model, payload, max_content_bytes=self._max_content_bytes)

    def _topic(self, base: str, tenant: str | None, *, answered: bool) -> str:
        """Where a call publishes: ``base`` itself, or the tenant's ``<base>.<tenant>``.

        Raises:
            InvalidRequest: ``answered`` (a reply or an ack is awaited), and a daemon in topic
                tenancy would not answer the tenant's call on this client's reply topic.
        """
        tenant = self.tenant if tenant is None else tenant
        if tenant is None:
            return base
        topic = tenant_topic(base, tenant)
        if answered:
            reply = self._transport.reply_topic
            try:
                check_reply_to(reply, (), own_reply_topic(self.topics.replies, "topic", tenant))
            except UnknownReplyTopic as exc:
                raise InvalidRequest(
                    f"tenant {tenant!r} is answered on its own reply topic, and this client reads {reply!r}: "
                    f"ask with a client built with tenant={tenant!r}, or one reading {self.topics.replies!r}"
                ) from exc
        return topic

    async def query(
        self,
        text: str,
        *,
        top_k: int = 5,
        metadata_filter: ClientFilter | None = None,
        dense_weight: float | None = None,
        sparse_weight: float | None = None,
        rrf_k: int | None = None,
        query_id: str | None = None,
        identifier_weight: float | None = None,
        scope: Literal["chunks", "communities", "all"] | None = None,
        tenant: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        recency_weight: float | None = None,
        context_turns: int = 0,
        speaker_weight: float | None = None,
        min_similarity: float | None = None,
    ) -> QueryReply:
        """Ask a query and wait for its reply.

        Args:
            text: what to search for.
            top_k: results wanted (1..100).
            metadata_filter: key -> value, values (any of them), or ``{"not": value or values}``
                (none of them).
            dense_weight: weight of the vector leg (0 skips it); the daemon's default if None.
            sparse_weight: weight of the BM25 leg (0 skips it); the daemon's default if None.
            rrf_k: the RRF constant; the daemon's default if None.
            query_id: echoed in the reply; a random one if None.
            identifier_weight: weight of the identifier leg (0 skips it); the daemon's default if None.
            scope: ``chunks``, ``communities`` or ``all`` (see docs/contract.md); the daemon's
                default (``chunks``) if None.
            tenant: ask this tenant's memory, on ``<requests topic>.<tenant>`` (for a daemon in
                topic tenancy); None: the client's tenant, else the requests topic itself. The
                reply goes to this client's reply topic, which the daemon allows for the
                tenant's own (``<replies>.<tenant>``) or the shared one (a client built without
                ``tenant=``); a client of another tenant raises ``InvalidRequest``.
            since: only memories timestamped at or after this time: a datetime (naive: UTC),
                an ISO 8601 string, or an age before now (``"24h"``, ``"7d"``).
            until: only memories timestamped at or before this time (as ``since``).
            recency_weight: weight of the recency list (the results newest first; 0 off);
                the daemon's default (0) if None.
            context_turns: also return this many turns before and after each transcript
                result (its ``context``), so an agent gets the exchange, not a fragment.
            speaker_weight: weight of the speaker list (the candidates said by someone the
                query names; 0 off); the daemon's default (0.2) if None.
            min_similarity: the vector leg keeps only candidates at least this similar
                (cosine, -1..1) to the question; the daemon's default (off) if None.

        Raises:
            QueryFailed: the daemon replied with an error.
            InvalidRequest: ``tenant`` is no valid tenant name.
            NotFound: the reply topic, or the reply partition, does not exist.
            BackendUnavailable: the broker cannot be reached, or the reply reader failed while
                this query waited (the next query starts a new one).
            TimeoutError: no reply within the client's timeout.
        """
        topic = self._topic(self.topics.requests, tenant, answered=True)
        payload = query_body(
            text,
            top_k=top_k,
            metadata_filter=metadata_filter,
            dense_weight=dense_weight,
            sparse_weight=sparse_weight,
            identifier_weight=identifier_weight,
            recency_weight=recency_weight,
            rrf_k=rrf_k,
            query_id=query_id,
            scope=scope,
            since=since,
            until=until,
            context_turns=context_turns,
            speaker_weight=speaker_weight,
            min_similarity=min_similarity,
        )
        data = await self._transport.ask(topic, payload)
        return QueryReply.model_validate(data)

    async def get(
        self,
        doc_ids: Sequence[str] = (),
        *,
        turns: Sequence[TurnRef] = (),
        metadata_filter: ClientFilter | None = None,
        tenant: str | None = None,
        query_id: str | None = None,
    ) -> GetReply:
        """Look memories up by id: each doc's (or turn's, as ``(agent_id, session_id, turn)``
        or the wire's ``{"agent_id": …, "session_id": …, "turn": …}``) current version,
        content and metadata, or ``not_found``; in the order asked.

        Raises:
            InvalidRequest: a turn is neither of those shapes (nothing is sent).
            QueryFailed: the daemon replied with an error (no ids, more than 100, a bad filter).
            BackendUnavailable, NotFound, TimeoutError: as for ``query``.
        """
        topic = self._topic(self.topics.requests, tenant, answered=True)
        payload = get_body(doc_ids, turns, metadata_filter, query_id)
        return GetReply.model_validate(await self._transport.ask(topic, payload))

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
        topic = self._topic(self.topics.requests, tenant, answered=True)
        payload = list_body(field, source_prefix, limit, offset, query_id)
        return ListReply.model_validate(await self._transport.ask(topic, payload))

    async def recent(
        self,
        agent_id: str,
        session_id: str | None = None,
        *,
        limit: int = 20,
        metadata_filter: ClientFilter | None = None,
        tenant: str | None = None,
        query_id: str | None = None,
    ) -> GetReply:
        """The agent's latest ``limit`` (1..100) turns, whole, oldest first: in ``session_id``, or
        across its sessions without one (by time; session and turn among equal times). What
        an agent restarted mid-task reads first.

        Raises:
            QueryFailed: the daemon replied with an error (a limit out of range, say).
            BackendUnavailable, NotFound, TimeoutError: as for ``query``.
        """
        topic = self._topic(self.topics.requests, tenant, answered=True)
        payload = recent_body(agent_id, session_id, limit, metadata_filter, query_id)
        return GetReply.model_validate(await self._transport.ask(topic, payload))

    def document_event(
        self,
        doc_id: str,
        content: str,
        *,
        version: int | None = None,
        source: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        timestamp: datetime | str | None = None,
    ) -> tuple[int, bytes]:
        """The upsert ``publish_document`` sends, checked and encoded, with its version; sends
        nothing (check a batch of documents before sending the first).

        Raises:
            InvalidEvent: the daemon would dead-letter it (blank content, content over the
                limit, a reserved doc_id, metadata out of bounds), with the reason.
        """
        version = default_version() if version is None else version
        payload = document_body(doc_id, content, version, source, metadata, timestamp)
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
        timestamp: datetime | str | None = None,
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
        ack = await self._transport.publish(
            self._topic(self.topics.documents, tenant, answered=wait), value, doc_id, wait=wait, timeout_s=timeout_s
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
        payload = delete_body(doc_id, version)
        event_id = payload["event_id"]
        value = self.check_event(DocumentEvent, payload)  # an empty doc id raises here, not at the daemon
        ack = await self._transport.publish(
            self._topic(self.topics.documents, tenant, answered=wait),
            value,
            doc_id,
            wait=wait,
            timeout_s=timeout_s,
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
        timestamp: datetime | str | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Record one transcript turn or observation. ``tenant``, ``timestamp``, ``wait`` and
        ``timeout_s``: as for ``publish_document``."""
        payload = turn_body(agent_id, session_id, turn, content, role, metadata, timestamp)
        event_id = payload["event_id"]
        value = self.check_event(TranscriptEvent, payload)
        topic = self._topic(self.topics.transcripts, tenant, answered=wait)
        ack = await self._transport.publish(topic, value, f"{agent_id}/{session_id}", wait=wait, timeout_s=timeout_s)
        doc_id = TranscriptEvent.model_validate_json(value).doc_id
        return Receipt(event_id=event_id, doc_id=doc_id, version=None, ack=ack)

    async def forget(
        self,
        *,
        agent_id: str,
        session_id: str | None = None,
        all_sessions: bool = False,
        turn: int | None = None,
        tenant: str | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Forget every turn of a session, one of them (``turn``), or with ``all_sessions=True``
        every session of the agent.

        Keyed as the session's turns are, so it applies after every turn of it published
        before; turns published later are kept. ``tenant``, ``wait`` and ``timeout_s``: as for
        ``publish_document`` (with ``wait``, once acknowledged no query finds those turns, nor
        a forgotten turn's words in the turns around it).

        Raises:
            InvalidRequest: neither or both of ``session_id`` and ``all_sessions``, or a
                ``turn`` without its ``session_id``.
        """
        if (why := forget_scope_error(session_id, all_sessions, turn)) is not None:
            raise InvalidRequest(why)
        payload = forget_body(agent_id, session_id, turn)
        event_id = payload["event_id"]
        key = agent_id if session_id is None else f"{agent_id}/{session_id}"
        topic = self._topic(self.topics.transcripts, tenant, answered=wait)
        ack = await self._transport.publish(topic, encode(payload), key, wait=wait, timeout_s=timeout_s)
        prefix = ForgetEvent.model_validate(payload).to_item(()).doc_id  # the turns' common prefix, or the turn's id
        return Receipt(event_id=event_id, doc_id=prefix, version=None, ack=ack)
