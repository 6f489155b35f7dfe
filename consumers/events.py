"""The events side of the wire contract (docs/contract.md): document, transcript and forget
events as pydantic models, their translation to memory items, the write ack an event's writer
hears, and the dead letter a refused event becomes.

Models are strict: ``"version": "3"`` is a type error, not a silent coercion, because a
client that sends strings where numbers belong has a bug the DLQ should show.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    StringConstraints,
    Tag,
    field_validator,
    model_validator,
)

from consumers.fields import MAX_META_CHARS, MAX_VERSION, AgentPart, DocId, MetaValue, NonEmpty
from consumers.spelling import near_spelling
from consumers.times import age
from memory.config import DEFAULT_MAX_FUTURE_S
from memory.conversation import TURN_PREFIX, session_source, turn_doc_id, turn_prefix
from memory.filters import tag_values
from memory.records import COMMUNITY_PREFIX, DEFAULT_TENANT, MemoryItem


def session_key(agent_id: str, session_id: str | None) -> str:
    """The Kafka key of a session's turns and forgets (an agent-wide forget's: the agent id)."""
    return agent_id if session_id is None else f"{agent_id}/{session_id}"


class _Event(BaseModel):
    # Unknown fields are read past (held aside, never used): a producer may carry its own, or
    # a later contract's. Held, so that a misspelt one can be told from those.
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    @model_validator(mode="after")
    def _no_misspelt_fields(self) -> Self:
        """Refuse an unknown field that spells a missing one nearly right (``metdata``): it
        would be read past, and the event stored without what it meant to carry. (After
        validation: a check before it would make pydantic read the JSON as Python objects,
        where a strict datetime refuses a string.)"""
        missing = [f for f in type(self).model_fields if f not in self.model_fields_set]
        for key in self.model_extra or {}:
            near = near_spelling(key, missing)
            # A field extended (timestamp_ms, source_id, sources) is the producer's own; one cut
            # short (rol, metadat) is a misspelling like any other.
            if near and not key.startswith(near):
                raise ValueError(f"unknown field {key[:64]!r}: did you mean {near!r}?")
        return self


def _plain_values(meta: Any) -> Any:
    """Name the value that is not a string, number or boolean (or is too long), before
    pydantic tries each of the four types and reports all four failures."""
    if isinstance(meta, dict):
        for key, value in meta.items():
            where = f"metadata[{str(key)[:64]!r}]"
            if value is None or isinstance(value, dict | list):
                kind = "null" if value is None else "an object" if isinstance(value, dict) else "an array"
                raise ValueError(f"{where} is {kind}: metadata values are strings, numbers or booleans")
            if isinstance(value, str) and len(value) > MAX_META_CHARS:
                raise ValueError(f"{where} is {len(value)} characters long: at most {MAX_META_CHARS}")
    return meta


def _check_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    if len(meta) > 64:
        raise ValueError("metadata has more than 64 keys")
    for key, value in meta.items():
        if not key or len(key) > 128:
            # Quoted cut short: a dead letter's reason must never outgrow the DLQ's record limit.
            cut = "…" if len(key) > 64 else ""
            raise ValueError(f"metadata key {key[:64]!r}{cut} ({len(key)} characters) must be 1..128 characters")
        # Python's JSON reader takes NaN and Infinity; they are not JSON, and replies must be.
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"metadata[{key!r}] is not a finite number")
    return meta


def _epoch(ts: datetime | None, default: float | None = None, max_future_s: float = DEFAULT_MAX_FUTURE_S) -> float:
    """Epoch seconds of an event's time; without one, ``default`` (the Kafka record's time,
    so that a replay dates it as the first delivery did), else now.

    Raises:
        ValueError: the time is more than ``max_future_s`` after ``default`` (else now).
    """
    reference = default if default is not None else datetime.now(UTC).timestamp()
    if ts is None:
        return reference
    against = "its Kafka record's time" if default is not None else "the daemon's clock"
    return not_ahead(ts, reference, max_future_s, against)


def not_ahead(ts: datetime, reference: float, max_future_s: float, against: str) -> float:
    """Epoch seconds of ``ts`` (naive: UTC), checked against ``reference`` (epoch seconds),
    which ``against`` names for people ("this client's clock").

    Raises:
        ValueError: ``ts`` is more than ``max_future_s`` after ``reference``.
    """
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    epoch = ts.timestamp()
    if epoch > reference + max_future_s:
        raise ValueError(
            f"timestamp {ts.isoformat()} is {age(epoch - reference)} ({epoch - reference:.0f} s) after {against}; "
            f"a timestamp says when the memory was recorded, at most {max_future_s:g} s ahead (a time without a "
            "zone is read as UTC)"
        )
    return epoch


#: doc_id prefixes the daemon writes itself (transcript turns, community summaries): a
#: document event naming one could overwrite or delete what it did not write.
RESERVED_DOC_PREFIXES = (TURN_PREFIX, COMMUNITY_PREFIX)


class DocumentEvent(_Event):
    """A change to a document; Kafka key = doc_id."""

    event_id: NonEmpty
    op: Literal["upsert", "delete"]
    doc_id: DocId
    version: int = Field(ge=0, le=MAX_VERSION)
    source: Annotated[str, StringConstraints(max_length=1024)] | None = None
    content: str | None = None
    metadata: dict[str, MetaValue] = Field(default_factory=dict)
    timestamp: datetime | None = None

    _plain = field_validator("metadata", mode="before")(_plain_values)
    _check = field_validator("metadata")(_check_metadata)

    @field_validator("doc_id")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value.startswith(RESERVED_DOC_PREFIXES):
            raise ValueError(f"doc_id may not start with {' or '.join(RESERVED_DOC_PREFIXES)} (the daemon's own ids)")
        return value

    @property
    def key(self) -> str:
        """The Kafka key it is published under: its ``doc_id``, so a doc's changes keep their order."""
        return self.doc_id

    def to_item(
        self,
        filter_keys: Collection[str],
        tenant: str = DEFAULT_TENANT,
        *,
        default_ts: float | None = None,
        max_future_s: float = DEFAULT_MAX_FUTURE_S,
    ) -> MemoryItem:
        """The memory item this event asks for (a delete's content, if any, is ignored).

        Raises:
            ValueError: an upsert without content, or with blank content; a timestamp more
                than ``max_future_s`` after ``default_ts`` (else now).
        """
        if self.op == "upsert" and (self.content is None or not self.content.strip()):
            raise ValueError("an upsert needs content" if self.content is None else "content is empty")
        return MemoryItem(
            op=self.op,
            doc_id=self.doc_id,
            version=self.version,
            kind="document",
            content=self.content or "",
            source=self.source or self.doc_id,
            tags=tag_values(self.metadata, filter_keys),
            metadata=dict(self.metadata),
            timestamp=_epoch(self.timestamp, default_ts, max_future_s),
            tenant=tenant,
        )


class TranscriptEvent(_Event):
    """One turn of an agent session; Kafka key = ``agent_id/session_id``; idempotent per turn."""

    event_id: NonEmpty
    agent_id: AgentPart
    session_id: AgentPart
    turn: int = Field(ge=0, le=MAX_VERSION)
    role: Annotated[str, StringConstraints(min_length=1, max_length=64)] = "assistant"
    content: str
    timestamp: datetime | None = None
    metadata: dict[str, MetaValue] = Field(default_factory=dict)
    # Written only if the turn holds nothing else (memory.turn_claims): a writer that took the
    # number as the session's next one.
    if_absent: bool = False

    _plain = field_validator("metadata", mode="before")(_plain_values)
    _check = field_validator("metadata")(_check_metadata)

    @field_validator("content")
    @classmethod
    def _content_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("content is empty")
        return value

    @property
    def doc_id(self) -> str:
        """The stable id of this turn's chunks.

        ``%`` and ``/`` in the agent and session ids are percent-encoded, so that
        (``ops/east``, ``s1``) and (``ops``, ``east/s1``) stay two sessions
        (``memory.conversation.turn_doc_id``).
        """
        return turn_doc_id(self.agent_id, self.session_id, self.turn)

    @property
    def key(self) -> str:
        """The Kafka key it is published under: its session's (``session_key``)."""
        return session_key(self.agent_id, self.session_id)

    def to_item(
        self,
        filter_keys: Collection[str],
        tenant: str = DEFAULT_TENANT,
        *,
        default_ts: float | None = None,
        max_future_s: float = DEFAULT_MAX_FUTURE_S,
    ) -> MemoryItem:
        """The memory item for this turn (unversioned: a redelivery overwrites identically).

        Raises:
            ValueError: a timestamp more than ``max_future_s`` after ``default_ts`` (else now).
        """
        # The event's own fields win over metadata of the same names, in what is stored and
        # so in the tags: a deployment that makes `role` filterable can filter turns by it.
        metadata = {
            **self.metadata,
            "role": self.role,
            "turn": self.turn,
            "agent_id": self.agent_id,
            "session_id": self.session_id,
        }
        return MemoryItem(
            op="upsert",
            doc_id=self.doc_id,
            version=None,
            kind="transcript",
            content=self.content,
            source=session_source(self.agent_id, self.session_id),
            tags=tag_values(metadata, filter_keys),
            metadata=metadata,
            timestamp=_epoch(self.timestamp, default_ts, max_future_s),
            tenant=tenant,
            if_absent=self.if_absent,
        )


def forget_scope_error(session_id: str | None, all_sessions: bool, turn: int | None = None) -> str | None:
    """What is wrong with a forget's scope, or None: it names one turn of a session, one
    session, or every one (pure)."""
    if session_id is not None and all_sessions:
        return "a forget names a session_id or sets all_sessions, not both"
    if session_id is None and not all_sessions:
        return (
            "a forget names a session_id, or sets all_sessions to forget every session of the agent; "
            "this one does neither"
        )
    if turn is not None and session_id is None:
        return "a forget of one turn names its session_id too"
    return None


class ForgetEvent(_Event):
    """Forget one turn (``session_id`` and ``turn``), a session's turns (``session_id``), or
    every turn of an agent (``all_sessions``).

    Published on the transcripts topic with the session's key (``agent_id/session_id``), so
    it applies after every turn of that session published before it; turns published after
    it are kept. An agent-wide forget (key ``agent_id``) may be on another partition than
    some session's turns: it forgets what is stored when it is applied.

    Strict where a turn is lenient: an unknown field is an error, and forgetting every
    session takes ``"all_sessions": true``, so that a misspelt or null ``session_id`` can
    never widen a forget that cannot be undone.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    event_id: NonEmpty
    op: Literal["forget"]
    agent_id: AgentPart
    session_id: AgentPart | None = None
    all_sessions: bool = False
    turn: int | None = Field(None, ge=0, le=MAX_VERSION)

    @model_validator(mode="after")
    def _one_scope(self) -> ForgetEvent:
        if (why := forget_scope_error(self.session_id, self.all_sessions, self.turn)) is not None:
            raise ValueError(why)
        return self

    @property
    def content(self) -> None:
        """A forget carries no content (the decoder's size check reads this)."""
        return None

    @property
    def key(self) -> str:
        """The Kafka key it is published under: its session's, or for every session its agent's."""
        return session_key(self.agent_id, self.session_id)

    def to_item(
        self,
        filter_keys: Collection[str],
        tenant: str = DEFAULT_TENANT,
        *,
        default_ts: float | None = None,
        max_future_s: float = DEFAULT_MAX_FUTURE_S,
    ) -> MemoryItem:
        """A ``forget`` item: the turn doc ids' common prefix (for one turn, that turn's doc id)
        and the tags every such turn carries (``memory.forgets`` expands it)."""
        tags = {"agent_id": self.agent_id, "kind": "transcript"}
        if self.session_id is not None:
            tags["session_id"] = self.session_id
        if self.session_id is not None and self.turn is not None:
            doc_id = turn_doc_id(self.agent_id, self.session_id, self.turn)
        else:
            doc_id = turn_prefix(self.agent_id, self.session_id)
        return MemoryItem(op="forget", doc_id=doc_id, version=None, kind="transcript", tags=tags, tenant=tenant)


def _transcript_op(value: Any) -> str:
    # Turns never had an op: one sent anyway as "upsert" is ignored as any extra field is.
    # Another ("delete", say) would be stored as a turn, the opposite of what its writer meant.
    op = value.get("op") if isinstance(value, dict) else getattr(value, "op", None)
    if op == "forget":
        return "forget"
    if op is not None and op != "upsert":
        shown = repr(op[:40]) if isinstance(op, str) else f"of type {type(op).__name__}"
        raise ValueError(
            f"unknown op {shown} on the transcripts topic: a turn has no op (or upsert); "
            'a turn, a session or an agent is forgotten with "op": "forget"'
        )
    return "turn"


#: What the transcripts topic carries: turns and (``"op": "forget"``) forgets.
TranscriptTopicEvent = Annotated[
    Annotated[TranscriptEvent, Tag("turn")] | Annotated[ForgetEvent, Tag("forget")],
    Discriminator(_transcript_op),
]


class WriteAck(BaseModel):
    """What the writer of an event hears on its ``reply_to`` once the event's writes are
    searchable (or it was refused): see "Write acknowledgements" in docs/contract.md.

    ``indexed``: the event's version is the one stored (written now, or by an earlier delivery
    of it). ``ignored``: an older version than the stored one, or superseded by a later event
    of the same doc in the same batch (``error_code`` None: a retry, nothing lost); or refused
    (``error_code`` ``version_conflict``: its version already written saying something else;
    ``tenant_erased``; ``turn_taken``: a claimed turn that held another). ``dead_lettered``:
    refused; ``reason`` and ``error_code`` say why, as its DLQ record does.
    """

    event_id: str | None
    status: Literal["indexed", "ignored", "dead_lettered"]
    doc_id: str | None = None
    version: int | None = None
    chunks: int | None = None  # chunks this delivery wrote (None: it wrote none)
    embedded: int | None = None  # of those, the chunks sent to the model (the rest reused stored vectors)
    forgotten: int | None = None  # a forget's turns this delivery removed (0: none were stored)
    removed: int | None = None  # a document delete's chunks this delivery removed (0: none were stored)
    stored_version: int | None = None
    reason: str | None = None
    error_code: str | None = None


class DlqRecord(BaseModel):
    """A rejected event with everything needed to inspect or replay it."""

    reason: str
    error_code: str
    topic: str
    partition: int
    offset: int
    key: str | None
    original_b64: str
    original_text: str | None
    headers: dict[str, str]
    attempts: int = 1
    failed_at: str
    original_size: int = 0
    original_truncated: bool = False
    # The record's key as it arrived (the DLQ record is published under it); ``key`` above
    # is its text form, base64 when not UTF-8.
    _raw_key: bytes | None = PrivateAttr(default=None)

    @property
    def raw_key(self) -> bytes | None:
        """The original record's key, byte for byte (the DLQ record's Kafka key)."""
        return self._raw_key

    def with_raw_key(self, key: bytes | None) -> DlqRecord:
        """This record, remembering the original key's bytes."""
        self._raw_key = key
        return self
