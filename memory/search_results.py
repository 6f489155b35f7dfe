"""What the retriever answers: a search's fused hits with the why of them, and a memory
looked up by id."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from memory.index import LegHit
from memory.index.history import Version
from memory.records import StoredChunk


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One fused result with its score, per-leg ranks and stored fields."""

    chunk: StoredChunk
    score: float
    ranks: dict[str, int]
    # The turns around a transcript hit (``SearchSpec.context_turns``), in turn order, each
    # whole (its chunks joined); the hit itself is not among them.
    context: tuple[StoredChunk, ...] = ()
    # Later results with the same text (``memory.repeats``), folded into this one: the newest
    # ``MAX_LISTED_REPEATS``, newest first, and how many there were.
    repeats: tuple[StoredChunk, ...] = ()
    repeat_count: int = 0


@dataclass(frozen=True, slots=True)
class LegTiming:
    """When a leg started and ended (monotonic seconds); ``embedded`` ends the embedding."""

    start: float
    end: float
    embedded: float | None = None


@dataclass(frozen=True, slots=True)
class Lookup:
    """A memory looked up by id: ``found`` with its chunks in order and its text (from the
    character asked for), or not."""

    doc_id: str
    status: str  # "found" | "not_found" | "writing"
    chunks: tuple[StoredChunk, ...] = ()
    content: str = ""
    version: int | None = None
    history: tuple[Version, ...] = ()  # a document's earlier versions, newest first, when asked for
    # False: ``content`` stops short of the doc's end (``Lookups.lookup`` read as much as a reply shows).
    whole: bool = True
    # Characters from where ``content`` starts to the doc's end; None: ``content`` holds them all.
    size: int | None = None
    # Asked for a version its history keeps: that version (and no ``chunks``).
    earlier: Version | None = None


@dataclass
class SearchOutcome:
    """Fused hits, wall time, and per-leg timings (the legs overlap).

    ``ranked`` and ``candidates`` show why (the explorer reads them; replies do not carry
    them): each leg's own list as fusion read it (ids best first, or id -> rank for a leg of
    tied ranks; :func:`leg_order` reads either), after the exact checks, and every candidate
    of those lists by chunk id. Both are the search's own objects, not copies.
    """

    hits: list[SearchHit]
    took_ms: float
    legs: dict[str, LegTiming] = field(default_factory=dict)
    ranked: dict[str, list[str] | dict[str, int]] = field(default_factory=dict)
    candidates: dict[str, LegHit] = field(default_factory=dict)


def leg_order(ids: Sequence[str] | Mapping[str, int]) -> list[tuple[str, int]]:
    """A leg's list as ``(id, 1-based rank)`` best first; a leg of tied ranks (id -> rank) by
    rank, then id, as fusion breaks ties."""
    if isinstance(ids, Mapping):
        return sorted(ids.items(), key=lambda item: (item[1], item[0]))
    return [(d, r) for r, d in enumerate(ids, start=1)]
