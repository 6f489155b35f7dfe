"""The plain data that flows between ingestion, the index and retrieval."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Kind = Literal["document", "transcript", "community"]
#: Every kind of memory, as a request's `kind` filter may name them.
KINDS: tuple[Kind, ...] = get_args(Kind)

#: The tenant of single-tenant deployments (and of everything not given one).
DEFAULT_TENANT = "default"
#: Doc id prefix of community summaries (the graph layer's chunks, versioned by fencing token).
COMMUNITY_PREFIX = "community:"
Scalar = str | int | float | bool


@dataclass(frozen=True, slots=True)
class MemoryItem:
    """One change to apply: an upsert or delete of everything stored under ``doc_id``.

    ``version`` is ``None`` for items that are idempotent by identity (transcript turns):
    they overwrite unconditionally. Versioned items apply only above the stored version.

    ``forget``: delete every unversioned doc whose id starts with ``doc_id`` and whose
    chunks carry ``tags`` (a session's or an agent's transcript turns); the ingestor turns
    it into one delete per doc found, in its place in the batch.
    """

    op: Literal["upsert", "delete", "forget"]
    doc_id: str
    version: int | None
    kind: Kind = "document"
    content: str = ""
    source: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Scalar] = field(default_factory=dict)
    timestamp: float = 0.0
    tenant: str = DEFAULT_TENANT
    # A turn claimed by a writer that numbered it from the session's last one: written only if
    # the turn holds nothing else (``memory.turn_claims``).
    if_absent: bool = False


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """A chunk as stored in Redis (the vector travels beside it)."""

    chunk_id: str
    doc_id: str
    position: int
    text: str
    kind: Kind
    source: str
    tags: dict[str, str]
    metadata: dict[str, Scalar]
    version: int
    timestamp: float
    tenant: str = DEFAULT_TENANT
    # A transcript turn's neighbour texts (memory.conversation), a document chunk's headings
    # (memory.headings): matched, never returned. ``context`` joins the BM25 terms;
    # ``context_vec`` is read by the model before ``text``.
    context: str = ""
    context_vec: str = ""
    # What the model read, keyed (memory.index.reuse.vector_key): a later chunk with the same key reuses this vector.
    vector_key: str = ""
    # A transcript turn's speakers (memory.speakers.speakers_field); empty for anything else.
    speaker: str = ""
    # Where the chunk starts in its doc's content, and the text between the chunk before and
    # this one when they do not overlap (a blank line, a line break), before the first chunk
    # the text its content opens with (an indent), and after the last one the text it ends with
    # (a final newline): the doc is read back exact.
    start: int = 0
    gap: str = ""
    tail: str = ""
    # A document chunk cut from inside fenced code: the fence open where it starts
    # (memory.headings.open_fences), so that a summary reading it alone takes its code for code.
    fence: str = ""


@dataclass(frozen=True, slots=True)
class StoredChunk:
    """A chunk as a search leg returns it."""

    chunk_id: str
    text: str
    doc_id: str
    source: str
    kind: str
    metadata: dict[str, Any]
    tags: dict[str, str] = field(default_factory=dict)  # tenant and filterable values, as stored
    idents: tuple[str, ...] = ()  # normalized identifiers the chunk holds (memory.identifiers)
    timestamp: float | None = None  # epoch seconds (the event's time), None if not returned
    version: int | None = None  # the doc version the chunk was written for, None if not returned
    generation: int | None = None  # the index generation the hit came from (its key says so)
    speaker: str = ""  # a transcript turn's speakers (memory.speakers), empty where none is stored
    section: str = ""  # a document chunk's headings (memory.headings), empty where none is stored
    start: int | None = None  # where it starts in its doc (ChunkRecord.start); None if not read or not stored
    gap: str = ""  # the text between the chunk before and this one (ChunkRecord.gap), as read
    tail: str = ""  # the text after the doc's last chunk (ChunkRecord.tail), on that chunk, as read


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What happened to one item: applied (with how many chunks) or skipped as stale."""

    doc_id: str
    applied: bool
    chunks: int = 0
    stored_version: int | None = None
    removed: int = 0  # chunks of the earlier state this write removed (a delete's: all it found)
