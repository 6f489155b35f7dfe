"""What applying a batch reports: each item's outcome, and the batch's totals."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from memory.errors import MemdError
from memory.records import ApplyResult, MemoryItem


@dataclass(frozen=True, slots=True)
class ItemOutcome:
    """What became of one item that did not fail: ``indexed`` (its version is the stored one:
    written now, or found already written by an earlier delivery) or ``ignored`` (an older
    version than the stored one)."""

    status: Literal["indexed", "ignored"]
    chunks: int | None = None  # written by this item (None: not written now)
    stored_version: int | None = None
    embedded: int | None = None  # of its chunks, those sent to the model (the rest reused a stored vector)
    forgotten: int | None = None  # a forget's turns this delivery removed (0: none were stored)
    removed: int | None = None  # a document delete's chunks this delivery removed (0: none were stored)
    # What differs ("content", "source", "metadata") from the stored doc of this very version:
    # a producer that reused a version (None: no conflict).
    conflict: str | None = None
    # Why an event was not applied at all, for its writer: the ack's error code and reason (its
    # tenant was erased; its turn, claimed, held another writer's).
    refused: tuple[str, str] | None = None


@dataclass
class IngestReport:
    """Outcome of one batch: applied items, stale items skipped, chunks written, and each
    item's own outcome (``outcomes``, by ``id(item)``; an item of a doc that a later one of
    the batch superseded has none)."""

    applied: list[ApplyResult] = field(default_factory=list)
    skipped: list[ApplyResult] = field(default_factory=list)
    chunks_written: int = 0
    failed: list[tuple[MemoryItem, MemdError]] = field(default_factory=list)
    outcomes: dict[int, ItemOutcome] = field(default_factory=dict)
    chunks_embedded: int = 0  # sent to the model
    chunks_reused: int = 0  # kept a vector already stored (or embedded once for the whole batch)
    # (tenant, doc id) -> its chunks sent to the model (a text two docs share counts for the first)
    embedded_by_doc: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, other: IngestReport) -> None:
        """Fold another report of the same batch into this one."""
        self.applied += other.applied
        self.skipped += other.skipped
        self.chunks_written += other.chunks_written
        self.failed += other.failed
        self.outcomes.update(other.outcomes)
        self.chunks_embedded += other.chunks_embedded
        self.chunks_reused += other.chunks_reused
        for doc, n in other.embedded_by_doc.items():
            self.embedded_by_doc[doc] = self.embedded_by_doc.get(doc, 0) + n
