"""The seam for follow-up work on every change the ingestor applies (the graph layer's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from memory.records import ChunkRecord, MemoryItem

P = TypeVar("P")


class ChangeHook(Protocol[P]):
    """Follow-up work on every applied change (the graph layer), in two steps.

    ``prepare`` is the CPU-heavy part (entity extraction) for a group of changes: the
    Ingestor runs it while the same group is being embedded, so the two models work on
    both cores at once instead of one after the other. ``apply`` writes one doc's result;
    it is called right after that doc's chunks are stored, and before the batch returns
    (so before its offsets are committed).
    """

    async def prepare(self, changes: Sequence[tuple[MemoryItem, Sequence[ChunkRecord]]]) -> Sequence[P]:
        """One result per change, in order; must not write anything."""
        ...

    async def apply(self, item: MemoryItem, prepared: P) -> object:
        """Write one change's prepared result (idempotent: it may be handed on again)."""
        ...

    async def docs_under(self, tenant: str, prefix: str) -> set[str]:
        """The docs whose id starts with ``prefix`` that this hook holds results for.

        A forget deletes what it lists; a crash between a doc's chunk delete and its hook
        write would leave the hook's result behind for good if the redelivered forget
        listed only the docs that still have chunks.
        """
        ...
