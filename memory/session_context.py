"""A transcript turn's session context at ingestion (``memory.conversation`` is the pure rule):
attached to a batch's turns before they are embedded, and re-indexed afterwards in the stored
turns whose neighbours the batch changed."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from memory.config import IngestConfig
from memory.conversation import (
    TurnRef,
    affected,
    context_of,
    neighbourhood,
    parse_turn,
    texts_by_ref,
    vector_text,
    window,
)
from memory.embedder import Embedder
from memory.index import ChunkIndex, TurnEntry, vector_key
from memory.records import ChunkRecord, MemoryItem
from memory.retrying import Retrying


def _turn(item: MemoryItem) -> TurnRef | None:
    """The session position of a transcript turn's item, None for anything else."""
    return parse_turn(item.doc_id) if item.kind == "transcript" and item.op != "forget" else None


class SessionContext:
    """The ingestor's collaborator for transcript turns' context (see the module docstring)."""

    def __init__(
        self,
        *,
        index: ChunkIndex,
        embedder: Embedder,
        embed: Callable[[list[str]], Awaitable[np.ndarray]],
        retrying: Retrying,
        cfg: IngestConfig,
    ) -> None:
        self._index = index
        self._embedder = embedder
        self._embed = embed
        self._retrying = retrying
        self._cfg = cfg

    async def attach(self, items: Sequence[MemoryItem], chunks: Sequence[list[ChunkRecord]]) -> list[list[ChunkRecord]]:
        """Each transcript turn's chunks with the context its session gives them
        (``memory.conversation``): its neighbours as this batch leaves them, else as stored."""
        out = [list(c) for c in chunks]
        turns = [(i, ref) for i, item in enumerate(items) if (ref := _turn(item)) is not None]
        for tenant in sorted({items[i].tenant for i, _ in turns}):
            mine = [(i, ref) for i, ref in turns if items[i].tenant == tenant]
            batch = {ref.doc_id: (out[i][0].text if out[i] else None) for i, ref in mine}
            wanted = sorted({w.doc_id for i, ref in mine if out[i] for w in window(ref)} - set(batch))
            stored = await self._retrying(
                "turn read",
                lambda t=tenant, w=wanted: self._index.turn_texts(w, t),  # type: ignore[misc]
            )
            view: dict[str, str | None] = {**stored, **batch}
            for i, ref in mine:
                ctx = context_of(ref, texts_by_ref(view))
                out[i] = [dataclasses.replace(c, context=ctx.stored(), context_vec=ctx.vector_prefix()) for c in out[i]]
        return out

    async def reconcile(self, items: Sequence[MemoryItem]) -> int:
        """Re-index the stored turns whose neighbours this batch changed (or whose context it
        could not know), so every turn's context is what its session now stores.

        In a session written in order this rewrites the terms of the turns before the new ones
        (their next turns joined); a vector is re-embedded only when a turn's previous turns
        changed (a late or rewritten turn). A turn whose context is already right is left alone,
        so a redelivered batch writes nothing here.

        Returns:
            How many chunks were embedded again.
        """
        gate = asyncio.Semaphore(self._cfg.write_concurrency)

        identity = self._embedder.identity  # read now: it follows the worker (see Embedder.identity)
        embedded = 0

        async def rewrite(tenant: str, doc_id: str, updates: list[Any]) -> None:
            keys = {e.chunk_id: vector_key(identity, vector_text(e.text, vec)) for e, _, vec, _ in updates}
            async with gate:
                await self._retrying("context write", lambda: self._index.recontext(doc_id, updates, tenant, keys))

        by_tenant: dict[str, set[TurnRef]] = {}
        for item in items:
            if (ref := _turn(item)) is not None:
                by_tenant.setdefault(item.tenant, set()).add(ref)
        for tenant, changed in sorted(by_tenant.items()):
            todo = sorted(affected(changed))
            around = sorted({r.doc_id for r in neighbourhood(changed)})
            texts, entries = await self._retrying(
                "turn read",
                lambda t=tenant, a=around, d=[r.doc_id for r in todo]: asyncio.gather(  # type: ignore[misc]
                    self._index.turn_texts(a, t), self._index.turn_entries(d, t)
                ),
            )
            stale: list[tuple[str, list[TurnEntry], str, str]] = []
            for ref in todo:
                stored = entries.get(ref.doc_id)
                if not stored or any(e.kind != "transcript" for e in stored):
                    continue
                ctx = context_of(ref, texts_by_ref(texts))
                want, want_vec = ctx.stored(), ctx.vector_prefix()
                if all((e.context, e.context_vec) == (want, want_vec) for e in stored):
                    continue
                stale.append((ref.doc_id, stored, want, want_vec))
            # Only chunks whose previous turns changed need the model; the rest keep their vectors.
            redo = [
                (e.chunk_id, vector_text(e.text, vec))
                for _, stored, _, vec in stale
                for e in stored
                if vector_text(e.text, vec) != vector_text(e.text, e.context_vec)
            ]
            vectors = await self._embed([text for _, text in redo]) if redo else None
            embedded += len(redo)
            fresh = {cid: vectors[n] for n, (cid, _) in enumerate(redo)} if vectors is not None else {}
            # Distinct turns: their rewrites commute, so they overlap their round trips.
            await asyncio.gather(
                *(
                    rewrite(tenant, doc_id, [(e, want, want_vec, fresh.get(e.chunk_id)) for e in stored])
                    for doc_id, stored, want, want_vec in stale
                )
            )
        return embedded
