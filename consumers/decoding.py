"""Kafka records -> validated events, or DLQ records saying why not (pure)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar, get_args

from pydantic import BaseModel, TypeAdapter, ValidationError

from consumers.events import (
    DlqRecord,
    DocumentEvent,
    ForgetEvent,
    TranscriptEvent,
    TranscriptTopicEvent,
)
from consumers.spelling import near_spelling
from consumers.times import is_shorthand
from consumers.topic_names import TENANT_NAME_RULE
from memory.config import DEFAULT_MAX_FUTURE_S
from memory.records import DEFAULT_TENANT, MemoryItem

E = TypeVar("E", bound=BaseModel)


class RecordLike(Protocol):
    """What we read of an aiokafka ConsumerRecord."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class Decoded:
    """A valid event's memory item, with where it came from."""

    item: MemoryItem
    topic: str
    partition: int
    offset: int
    event_id: str | None = None  # what its ack is named by (the item does not keep it)
    # The record's key where it is not the one the event is published under (no key: ``""``):
    # its order against the doc's (or session's) other events is not kept.
    keyed_apart: str | None = None


def _text(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def headers_of(record: RecordLike) -> dict[str, str]:
    """Headers as text; undecodable bytes are replaced rather than failing the record."""
    return {k: (v or b"").decode("utf-8", errors="replace") for k, v in (record.headers or ())}


def record_time(record: RecordLike) -> float | None:
    """The record's Kafka timestamp in epoch seconds (CreateTime or LogAppendTime), if any.

    An event without a ``timestamp`` is dated by it rather than by the moment it is
    decoded: a replay (a restart before the commit, ``agentmemd reindex``) then dates it as
    the first delivery did, and ``time_range`` and ``recency_weight`` stay true.
    """
    ts = getattr(record, "timestamp", None)
    return ts / 1000.0 if isinstance(ts, int) and ts > 0 else None


#: Longest reason a dead letter carries. A reason may quote the input (a validation message,
#: an exception's text): uncut, one quoting a 2 MB metadata key made a record no shrinking
#: step could fit, its publish failed forever and its partition never committed again.
REASON_MAX_CHARS = 2000


def short_reason(reason: str, limit: int = REASON_MAX_CHARS) -> str:
    """``reason`` cut to ``limit`` characters, saying how much was cut."""
    if len(reason) <= limit:
        return reason
    return f"{reason[:limit]}… ({len(reason) - limit} more characters cut)"


def dead_letter(record: RecordLike, reason: str, code: str, attempts: int = 1) -> DlqRecord:
    """A DLQ record carrying the original bytes (base64), position and the reason (cut short)."""
    raw = record.value or b""
    key = record.key
    return DlqRecord(
        reason=short_reason(reason),
        error_code=code,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=(_text(key) if _text(key) is not None else base64.b64encode(key).decode()) if key is not None else None,
        original_b64=base64.b64encode(raw).decode(),
        original_text=_text(raw),
        headers=headers_of(record),
        attempts=attempts,
        failed_at=datetime.now(UTC).isoformat(),
        original_size=len(raw),
    ).with_raw_key(key)


def dlq_body(record: DlqRecord, max_bytes: int) -> tuple[bytes, bytes | None]:
    """The record's JSON and Kafka key, made to fit ``max_bytes`` together.

    Both copies of the original make a record ~2.3 times its event, and the key travels
    twice (as the Kafka key and in the body). One that does not fit could never be published
    (the producer's and Apache Kafka's limits are 1 MB by default), and its batch would be
    redelivered forever. So, until it fits: ``original_text`` goes, then ``original_b64``
    (``original_truncated`` says so; ``original_size`` keeps the length), then the headers
    and the key (published without one), then most of the reason. Topic, partition and offset still point at the
    original while the topic retains it.
    """
    key = record.raw_key
    steps: list[dict[str, Any]] = [
        {},
        {"original_text": None},
        {"original_text": None, "original_b64": "", "original_truncated": True},
        {"original_text": None, "original_b64": "", "original_truncated": True, "headers": {}, "key": None},
        # A DLQ limit set below a few KB: the reason too, so the last step always fits.
        {
            "original_text": None,
            "original_b64": "",
            "original_truncated": True,
            "headers": {},
            "key": None,
            "reason": short_reason(record.reason, 200),
        },
    ]
    body = b""
    for i, update in enumerate(steps):
        if i >= len(steps) - 2:
            key = None
        body = record.model_copy(update=update).model_dump_json().encode()
        if len(body) + len(key or b"") <= max_bytes:
            break
    return body, key


def validation_reason(exc: ValidationError, *, root: str | None = None, model: type[BaseModel] | None = None) -> str:
    """The first five problems pydantic found, one line (``metadata.blob: String should …``);
    ``root`` names a problem of the whole object (unnamed: its message alone). With ``model``,
    an unknown field that spells one of its fields nearly right says which."""
    parts = []
    for err in exc.errors(include_url=False)[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or root
        msg = err["msg"]
        if err["type"] == "value_error":  # our own validators' words, without pydantic's prefix
            msg = msg.removeprefix("Value error, ")
        elif err["type"].startswith("datetime") and isinstance(err.get("input"), str) and is_shorthand(err["input"]):
            # "7d" or "yesterday": what the clients, the CLI and the MCP tools read, never sent on.
            msg = (
                f"{err['input']!r} is the clients' shorthand (MemoryClient, the CLI and the MCP tools turn it "
                "into a time): send an ISO 8601 time, e.g. 2026-12-01T00:00:00Z"
            )
        elif err["type"] == "extra_forbidden" and model is not None and err["loc"]:
            fields = _fields_at(model, err["loc"][:-1])
            if near := near_spelling(str(err["loc"][-1]), fields):
                msg = f"unknown field: did you mean {near!r}?"
            else:
                msg = "unknown field"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def _fields_at(model: type[BaseModel], path: Sequence[int | str]) -> list[str]:
    """The fields of the model nested in ``model`` at ``path`` (``("hybrid_params",)``), or none."""
    for step in path:
        field = model.model_fields.get(str(step))
        if field is None:
            return []
        nested = [a for a in (field.annotation, *get_args(field.annotation)) if isinstance(a, type)]
        found = next((a for a in nested if issubclass(a, BaseModel)), None)
        if found is None:
            return []
        model = found
    return list(model.model_fields)


def parse_event(raw: bytes | None, model: type[E]) -> E:
    """Validate one record's bytes as ``model``.

    Raises:
        ValueError: with a readable reason (empty body, invalid UTF-8/JSON, schema errors).
    """
    _check_body(raw)
    try:
        return model.model_validate_json(raw or b"")
    except ValidationError as exc:
        raise ValueError(validation_reason(exc, model=model) + _misspelt(raw, exc)) from exc


def _misspelt(raw: bytes | None, exc: ValidationError) -> str:
    """For a required field missing, the field of the body that spells it nearly right, if
    any ("; 'verison' is no field: did you mean 'version'?"); "" otherwise. The body is read
    again only here, on the way to a dead letter."""
    missing = [str(e["loc"][-1]) for e in exc.errors(include_url=False) if e["type"] == "missing" and e["loc"]]
    if not missing:
        return ""
    try:
        body = json.loads(raw or b"")
    except ValueError:
        return ""
    if not isinstance(body, dict):
        return ""
    for field in missing:
        if near := near_spelling(field, [k for k in body if k != field]):
            return f"; {near[:64]!r} is no field: did you mean {field!r}?"
    return ""


def _check_body(raw: bytes | None) -> None:
    if not raw:
        raise ValueError("empty message body")
    if _text(raw) is None:
        raise ValueError("message body is not valid UTF-8")


_TRANSCRIPT_TOPIC: TypeAdapter[TranscriptEvent | ForgetEvent] = TypeAdapter(TranscriptTopicEvent)


def parse_transcript(raw: bytes | None) -> TranscriptEvent | ForgetEvent:
    """A transcripts-topic record: a turn, or a forget (``"op": "forget"``).

    Raises:
        ValueError: as ``parse_event``; an unknown ``op`` too.
    """
    _check_body(raw)
    try:
        return _TRANSCRIPT_TOPIC.validate_json(raw or b"")
    except ValidationError as exc:
        raise ValueError(validation_reason(exc) + _misspelt(raw, exc)) from exc


def decode_records(
    records: Sequence[RecordLike],
    *,
    kind: str,
    filter_keys: Collection[str],
    max_content_bytes: int,
    max_future_s: float = DEFAULT_MAX_FUTURE_S,
    tenant_of: Callable[[str], str | None] = lambda _topic: DEFAULT_TENANT,
) -> tuple[list[Decoded], list[DlqRecord]]:
    """Split a batch into valid items (in order) and dead letters.

    Args:
        records: one poll's records of one topic kind.
        kind: ``"document"`` or ``"transcript"``.
        filter_keys: metadata keys that become TAG values.
        max_content_bytes: larger content is rejected.
        max_future_s: a timestamp further after its record's time is rejected.
        tenant_of: the tenant of a record's topic (``None``: not a valid tenant topic).

    Returns:
        ``(decoded, dead)``.
    """
    good: list[Decoded] = []
    dead: list[DlqRecord] = []
    for rec in records:
        # Refused unparsed only past what valid content could escape to: JSON may write each
        # byte of it as six (a control character as \u0001; a 3-byte character as one \uXXXX),
        # and up to 64 metadata values of 4,096 characters ride along. The exact check of the
        # content's UTF-8 length follows the parse.
        if rec.value is not None and len(rec.value) > 6 * max_content_bytes + 2 * 1024 * 1024:
            dead.append(
                dead_letter(rec, f"message larger than the {max_content_bytes}-byte content limit", "invalid_event")
            )
            continue
        try:
            event: Any = parse_event(rec.value, DocumentEvent) if kind == "document" else parse_transcript(rec.value)
            if event.content is not None and len(event.content.encode("utf-8")) > max_content_bytes:
                raise ValueError(f"content larger than {max_content_bytes} bytes")
            tenant = tenant_of(rec.topic)
            if tenant is None:
                raise ValueError(
                    f"topic {rec.topic!r} names no tenant: in topic tenancy events are applied from "
                    f"<topic>.<tenant> only, tenant {TENANT_NAME_RULE}; `agentmemd dlq replay --tenant NAME` "
                    "sends this one to its tenant's topic"
                )
            item = event.to_item(filter_keys, tenant, default_ts=record_time(rec), max_future_s=max_future_s)
        except ValueError as exc:
            dead.append(dead_letter(rec, str(exc), "invalid_event"))
            continue
        eid = event.event_id
        apart = None if rec.key == event.key.encode() else "" if rec.key is None else _text(rec.key) or repr(rec.key)
        good.append(Decoded(item, rec.topic, rec.partition, rec.offset, eid if len(eid) <= 256 else None, apart))
    return good, dead
