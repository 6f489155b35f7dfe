"""Config sections owned by ``consumers/``: topic names and consumer tuning."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, SecretStr, model_validator

if TYPE_CHECKING:  # FastStream is the daemon's, not a client's: imported where it is used
    from faststream.security import BaseSecurity


def event_record_bytes(max_content_bytes: int) -> int:
    """The record size the event topics and the client's producer take: twice the content
    limit (8 MiB by default), and never below Kafka's own 1 MiB.

    Kafka's default (1 MiB, on the broker and in every producer) is below the daemon's content
    limit, so documents between the two could not be published at all. Twice the limit leaves
    room for the JSON escaping of ordinary text (a few percent) and for metadata (at most 64
    values of 4,096 characters); text escaped past it (mostly quotes, backslashes or control
    characters) is refused by the client, which says so. 8 MiB is also the most some managed
    Kafka services allow.
    """
    return max(1024 * 1024, 2 * max_content_bytes)


#: The subscribers' roles. Each is its own consumer group (``ConsumerConfig.group``), reading
#: the topic of the same name in ``Topics``: each joins once instead of every subscriber's join
#: rebalancing the others, and lag is readable per role. The daemon is ready once each has its
#: partitions.
ROLES = ("documents", "transcripts", "requests")
#: The roles whose subscribers apply events in batches (the other answers questions).
INGEST_ROLES = ("documents", "transcripts")


class Topics(BaseModel):
    """Kafka topic names of the wire contract."""

    documents: str = Field("memory.documents", description="Document change events (key = doc_id).")
    transcripts: str = Field("memory.transcripts", description="Agent transcript turns (key = agent_id/session_id).")
    requests: str = Field("memory.requests", description="Memory query requests.")
    replies: str = Field("memory.replies", description="Default reply topic when a request has no reply_to header.")
    dlq: str = Field("memory.dlq", description="Rejected events, with the reason and original bytes.")

    def all(self) -> list[str]:
        """Every topic, for creation and checks."""
        return [self.documents, self.transcripts, self.requests, self.replies, self.dlq]

    def read(self) -> dict[str, str]:
        """The topic each role's subscriber reads (the base name, in topic tenancy), by role."""
        return {"documents": self.documents, "transcripts": self.transcripts, "requests": self.requests}

    def inputs(self) -> tuple[str, ...]:
        """The topics the daemon reads or dead-letters to: no reply may be published to them."""
        return (self.documents, self.transcripts, self.requests, self.dlq)

    def configs(
        self, max_content_bytes: int, exchange_retention_ms: int, event_retention_ms: int = -1
    ) -> dict[str, dict[str, str]]:
        """Topic configs to create the topics with: the event topics take records as large as
        an event the daemon accepts (Apache Kafka refuses records over 1 MiB by default) and
        keep them for ``event_retention_ms`` (-1: forever); the requests and replies keep
        theirs for ``exchange_retention_ms``."""
        limit = {
            "max.message.bytes": str(event_record_bytes(max_content_bytes)),
            "retention.ms": str(event_retention_ms),
        }
        # segment.ms too: Kafka deletes only closed segments, and one closes after 7 days by default.
        brief = {"retention.ms": str(exchange_retention_ms), "segment.ms": str(exchange_retention_ms)}
        return {self.documents: dict(limit), self.transcripts: dict(limit), self.requests: brief, self.replies: brief}


class ConsumerConfig(BaseModel):
    """Consumer group and tuning for the three subscribers."""

    tenancy: Literal["single", "topic"] = Field(
        "single",
        description=(
            "single: one tenant ('default'). topic: the tenant is the topic suffix "
            "(memory.documents.<tenant>, memory.transcripts.<tenant>, memory.requests.<tenant>), "
            "subscribed by pattern; payloads can never choose it, so topic ACLs grant access."
        ),
    )
    metadata_max_age_ms: int = Field(
        5_000,
        ge=100,
        description=(
            "How often topic metadata is refreshed: a new tenant's topics are found this fast (then the "
            "consumer group rebalances), so its first writes and questions wait up to this long."
        ),
    )
    group_id: str = Field(
        "agentmemd",
        description=(
            "Consumer group prefix shared by every daemon of a deployment "
            "(<id>.documents, <id>.transcripts, <id>.requests)."
        ),
    )
    session_timeout_ms: int = Field(
        10_000,
        ge=1000,
        le=3_600_000,
        description=(
            "A daemon that sends no heartbeat for this long leaves its groups, and its partitions "
            "move to the others: a killed daemon's partitions wait this long. Apache Kafka accepts "
            "its group.min/max.session.timeout.ms (6 s to 30 min by default). tansu holds a group's "
            "first join for half of it, so a shorter one also starts a daemon faster there."
        ),
    )
    heartbeat_interval_ms: int | None = Field(
        None,
        ge=100,
        le=1_200_000,
        description=(
            "How often each consumer heartbeats, at most a third of the session timeout. Unset: a "
            "third of it, 3 s at most (aiokafka's default)."
        ),
    )
    ingest_max_records: int = Field(128, ge=1, le=10_000, description="Most records handled as one ingest batch.")
    ingest_fetch_max_wait_ms: int = Field(
        20,
        ge=0,
        le=5000,
        description=(
            "Broker wait for more ingest data. Apache Kafka answers early when data arrives; tansu may "
            "hold a fetch for all of it, so there it adds up to this much to ingest latency, while "
            "shorter waits poll more (an idle daemon here: 0.30 cores at 20 ms, 0.24 at 100)."
        ),
    )
    ingest_batch_timeout_ms: int = Field(50, ge=1, le=10_000, description="How long a batch poll waits for records.")
    ingest_max_poll_interval_ms: int = Field(
        3_600_000,
        ge=60_000,
        le=86_400_000,
        description=(
            "Longest an ingest batch may take before the consumer is dropped from its group. Kafka's "
            "default, 5 minutes, is less than one large batch takes on 2 cores (about 40 s per MiB of "
            "English text at the 25 chunks/s bench/ingest measured, and a batch holds up to 1 MiB per "
            "partition): past it the batch's commit fails and it is redelivered, again and again."
        ),
    )
    ingest_lane_min_bytes: int = Field(
        131_072,
        ge=1024,
        le=1_073_741_824,
        description=(
            "An ingest batch whose records weigh this much (their values' bytes, ~5 s of embedding on 2 "
            "cores at the default) is applied in lanes, a partition each, beside the poll, so other "
            "writes are not held behind a large document or a bulk load: only the later records of a "
            "lane's keys (for turns, its agents), keyless ones and another heavy batch of its partition "
            "wait for it, and its embedding requests let theirs go first. A lane's partition is "
            "committed no further than its first record until it is applied."
        ),
    )
    ingest_lanes: int = Field(
        4,
        ge=0,
        le=64,
        description=(
            "Lanes (see ingest_lane_min_bytes) each ingest subscriber runs at once; a large batch past "
            "them is applied inline, holding the poll as every batch did before lanes. 0: no lanes."
        ),
    )
    query_workers: int = Field(
        32, ge=1, le=256, description="Queries answered concurrently (their embeddings are micro-batched)."
    )
    query_fetch_max_wait_ms: int = Field(
        5,
        ge=0,
        le=5000,
        description=(
            "Broker wait on the request topic; low keeps round trips fast on tansu, which may hold a "
            "fetch for all of it (an idle daemon here: 0.30 cores at 5 ms, 0.15 at 100). On Apache "
            "Kafka, 500 costs no latency."
        ),
    )
    idle_after_s: float = Field(
        30.0,
        ge=1.0,
        le=86_400.0,
        description="A subscriber that has had no record for this long waits idle_fetch_max_wait_ms per fetch.",
    )
    idle_fetch_max_wait_ms: int = Field(
        100,
        ge=0,
        le=5000,
        description=(
            "Broker wait of an idle subscriber (see idle_after_s); its first records back restore the short "
            "wait, so on tansu only those of a fetch or two may wait this much longer. Idle here, the daemon and tansu "
            "used 0.35 cores with the short waits, 0.10 with this. 0, or at most a subscriber's own wait: off."
        ),
    )
    query_timeout_s: float = Field(
        5.0,
        gt=0,
        le=600,
        description=(
            "Longest a request is worked on before it is answered `unavailable`: a Redis that hangs (stopped, "
            "swapping, a blocked script) answers nothing, and its socket timeout (10 s) came per command, so an "
            "asker whose own timeout was shorter heard nothing at all. Answers take milliseconds otherwise."
        ),
    )
    query_max_age_ms: int = Field(
        60_000,
        ge=1000,
        le=86_400_000,
        description=(
            "Requests older than this (their Kafka timestamp against the daemon's clock) are not "
            "searched: they get an `expired` error reply (their asker has given up, or its clock is "
            "behind the daemon's by this much). The request consumers start a new topic or partition "
            "at its beginning, so the first requests on a tenant topic created while the daemon runs "
            "are answered, and this cut-off, not the starting point, keeps a backlog from being searched."
        ),
    )
    ack_timeout_ms: int = Field(
        5_000,
        ge=100,
        le=120_000,
        description=(
            "How long a batch's write acknowledgements (events with reply_to and correlation_id "
            "headers) may take to publish, all together, before the batch is committed without the "
            "rest: an ack never holds ingestion up for longer, and one that cannot go is logged "
            "(ingest.ack_failed), not retried."
        ),
    )
    reply_max_bytes: int = Field(
        900_000,
        ge=4096,
        le=100 * 1024 * 1024,
        description=(
            "Largest query reply published: results are left off its end until it fits (the reply "
            "says truncated). The default fits Apache Kafka's 1 MB message limit and the producer's "
            "1 MiB request limit."
        ),
    )
    dlq_max_record_bytes: int = Field(
        900_000,
        ge=4096,
        le=100 * 1024 * 1024,
        description=(
            "Largest dead-letter record published. A record that would be larger leaves the original "
            "out (original_truncated; topic, partition and offset still point at it): the default fits "
            "Apache Kafka's 1 MB message limit and the producer's 1 MiB request limit."
        ),
    )

    @model_validator(mode="after")
    def _heartbeat_within_session(self) -> ConsumerConfig:
        # Kafka's rule of thumb: three heartbeats may be lost before the session ends.
        if self.heartbeat_interval_ms is not None and self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be at most a third of "
                f"session_timeout_ms ({self.session_timeout_ms})"
            )
        return self

    def with_default_session(self, session_timeout_ms: int) -> ConsumerConfig:
        """This config with another session timeout, unless one was set; validated again.

        Raises:
            ValidationError: a heartbeat set alone does not fit the new session.
        """
        if "session_timeout_ms" in self.model_fields_set:
            return self
        return ConsumerConfig.model_validate(
            {**self.model_dump(exclude_unset=True), "session_timeout_ms": session_timeout_ms}
        )

    @property
    def heartbeat_ms(self) -> int:
        """The heartbeat interval in effect: the setting, or a third of the session (3 s at most)."""
        if self.heartbeat_interval_ms is not None:
            return self.heartbeat_interval_ms
        return min(3_000, self.session_timeout_ms // 3)

    def group(self, role: str) -> str:
        """The consumer group of a role's subscriber (see :data:`ROLES`): ``<group_id>.<role>``."""
        return f"{self.group_id}.{role}"

    @staticmethod
    def role_of(group: str) -> str:
        """The role of a consumer group named by :meth:`group`: its last part."""
        return group.rsplit(".", 1)[-1]


class KafkaSecurity(BaseModel):
    """How to authenticate to Kafka: SASL (PLAIN, SCRAM) and/or TLS, passed to aiokafka/FastStream."""

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Kafka security protocol."
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "PLAIN", description="SASL mechanism (with SASL_PLAINTEXT or SASL_SSL)."
    )
    sasl_username: str = Field("", description="SASL user.")
    sasl_password: SecretStr = Field(SecretStr(""), description="SASL password (never logged).")
    ssl_cafile: str = Field("", description="CA bundle that signed the brokers' certificates ('' = system CAs).")
    ssl_certfile: str = Field("", description="Client certificate for mutual TLS.")
    ssl_keyfile: str = Field("", description="Client key for mutual TLS.")
    ssl_check_hostname: bool = Field(True, description="Verify the broker's hostname against its certificate.")

    @property
    def uses_ssl(self) -> bool:
        """Whether the connection is TLS."""
        return self.security_protocol in {"SSL", "SASL_SSL"}

    @property
    def uses_sasl(self) -> bool:
        """Whether the connection authenticates with SASL."""
        return self.security_protocol.startswith("SASL")

    def ssl_context(self) -> ssl.SSLContext | None:
        """A TLS context for the brokers, or ``None`` without TLS."""
        if not self.uses_ssl:
            return None
        ctx = ssl.create_default_context(cafile=self.ssl_cafile or None)
        ctx.check_hostname = self.ssl_check_hostname
        if self.ssl_certfile:
            ctx.load_cert_chain(self.ssl_certfile, self.ssl_keyfile or None)
        return ctx

    def aiokafka_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for aiokafka clients (producer, consumer, admin)."""
        kwargs: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.uses_ssl:
            kwargs["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = self.sasl_password.get_secret_value()
        return kwargs

    def faststream_security(self) -> BaseSecurity | None:
        """The same, as a FastStream security object."""
        from faststream.security import BaseSecurity, SASLPlaintext, SASLScram256, SASLScram512

        ctx = self.ssl_context()
        user, password = self.sasl_username, self.sasl_password.get_secret_value()
        if not self.uses_sasl:
            return BaseSecurity(ssl_context=ctx) if ctx is not None else None
        cls = {"PLAIN": SASLPlaintext, "SCRAM-SHA-256": SASLScram256, "SCRAM-SHA-512": SASLScram512}[
            self.sasl_mechanism
        ]
        return cls(username=user, password=password, ssl_context=ctx, use_ssl=self.uses_ssl)
