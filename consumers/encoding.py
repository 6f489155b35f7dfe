"""Client calls -> wire bodies: the JSON each ``MemoryClient`` call sends, and the daemon's own
checks of an event, run before it is sent (the counterpart of ``consumers.decoding``)."""

from __future__ import annotations

import json
import math
import time
import unicodedata
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from consumers.config import event_record_bytes
from consumers.decoding import parse_event
from consumers.events import DocumentEvent, TranscriptEvent, not_ahead
from consumers.times import when
from memory.config import DEFAULT_MAX_FUTURE_S
from memory.errors import InvalidEvent, InvalidRequest
from memory.filters import EXCLUDE_OPERATOR, tag_text


def iso(t: datetime) -> str:
    """ISO 8601 for the wire; a naive time is UTC, as the daemon reads it."""
    return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).isoformat()


def _stamp(timestamp: datetime | str | None) -> str:
    """An event's time for the wire: a datetime or an ISO 8601 time (naive: UTC); now if None.

    Raises:
        InvalidEvent: a string that is no time.
    """
    try:
        at = when(timestamp, "timestamp")
    except InvalidRequest as exc:
        raise InvalidEvent(str(exc)) from None
    return iso(at or datetime.now(UTC))


def encode(payload: Mapping[str, Any]) -> bytes:
    """``payload`` as the UTF-8 JSON of a record's value."""
    # Not ASCII-escaped: non-ASCII text would grow 2-6 times on the wire.
    return json.dumps(payload, ensure_ascii=False).encode()


def encode_request(payload: Mapping[str, Any]) -> bytes:
    """A request's ``payload`` encoded.

    Raises:
        InvalidRequest: it holds text that UTF-8 cannot carry (a lone surrogate).
    """
    try:
        return encode(payload)
    except UnicodeEncodeError as exc:  # e.g. from undecodable argv bytes, or text cut mid-pair
        raise InvalidRequest(f"not sendable as UTF-8 text: {exc}") from exc


def _query_id(given: str | None, prefix: str) -> str:
    """``given``, or a random id with ``prefix`` if None.

    Raises:
        InvalidRequest: ``given`` is empty (the daemon would refuse it).
    """
    if given is None:
        return f"{prefix}_{uuid.uuid4().hex[:12]}"
    if not given:
        raise InvalidRequest("query_id is empty: give a non-empty one, or None for a random one")
    return given


def encode_event(
    model: type[DocumentEvent] | type[TranscriptEvent],
    payload: Mapping[str, Any],
    *,
    max_content_bytes: int,
    max_future_s: float = DEFAULT_MAX_FUTURE_S,
) -> bytes:
    """``payload`` encoded, once it passed the checks the daemon runs on it (the contract's
    models, the content limit, a timestamp at most ``max_future_s`` ahead of now); what the
    daemon would dead-letter fails here instead.

    Raises:
        InvalidEvent: the daemon would refuse it, with the reason.
    """
    try:
        value = encode(payload)
        event = parse_event(value, model)  # the daemon's own parsing, and its reasons
        # An upsert's content rules; the time apart, against this host's clock: the daemon
        # judges it against the record's, which the producer stamps as it sends.
        event.to_item((), max_future_s=math.inf)
        if event.timestamp is not None:
            not_ahead(event.timestamp, time.time(), max_future_s, "this client's clock")
    except UnicodeEncodeError as exc:  # a lone surrogate, e.g. from undecodable argv bytes
        raise InvalidEvent(f"not sendable as UTF-8 text: {exc}") from exc
    except ValueError as exc:
        raise InvalidEvent(str(exc)) from exc
    content = payload.get("content")
    if isinstance(content, str) and not _has_token(content):
        # The daemon's tokenizer finds nothing in it, so it dead-letters it (memory.ingest).
        raise InvalidEvent("content has no tokens (only whitespace, format or control characters)")
    if isinstance(content, str) and (size := len(content.encode("utf-8"))) > max_content_bytes:
        raise InvalidEvent(
            f"content is {size:,} bytes, over the {max_content_bytes:,}-byte limit (AGENTMEM_INGEST__MAX_CONTENT_BYTES)"
        )
    if len(value) > (limit := event_record_bytes(max_content_bytes)):
        raise InvalidEvent(
            f"the event encodes to {len(value):,} bytes, over the {limit:,}-byte record limit of the event "
            "topics (twice the content limit): JSON escaping of its quotes, backslashes or control "
            "characters, or its metadata, takes it past; send less of it"
        )
    return value


def _has_token(text: str) -> bool:
    """Whether ``text`` holds anything the model's tokenizer keeps: it drops whitespace, format
    characters (a zero-width space, a BOM) and control characters."""
    return any(not c.isspace() and unicodedata.category(c) not in ("Cc", "Cf") for c in text)


#: A filter as the client takes it: key -> a value, values (any of them), or
#: ``{"not": value or values}`` (none of them); numbers and booleans as their stored text.
ClientFilterValue = str | int | float | Sequence[str | int | float]
ClientFilter = Mapping[str, ClientFilterValue | Mapping[str, ClientFilterValue]]


def query_body(
    text: str,
    *,
    top_k: int,
    metadata_filter: ClientFilter | None,
    dense_weight: float | None,
    sparse_weight: float | None,
    identifier_weight: float | None,
    recency_weight: float | None,
    rrf_k: int | None,
    query_id: str | None,
    scope: str | None,
    since: datetime | str | None,
    until: datetime | str | None,
    context_turns: int,
    speaker_weight: float | None = None,
    min_similarity: float | None = None,
    fold_repeats: bool = True,
    max_per_doc: int | None = None,
) -> dict[str, Any]:
    """A query request's body; ``MemoryClient.query`` documents the arguments.

    Raises:
        InvalidRequest: ``since`` or ``until`` is no time (see ``when``).
    """
    hybrid: dict[str, Any] = {}
    if dense_weight is not None:
        hybrid["dense_weight"] = dense_weight
    if sparse_weight is not None:
        hybrid["sparse_weight"] = sparse_weight
    if identifier_weight is not None:
        hybrid["identifier_weight"] = identifier_weight
    if recency_weight is not None:
        hybrid["recency_weight"] = recency_weight
    if speaker_weight is not None:
        hybrid["speaker_weight"] = speaker_weight
    if rrf_k is not None:
        hybrid["rrf_k_constant"] = rrf_k
    if min_similarity is not None:
        hybrid["min_similarity"] = min_similarity
    payload: dict[str, Any] = {
        "query_id": _query_id(query_id, "q"),
        "search_text": text,
        "top_k": top_k,
    }
    if hybrid:
        payload["hybrid_params"] = hybrid
    if metadata_filter:
        payload["metadata_filter"] = _filter_body(metadata_filter)
    if scope is not None:
        payload["scope"] = scope
    if context_turns:
        payload["context_turns"] = context_turns
    if not fold_repeats:
        payload["fold_repeats"] = False
    if max_per_doc is not None:
        payload["max_per_doc"] = max_per_doc
    times = {name: when(t, name) for name, t in (("since", since), ("until", until))}
    window = {name: iso(t) for name, t in times.items() if t is not None}
    if window:
        payload["time_range"] = window
    return payload


TurnRef = tuple[str, str, int] | Mapping[str, Any]


def _turn_body(ref: TurnRef) -> dict[str, Any]:
    """A turn to look up, as the wire has it, from ``(agent_id, session_id, turn)`` or that mapping.

    Raises:
        InvalidRequest: ``ref`` is neither (a mapping's fields are the daemon's to check).
    """
    if isinstance(ref, Mapping):
        return dict(ref)
    if isinstance(ref, tuple | list) and len(ref) == 3:
        a, s, t = ref
        return {"agent_id": a, "session_id": s, "turn": t}
    raise InvalidRequest(f"turns: {ref!r} is not (agent_id, session_id, turn) nor a mapping of those fields")


def get_body(
    doc_ids: Sequence[str] | str,
    turns: Sequence[TurnRef],
    metadata_filter: ClientFilter | None,
    query_id: str | None,
    history: bool = False,
    content_offset: int = 0,
    version: int | None = None,
) -> dict[str, Any]:
    """A get request's body; ``MemoryClient.get`` documents the arguments.

    Raises:
        InvalidRequest: a turn is neither a triple nor a mapping.
    """
    payload: dict[str, Any] = {
        "query_id": _query_id(query_id, "g"),
        "op": "get",
        "doc_ids": [doc_ids] if isinstance(doc_ids, str) else list(doc_ids),  # one id, not its letters
        "turns": [_turn_body(ref) for ref in turns],
    }
    if metadata_filter:
        payload["metadata_filter"] = _filter_body(metadata_filter)
    if history:
        payload["history"] = True
    if content_offset:
        payload["content_offset"] = content_offset
    if version is not None:
        payload["version"] = version
    return payload


def _filter_body(metadata_filter: Mapping[str, Any]) -> dict[str, Any]:
    """The wire's filter: strings. A number or a boolean is written as its stored TAG value
    (``str``, booleans as true/false), so ``{"team": 5}`` finds the memories that stored 5;
    ``{"not": ...}`` keeps its shape, its values written alike.

    Raises:
        InvalidRequest: ``metadata_filter`` is no mapping (the values are the daemon's to check).
    """
    if not isinstance(metadata_filter, Mapping):
        raise InvalidRequest(
            "metadata_filter takes a mapping of key -> value, values or {'not': ...}, got "
            f"{type(metadata_filter).__name__}: {metadata_filter!r:.80}"
        )

    def text(value: Any) -> Any:
        return tag_text(value) if isinstance(value, int | float) else value  # bool is an int

    def values(v: Any) -> Any:
        return [text(x) for x in v] if isinstance(v, list | tuple | set | frozenset) else text(v)

    return {
        k: {EXCLUDE_OPERATOR: values(v[EXCLUDE_OPERATOR])}
        if isinstance(v, Mapping) and set(v) == {EXCLUDE_OPERATOR}
        else values(v)
        for k, v in metadata_filter.items()
    }


def recent_body(
    agent_id: str,
    session_id: str | None,
    limit: int,
    metadata_filter: ClientFilter | None,
    query_id: str | None,
) -> dict[str, Any]:
    """A recent request's body; ``MemoryClient.recent`` documents the arguments."""
    payload: dict[str, Any] = {
        "query_id": _query_id(query_id, "r"),
        "op": "recent",
        "agent_id": agent_id,
        "limit": limit,
    }
    if session_id is not None:
        payload["session_id"] = session_id
    if metadata_filter:
        payload["metadata_filter"] = _filter_body(metadata_filter)
    return payload


def list_body(field: str, source_prefix: str, limit: int, offset: int, query_id: str | None) -> dict[str, Any]:
    """A list request's body; ``MemoryClient.list_values`` documents the arguments."""
    return {
        "query_id": _query_id(query_id, "l"),
        "op": "list",
        "field": field,
        "source_prefix": source_prefix,
        "limit": limit,
        "offset": offset,
    }


def document_body(
    doc_id: str,
    content: str,
    version: int,
    source: str | None,
    metadata: Mapping[str, Any] | None,
    timestamp: datetime | str | None,
) -> dict[str, Any]:
    """An upsert's body, with a fresh event id; ``MemoryClient.document_event`` documents the
    arguments. Without a source none is sent: the daemon takes the doc id (copied here, a doc
    id too long was also reported as a source too long, though none was given)."""
    body = {
        "event_id": uuid.uuid4().hex,
        "op": "upsert",
        "doc_id": doc_id,
        "version": version,
        "content": content,
        "metadata": dict(metadata or {}),
        "timestamp": _stamp(timestamp),
    }
    return body if not source else {**body, "source": source}


def delete_body(doc_id: str, version: int) -> dict[str, Any]:
    """A delete's body, with a fresh event id."""
    return {"event_id": uuid.uuid4().hex, "op": "delete", "doc_id": doc_id, "version": version}


def turn_body(
    agent_id: str,
    session_id: str,
    turn: int,
    content: str,
    role: str,
    metadata: Mapping[str, Any] | None,
    timestamp: datetime | str | None,
) -> dict[str, Any]:
    """A transcript turn's body, with a fresh event id; ``MemoryClient.publish_observation``
    documents the arguments."""
    payload = {
        "event_id": uuid.uuid4().hex,
        "agent_id": agent_id,
        "session_id": session_id,
        "turn": turn,
        "role": role,
        "content": content,
        "metadata": dict(metadata or {}),
    }
    payload["timestamp"] = _stamp(timestamp)
    return payload


def forget_body(agent_id: str, session_id: str | None, turn: int | None = None) -> dict[str, Any]:
    """A forget's body, with a fresh event id: of one turn of the session, of the session, or
    (``session_id`` None) of every session of the agent."""
    payload: dict[str, Any] = {"event_id": uuid.uuid4().hex, "op": "forget", "agent_id": agent_id}
    if session_id is not None:
        payload["session_id"] = session_id
    else:
        payload["all_sessions"] = True
    if turn is not None:
        payload["turn"] = turn
    return payload
