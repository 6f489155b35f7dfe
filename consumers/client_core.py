"""What every call of ``MemoryClient`` stands on: the transport, the topics and the tenant
a call publishes for."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal, Self

from consumers.config import Topics, event_record_bytes
from consumers.encoding import encode_event
from consumers.errors import UnknownReplyTopic
from consumers.events import DocumentEvent, TranscriptEvent
from consumers.replies import check_reply_to, own_reply_topic
from consumers.topic_names import tenant_topic
from consumers.transport import KafkaTransport
from consumers.turn_numbers import TurnNumbers
from memory.config import DEFAULT_MAX_CONTENT_BYTES, DEFAULT_MAX_FUTURE_S
from memory.errors import BackendUnavailable, InvalidRequest
from memory.records import DEFAULT_TENANT

#: How long a call waits for the daemon's reply by default (seconds).
DEFAULT_TIMEOUT_S = 30.0


class _ClientCore:
    """The connection and the topic each call goes to; the reads and writes build on it."""

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
        timeout_s: float = DEFAULT_TIMEOUT_S,
        kafka_options: dict[str, Any] | None = None,
        max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES,
        max_future_s: float = DEFAULT_MAX_FUTURE_S,
        tenancy: Literal["single", "topic"] | None = None,
        unreachable_hint: str = "",
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
        use the bare topics, which only a daemon in single tenancy applies (one in topic
        tenancy refuses them: they name no tenant).

        ``max_content_bytes``: the daemon's ``AGENTMEM_INGEST__MAX_CONTENT_BYTES``. Larger
        content is refused here, before anything is sent, and the producer takes records as
        large as an event within it needs (Kafka's 1 MiB default is smaller).

        ``max_future_s``: the daemon's ``AGENTMEM_INGEST__MAX_FUTURE_S``. An event stamped
        further ahead of this host's clock is refused here, before anything is sent.

        ``unreachable_hint``: said after the reason when the broker cannot be reached at
        start (``daemon.connections.memory_client`` says where its settings are read).

        ``tenancy``: the daemon's ``AGENTMEM_CONSUMER__TENANCY``, if known. A call for a
        tenant is then refused here in single tenancy, and a call for none in topic tenancy:
        no daemon applies what either would send.

        Raises:
            InvalidRequest: ``tenant`` is no valid tenant name, or names one in single tenancy.
        """
        if reply_partition is not None and reply_partition < 0:
            raise ValueError("reply_partition must be >= 0")
        self._tenancy = tenancy
        tenant = self._bare_if_default(tenant)
        self._check_tenancy(tenant, call=False)
        # Each session's next turn, for writes that do not number theirs (consumers.turn_numbers).
        self.turns = TurnNumbers()
        self.topics = topics or Topics()
        self.tenant = tenant
        if tenant is not None:
            tenant_topic(self.topics.replies, tenant)  # validates the name before anything connects
        default_reply = self.topics.replies if tenant is None else f"{self.topics.replies}.{tenant}"
        self._max_content_bytes = max_content_bytes
        self._unreachable_hint = unreachable_hint
        self._max_future_s = max_future_s
        self._transport = KafkaTransport(
            bootstrap=bootstrap,
            reply_topic=reply_topic or default_reply,
            reply_partition=reply_partition,
            reply_fetch_wait_ms=reply_fetch_wait_ms,
            reply_idle_pause_s=reply_idle_pause_s,
            timeout_s=timeout_s,
            kafka_options=dict(kafka_options or {}),
            max_request_size=event_record_bytes(max_content_bytes),
            shared_topics=frozenset(self.topics.all()),
        )

    async def __aenter__(self) -> Self:
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
        try:
            await self._transport.start()
        except BackendUnavailable as exc:
            if not self._unreachable_hint:
                raise
            raise BackendUnavailable(f"{exc} ({self._unreachable_hint})") from exc

    async def close(self) -> None:
        """Disconnect: stop the reply reader, its consumer and the producer.

        Each is stopped even if stopping another fails, or the reader died; such errors are
        logged (``client.stop_failed``), not raised.
        """
        await self._transport.close()

    def check_event(self, model: type[DocumentEvent] | type[TranscriptEvent], payload: Mapping[str, Any]) -> bytes:
        """``payload`` encoded, once it passed the checks the daemon runs on it (the contract's
        models, the content limit, the timestamp); what the daemon would dead-letter fails
        here instead.

        Raises:
            InvalidEvent: the daemon would refuse it, with the reason.
        """
        return encode_event(model, payload, max_content_bytes=self._max_content_bytes, max_future_s=self._max_future_s)

    def _check_tenancy(self, tenant: str | None, *, call: bool) -> None:
        """Refuse what no daemon of this client's tenancy would read (nothing if it is unknown).

        Raises:
            InvalidRequest: a tenant in single tenancy, or (``call``) none in topic tenancy.
        """
        if self._tenancy == "single" and tenant is not None:
            raise InvalidRequest(
                f"tenant {tenant!r} needs AGENTMEM_CONSUMER__TENANCY=topic: the daemon runs in single tenancy, "
                f"where every memory is the {DEFAULT_TENANT!r} tenant's; nothing was sent"
            )
        if call and self._tenancy == "topic" and tenant is None:
            raise InvalidRequest(
                "the daemon runs in topic tenancy (AGENTMEM_CONSUMER__TENANCY=topic), where the bare topics "
                "name no tenant and are refused: name the tenant (tenant= on the call or the client); nothing was sent"
            )

    def _bare_if_default(self, tenant: str | None) -> str | None:
        """None for single tenancy's one tenant, whose calls go to the bare topics; else ``tenant``."""
        return None if self._tenancy == "single" and tenant == DEFAULT_TENANT else tenant

    def _tenant_of(self, tenant: str | None) -> str | None:
        """A call's tenant, or this client's when the call names none (single tenancy's one
        tenant as None, so its turns are counted once)."""
        return self._bare_if_default(self.tenant if tenant is None else tenant)

    def _topic(self, base: str, tenant: str | None, *, answered: bool) -> str:
        """Where a call publishes: ``base`` itself, or the tenant's ``<base>.<tenant>``.

        Raises:
            InvalidRequest: ``answered`` (a reply or an ack is awaited), and a daemon in topic
                tenancy would not answer the tenant's call on this client's reply topic.
        """
        tenant = self._tenant_of(tenant)
        self._check_tenancy(tenant, call=True)
        if tenant is None:
            return base
        topic = tenant_topic(base, tenant)
        if answered:
            reply = self._transport.reply_topic
            try:
                check_reply_to(reply, (), own_reply_topic(self.topics.replies, "topic", tenant), self.topics.replies)
            except UnknownReplyTopic as exc:
                raise InvalidRequest(
                    f"tenant {tenant!r} is answered on its own reply topic, and this client reads {reply!r}: "
                    f"ask with a client built with tenant={tenant!r}, or one reading {self.topics.replies!r}"
                ) from exc
        return topic
