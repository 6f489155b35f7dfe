"""The requests side of the wire contract (docs/contract.md): query, get and list requests on
the requests topic as pydantic models, and the replies they get (an error reply included).

Requests are strict, as events are: a wrong type is an error, not a silent coercion.
"""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, field_validator, model_validator

from consumers.fields import MAX_VERSION, NO_NUL, AgentPart, DocId
from memory.conversation import MAX_CONTEXT_TURNS, MAX_RECENT_TURNS, parse_turn, turn_doc_id
from memory.filters import EXCLUDE_OPERATOR, MAX_VALUE_LENGTH
from memory.schema import MAX_SEARCH_OFFSET

#: The largest weight a leg or list may be given (the contract's bound, on every surface).
MAX_WEIGHT = 1000.0


class HybridParams(BaseModel):
    """Leg weights and the RRF constant of one query; each left out takes the daemon's
    configured default (``AGENTMEM_RETRIEVAL__*``: dense, sparse and identifier 1.0, recency
    0.0, speaker 0.2 and k 10 unless set; a transcript turn's dense and BM25 defaults are 2/3
    and 4/3 when neither is set)."""

    # NaN is no weight: without this, it failed the bounds as "should be less than or equal to 1000".
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    dense_weight: float | None = Field(None, ge=0.0, le=MAX_WEIGHT)
    sparse_weight: float | None = Field(None, ge=0.0, le=MAX_WEIGHT)
    identifier_weight: float | None = Field(None, ge=0.0, le=MAX_WEIGHT)
    recency_weight: float | None = Field(None, ge=0.0, le=MAX_WEIGHT)
    speaker_weight: float | None = Field(None, ge=0.0, le=MAX_WEIGHT)
    rrf_k_constant: int | None = Field(None, ge=0, le=10_000)
    # The vector leg keeps only candidates at least this similar (cosine) to the question.
    min_similarity: float | None = Field(None, ge=-1.0, le=1.0)

    @field_validator(
        "dense_weight",
        "sparse_weight",
        "identifier_weight",
        "recency_weight",
        "speaker_weight",
        "min_similarity",
        mode="before",
    )
    @classmethod
    def _ints_are_floats(cls, value: Any) -> Any:
        # JSON has one number type: 1 is as good a weight as 1.0 (bools are not).
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


FilterValue = (
    Annotated[str, StringConstraints(min_length=1, max_length=MAX_VALUE_LENGTH)]
    | list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_VALUE_LENGTH)]]
)


def _plain_filter(value: Any) -> Any:
    """Name a filter value that is no string of 1..512 characters, or an object other than
    ``{"not": ...}``, before pydantic tries each shape of a filter value and reports the
    failure of each."""
    if isinstance(value, dict):
        for key, given in value.items():
            where = f"metadata_filter[{str(key)[:64]!r}]"
            if isinstance(given, dict):
                if set(given) != {EXCLUDE_OPERATOR}:
                    named = ", ".join(repr(str(k)[:64]) for k in given) or "nothing"
                    raise ValueError(
                        f"{where}: an object's one key is {EXCLUDE_OPERATOR!r} (values none of which may match), "
                        f"not {named}"
                    )
                where, given = f"{where}[{EXCLUDE_OPERATOR!r}]", given[EXCLUDE_OPERATOR]
            for v in given if isinstance(given, list) else [given]:
                if not isinstance(v, str):
                    raise ValueError(f"{where}: values are strings or lists of strings, not {type(v).__name__}")
                if not 1 <= len(v) <= MAX_VALUE_LENGTH:
                    raise ValueError(f"{where}: values are 1..{MAX_VALUE_LENGTH} characters; one is {len(v)}")
    return value


#: A request's metadata filter: key -> a value, a list of values (any of them), or
#: ``{"not": value or values}`` (none of them).
MetadataFilter = Annotated[
    dict[str, FilterValue | dict[Literal["not"], FilterValue]] | None, BeforeValidator(_plain_filter)
]


class TimeRange(BaseModel):
    """Only memories timestamped in ``[since, until]`` (either end open when left out).

    A chunk's timestamp is its event's ``timestamp`` (its Kafka record's when the event had
    none); a community summary's is when it was last summarized. Times without a zone
    are UTC, as in events.
    """

    model_config = ConfigDict(strict=True, extra="forbid")

    since: datetime | None = None
    until: datetime | None = None

    @field_validator("since", "until")
    @classmethod
    def _utc_when_naive(cls, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value

    @model_validator(mode="after")
    def _ordered(self) -> TimeRange:
        if self.since is not None and self.until is not None and self.since > self.until:
            raise ValueError("time_range.since is after time_range.until")
        return self

    def bounds(self) -> tuple[float | None, float | None]:
        """``(since, until)`` in epoch seconds, None for an open end."""
        return (
            None if self.since is None else self.since.timestamp(),
            None if self.until is None else self.until.timestamp(),
        )


class QueryRequest(BaseModel):
    """A memory query; reply goes to the ``reply_to`` header's topic."""

    model_config = ConfigDict(strict=True, extra="forbid")

    query_id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    search_text: Annotated[str, StringConstraints(min_length=1)]
    top_k: int = 5
    hybrid_params: HybridParams = Field(default_factory=HybridParams)
    metadata_filter: MetadataFilter = None
    scope: Literal["chunks", "communities", "all"] = "chunks"
    time_range: TimeRange | None = None
    # Turns before and after each transcript result to return with it (0: none).
    context_turns: int = Field(0, ge=0, le=MAX_CONTEXT_TURNS)
    # A result whose text is a better one's, word for word, is listed under it as a repeat
    # instead of taking a place of its own (memory.repeats); false returns each as a result.
    fold_repeats: bool = True
    # Most results of one document while other documents' hits remain (0: no limit); absent:
    # the daemon's default (retrieval.max_per_doc).
    max_per_doc: int | None = Field(None, ge=0, le=1000)

    @field_validator("search_text")
    @classmethod
    def _says_something(cls, value: str) -> str:
        # Only controls or format characters (a NUL, a zero-width space): no leg has a word of it
        # to match, and the vector leg would answer memories that have nothing to do with it.
        # (A blank one is said to be empty where the search is built.)
        if value.strip() and all(ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf") for ch in value):
            raise ValueError("search_text has no words (only whitespace, control or format characters)")
        return value


#: Most items one ``get`` request may name.
MAX_GET_ITEMS = 100

#: Past the end of any content a daemon takes (its limit is megabytes), and exact in Redis's Lua.
MAX_CONTENT_OFFSET = 2**40


class TurnKey(BaseModel):
    """One transcript turn, by where it was said."""

    model_config = ConfigDict(strict=True, extra="forbid")

    agent_id: AgentPart
    session_id: AgentPart
    turn: int = Field(ge=0, le=MAX_VERSION)

    @property
    def doc_id(self) -> str:
        """The turn's doc id, as its ``TranscriptEvent`` names it."""
        return turn_doc_id(self.agent_id, self.session_id, self.turn)


class GetRequest(BaseModel):
    """Look memories up by id (``"op": "get"``) on the requests topic; the reply is a ``GetReply``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    query_id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    op: Literal["get"]
    doc_ids: list[DocId] = Field(default_factory=list)
    turns: list[TurnKey] = Field(default_factory=list)
    metadata_filter: MetadataFilter = None
    # Also each found document's earlier versions, newest first (IndexConfig.history_versions).
    history: bool = False
    # The content from this character (code point) on: how a content cut to fit a reply is read on.
    content_offset: int = Field(0, ge=0, le=MAX_CONTENT_OFFSET)
    # This version of one document, current or kept in its history, instead of the current one.
    version: int | None = Field(None, ge=0, le=MAX_VERSION)

    @model_validator(mode="after")
    def _some_items(self) -> GetRequest:
        n = len(self.doc_ids) + len(self.turns)
        if not 1 <= n <= MAX_GET_ITEMS:
            raise ValueError(f"a get names 1..{MAX_GET_ITEMS} doc_ids and turns together, got {n}")
        if (self.content_offset or self.version is not None) and len(self.wanted()) != 1:
            raise ValueError(f"content_offset and version read one item, and this get names {n}")
        if self.version is not None and (self.turns or any(parse_turn(d) for d in self.doc_ids)):
            raise ValueError("version reads one version of a document, and a turn has none")
        if self.version is not None and self.history:
            raise ValueError("version reads one version alone: ask for history without it")
        return self

    def wanted(self) -> list[str]:
        """Every doc id asked for, in the request's order (doc_ids, then turns), each once."""
        return list(dict.fromkeys([*self.doc_ids, *(t.doc_id for t in self.turns)]))


class RecentRequest(BaseModel):
    """An agent's latest turns (``"op": "recent"``), in one session or across its sessions; the
    reply is a ``GetReply`` whose items are those turns, oldest first."""

    model_config = ConfigDict(strict=True, extra="forbid")

    query_id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    op: Literal["recent"]
    agent_id: AgentPart
    session_id: AgentPart | None = None
    limit: int = Field(20, ge=1, le=MAX_RECENT_TURNS)
    metadata_filter: MetadataFilter = None


class EarlierVersion(BaseModel):
    """A version of a document that a later one replaced, as it was stored."""

    version: int
    content: str
    source: str
    metadata: dict[str, Any]
    timestamp: str | None = None  # when it was written (ISO 8601, UTC)
    until: str | None = None  # when the version that replaced it was written
    # Its content was left off to fit one Kafka record: a get of this version reads it.
    content_truncated: bool = False


class GetItem(BaseModel):
    """One looked-up memory: its current version and content, or why there is none."""

    doc_id: str
    # found; not_found (never stored, deleted, forgotten, another tenant's, or outside the filter);
    # writing (a new version is being written in slices: ask again shortly).
    status: Literal["found", "not_found", "writing"]
    kind: str | None = None
    source: str | None = None
    version: int | None = None
    content: str | None = None
    metadata: dict[str, Any] | None = None
    timestamp: str | None = None
    # The content's end was cut to fit one Kafka record: read on with content_offset (and version).
    content_truncated: bool = False
    # Asked for an earlier version: when the version that replaced it was written.
    until: str | None = None
    # Asked with history: the document's earlier versions, newest first (none for a turn).
    history: list[EarlierVersion] | None = None
    # Its oldest versions' contents (or, past those, its versions) were left off to fit one Kafka record.
    history_truncated: bool = False


class GetReply(BaseModel):
    """The items of a ``get``, in the request's order; ``truncated``: items left off to fit one record."""

    query_id: str
    items: list[GetItem]
    took_ms: float
    truncated: bool = False


class RecentReply(GetReply):
    """The turns of a ``recent``, oldest first; ``truncated``: the oldest left off to fit one
    record (the same JSON as a ``GetReply``)."""


#: Most values one ``list`` request may ask for.
MAX_LIST_VALUES = 1000


class ListRequest(BaseModel):
    """List the distinct ``doc_id`` or ``source`` values of the tenant's documents whose source
    starts with ``source_prefix`` (``"op": "list"``); the reply is a ``ListReply``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    query_id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    op: Literal["list"]
    field: Literal["doc_id", "source"] = "doc_id"
    source_prefix: Annotated[str, StringConstraints(max_length=1024, pattern=NO_NUL)] = ""
    limit: int = Field(100, ge=1, le=MAX_LIST_VALUES)
    offset: int = Field(0, ge=0, le=MAX_SEARCH_OFFSET)


class ListReply(BaseModel):
    """The values of a ``list``, sorted; fewer than ``limit`` means the listing is at its end."""

    query_id: str
    values: list[str]
    took_ms: float
    truncated: bool = False


class CommunityInfo(BaseModel):
    """What a community summary result says about its community."""

    community_id: str
    level: int
    member_count: int
    stale: bool


class ContextTurn(BaseModel):
    """A turn around a transcript result, whole (``context_turns``)."""

    doc_id: str
    turn: int
    role: str
    text: str
    timestamp: str | None = None


class Repeat(BaseModel):
    """A memory whose text is a result's, word for word, folded into that result."""

    doc_id: str
    chunk_id: str
    timestamp: str | None = None


class ResultItem(BaseModel):
    """One retrieved chunk."""

    chunk_id: str
    rrf_score: float
    text: str
    source: str
    doc_id: str
    kind: str
    metadata: dict[str, Any]
    ranks: dict[str, int]
    community: CommunityInfo | None = None
    # When the memory was recorded (its event's timestamp), ISO 8601 UTC; None where the
    # index holds none.
    timestamp: str | None = None
    # The headings a document's chunk falls under, outermost first, joined by " > " (None: none).
    section: str | None = None
    # The turns around a transcript result, in turn order, when the query asked for them.
    context: list[ContextTurn] | None = None
    # Lower-ranked memories with this result's text, newest first (None: there were none): the
    # newest 20, and how many there were.
    repeats: list[Repeat] | None = None
    repeat_count: int | None = None


class QueryReply(BaseModel):
    """Results, best first; ``total_retrieved == len(results)``."""

    query_id: str
    total_retrieved: int
    results: list[ResultItem]
    took_ms: float
    # True when results were left off the end so the reply fits one Kafka record.
    truncated: bool = False


class ErrorBody(BaseModel):
    """A machine-readable code and a human-readable message."""

    code: str
    message: str


class ErrorReply(BaseModel):
    """What an asker gets instead of results."""

    query_id: str | None
    error: ErrorBody
