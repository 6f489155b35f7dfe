"""Config sections owned by ``consumers/``: topic names and consumer tuning."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


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
        30_000, ge=100, description="How often topic metadata is refreshed (new tenant topics are found this fast)."
    )
    group_id: str = Field(
        "agentmemd",
        description=(
            "Consumer group prefix shared by every daemon of a deployment "
            "(<id>.documents, <id>.transcripts, <id>.requests)."
        ),
    )
    ingest_max_records: int = Field(128, ge=1, le=10_000, description="Most records handled as one ingest batch.")
    ingest_fetch_max_wait_ms: int = Field(20, ge=0, le=5000, description="Broker wait for more ingest data.")
    ingest_batch_timeout_ms: int = Field(50, ge=1, le=10_000, description="How long a batch poll waits for records.")
    query_workers: int = Field(8, ge=1, le=256, description="Queries answered concurrently.")
    query_fetch_max_wait_ms: int = Field(
        5, ge=0, le=5000, description="Broker wait on the request topic; low keeps round trips fast."
    )
