"""Whether an event of the version already stored says what is stored (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from memory.index.codec import joined_text
from memory.records import MemoryItem, StoredChunk


def differs_from_stored(item: MemoryItem, chunks: Sequence[StoredChunk]) -> str | None:
    """What of ``item`` (an upsert whose version is the stored one) differs from the doc as
    stored (``chunks``, in position order): ``"content"``, ``"source"`` or ``"metadata"``, or
    None when it is the same event again (a redelivery) or the stored chunks are not all of
    that version (nothing to compare: a write of it is not whole)."""
    if not chunks or any(c.version != item.version for c in chunks):
        return None
    # Chunks written before they kept their starts read back only near the content: not compared.
    if all(c.start is not None for c in chunks) and joined_text(chunks) != item.content:
        return "content"
    if chunks[0].source != item.source:
        return "source"
    if chunks[0].metadata != item.metadata:
        return "metadata"
    return None


def differs_between(item: MemoryItem, other: MemoryItem) -> str | None:
    """What of ``item`` differs from ``other``, an event of the same doc and version: as
    :func:`differs_from_stored` says it, or None for a copy (a producer's retry). A delete and
    an upsert are not compared, in a batch as one at a time: a stored delete leaves nothing
    to compare with."""
    if item.op != other.op:
        return None
    if item.content != other.content:
        return "content"
    if item.source != other.source:
        return "source"
    if item.metadata != other.metadata:
        return "metadata"
    return None
