"""What the MCP tools return and how they read their arguments (pure): the views of results,
acks and looked-up documents, times, the next free turn, and the tools' one error."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from consumers.events import WriteAck
from consumers.requests import GetItem, ResultItem
from consumers.times import when
from daemon.wording import in_words
from memory.errors import InvalidRequest


class ToolFailure(Exception):
    """A tool call that failed; ``code`` is the contract's error code (docs/contract.md)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


#: Each tool's arguments that the contract names otherwise: an error in the daemon's or the
#: client's words ("search_text is longer than ...") is told in the tool's ("query is ...").
ARGUMENT_NAMES: Mapping[str, Mapping[str, str]] = {
    "search_memory": {"search_text": "query", "metadata_filter": "filters"},
    "remember": {"content": "text"},
    "get_document": {"doc_ids.0": "doc_id", "doc_ids": "doc_id"},
}


def in_tool_words(tool: str, message: str) -> str:
    """``message`` with the contract's field names that ``tool``'s arguments name otherwise
    replaced by those; a name inside quotes (a value, a metadata key) is left alone."""
    return in_words(message, ARGUMENT_NAMES.get(tool, {}))


def parse_time(value: str | None, what: str) -> datetime | None:
    """A time argument (``since``/``until``): as ``consumers.times.when`` takes it (ISO 8601, naive
    meaning UTC; an age such as ``24h``; ``today``, ``yesterday``).

    Raises:
        ToolFailure: ``invalid_request``, it is neither.
    """
    try:
        return when(value, what)
    except InvalidRequest as exc:
        raise ToolFailure("invalid_request", str(exc)) from None


@dataclass(frozen=True, slots=True)
class Noted:
    """A tool's value and a note for the model beside it (a second text of the result)."""

    value: Any
    note: str


#: What a search's result says when the daemon cut its reply to fit one Kafka record.
CUT_SEARCH = (
    "note: the reply was cut to fit one Kafka record (the daemon's consumer.reply_max_bytes): "
    "results were left off its end, or results carry no context; ask for fewer results (top_k) "
    "or context turns, or a narrower search"
)


def result_view(r: ResultItem) -> dict[str, Any]:
    """One search result as a model needs it; a conversation turn asked with ``context_turns``
    also carries the turns around it (``context``), so the model reads the exchange, and a
    text that lower-ranked memories repeat word for word says where and when (``repeats``)."""
    view: dict[str, Any] = {
        "text": r.text,
        "score": r.rrf_score,
        "source": r.source,
        "doc_id": r.doc_id,
        "kind": r.kind,
        "metadata": r.metadata,
        "timestamp": r.timestamp,
        # Which lists ranked it, and where: a result that "sparse" (its words) did not rank is no
        # good match of the query's words, which an agent cannot tell from a score.
        "ranks": r.ranks,
    }
    if r.section is not None:
        view["section"] = r.section  # the headings a document's chunk falls under
    if r.context is not None:
        view["context"] = [t.model_dump() for t in r.context]
    if r.repeats is not None:
        view["repeats"] = [{"doc_id": x.doc_id, "timestamp": x.timestamp} for x in r.repeats]
        view["repeat_count"] = r.repeat_count
    return view


def ack_view(ack: WriteAck | None, doc_id: str) -> dict[str, Any]:
    """A write's acknowledgement (never None here: every tool write waits for it)."""
    if ack is None:  # only a publish without wait has none, and no tool publishes so
        return {"status": "sent", "doc_id": doc_id}
    view: dict[str, Any] = {"status": ack.status, "doc_id": ack.doc_id or doc_id}
    for name in ("version", "chunks", "embedded", "forgotten", "removed", "stored_version", "reason", "error_code"):
        if (value := getattr(ack, name)) is not None:
            view[name] = value
    return view


#: Characters of a content ``get_document`` returns by default: a host model's context holds a
#: few tens of thousands of words well, not the megabyte one reply may carry.
MCP_MAX_CHARS = 50_000


def read_on_view(item: GetItem, offset: int, max_chars: int) -> dict[str, Any]:
    """``item_view`` of a looked-up item read from character ``offset``, its content cut to
    ``max_chars``; a cut content also has ``read_on``, the ``content_offset`` and ``version``
    to call again with (a model should not have to count characters)."""
    if item.content is not None and len(item.content) > max_chars:
        item = item.model_copy(update={"content": item.content[:max_chars], "content_truncated": True})
    view = item_view(item)
    if item.content_truncated:
        view["read_on"] = {"content_offset": offset + len(item.content or "")}
        if item.version is not None:
            view["read_on"]["version"] = item.version
    return view


def item_view(item: GetItem) -> dict[str, Any]:
    """A looked-up document, without the fields it does not have (``content_truncated`` and
    ``history_truncated`` only when true)."""
    view = item.model_dump(exclude_none=True)
    for flag in ("content_truncated", "history_truncated"):
        if not view[flag]:
            del view[flag]
    return view
