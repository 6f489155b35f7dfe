"""A memory item's chunk records: its content cut along model tokens into spans, each with
the item's fields and, for a document's, the headings it falls under (pure, but for the
tokenizer read and the thread a long document takes)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from memory.chunking import chunk_id, span_gaps, span_tail, spans_for
from memory.config import ChunkingConfig
from memory.embedder import Embedder
from memory.headings import has_headings, heading_paths, open_fences
from memory.records import ChunkRecord, MemoryItem
from memory.speakers import turn_speakers

#: Documents up to this many tokens are chunked on the event loop (~6 ms at most); longer
#: ones in a thread, which costs a hop that short turns need not pay.
INLINE_CHUNKING_TOKENS = 5_000


def records_for(
    item: MemoryItem, version: int, offsets: list[tuple[int, int]], chunking: ChunkingConfig
) -> list[ChunkRecord]:
    """The chunks of ``item`` at ``version``, cut from its token ``offsets``."""
    spans = spans_for(item.content, offsets, chunking)
    speaker = turn_speakers(item.content, item.metadata) if item.kind == "transcript" else ""
    gaps = span_gaps(item.content, spans)
    tail = span_tail(item.content, spans)
    under = (
        heading_paths(item.content, [s.start for s in spans])
        if item.kind == "document" and has_headings(item.doc_id, item.source)
        else [""] * len(spans)
    )
    # A long turn (a tool's output, pasted code) is cut inside its code blocks as a document is.
    fences = open_fences(item.content, [s.start for s in spans])
    return [
        ChunkRecord(
            chunk_id=chunk_id(item.doc_id, s.index),
            doc_id=item.doc_id,
            position=s.index,
            text=s.text,
            kind=item.kind,
            source=item.source,
            tags={**item.tags, "doc_id": item.doc_id, "kind": item.kind, "source": item.source},
            metadata=item.metadata,
            version=version,
            timestamp=item.timestamp,
            tenant=item.tenant,
            speaker=speaker,
            context=path,
            context_vec=path,
            start=s.start,
            gap=gap,
            tail=tail if k == len(spans) - 1 else "",
            fence=fence,
        )
        for k, (s, gap, path, fence) in enumerate(zip(spans, gaps, under, fences, strict=True))
    ]


async def chunk_item(
    item: MemoryItem, version: int, *, embedder: Embedder, chunking: ChunkingConfig
) -> list[ChunkRecord]:
    """The chunks of ``item`` at ``version``, cut along the embedder's tokens."""
    offsets = await embedder.token_offsets(item.content)
    if len(offsets) <= INLINE_CHUNKING_TOKENS:
        return records_for(item, version, offsets, chunking)
    # Pure Python: chunking took ~190 ms for a 167k-token document (measured), so a
    # maximum-size one (~1M tokens) would hold the event loop, and every query, ~0.3 s+.
    return await asyncio.to_thread(records_for, item, version, offsets, chunking)


async def chunk_items(
    items: Sequence[MemoryItem], *, embedder: Embedder, chunking: ChunkingConfig
) -> list[list[ChunkRecord]]:
    """The chunks of each item at its own version (none for deletes and forgets); the
    tokenizer thread works through them back to back."""

    async def one(item: MemoryItem) -> list[ChunkRecord]:
        if item.op != "upsert":
            return []
        return await chunk_item(item, item.version or 0, embedder=embedder, chunking=chunking)

    return list(await asyncio.gather(*(one(i) for i in items)))
