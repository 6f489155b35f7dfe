"""Transcript turns: reads of a session's neighbouring turns and rewrites of their context."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from redis import exceptions as rexc

from memory.chunking import chunk_id, chunk_position
from memory.index.codec import JOIN_FIELDS, TurnEntry, _float_or_none, _stored, _text, turn_terms
from memory.index.errors import IndexError_, raise_if_lost, translate_errors
from memory.index.lifecycle import _WATCH_RETRIES, _Lifecycle
from memory.keys import check_tenant
from memory.records import DEFAULT_TENANT, StoredChunk
from memory.schema import as_str

#: Chunks decoded on the event loop; more go to a thread (pure Python per chunk).
_DECODED_INLINE = 256


class _Turns(_Lifecycle):
    """Reads of stored turns (their texts, entries and chunks) and ``recontext``."""

    async def turn_texts(self, doc_ids: Sequence[str], tenant: str = DEFAULT_TENANT) -> dict[str, str]:
        """The first chunk's text of each doc that is stored (what a turn's neighbours read)."""
        if not doc_ids:
            return {}
        gen = await self._generation()
        async with translate_errors("turn read"), self._r.pipeline(transaction=False) as pipe:
            for d in doc_ids:
                pipe.hget(self._chunk_key(gen, tenant, chunk_id(d, 0)), "text")
            values = await pipe.execute()
        return {d: as_str(v) for d, v in zip(doc_ids, values, strict=True) if v is not None}

    async def _chunk_rows(
        self, doc_ids: Sequence[str], tenant: str, fields: Sequence[str], page: tuple[int, int] | None = None
    ) -> dict[str, list[tuple[str, str, list[Any]]]]:
        """Each doc's stored chunks in position order as (key, chunk id, ``fields``' values):
        two round trips for all the docs (their chunk sets, then the chunks); with ``page``
        (offset, limit), only those of each doc's chunks.

        The chunks are read in one transaction with the chunk sets again: an edit between the
        two round trips (written whole, in one transaction) would otherwise give the new
        version's first chunks under the old set, a cut-short text read as the whole. A set
        that changed is read again with its new chunks.
        """
        if not doc_ids:
            return {}
        gen = await self._generation()
        async with translate_errors("turn read"):
            async with self._r.pipeline(transaction=False) as pipe:
                for d in doc_ids:
                    pipe.smembers(self._doc_key(gen, tenant, d))
                members = [{as_str(m) for m in ms} for ms in await pipe.execute()]
            rows: dict[str, list[tuple[str, str, list[Any]]]] = {}
            expected = dict(zip(doc_ids, members, strict=True))
            pending = list(doc_ids)  # each round reads again only the docs whose set changed
            for _ in range(_WATCH_RETRIES):
                lo, hi = (0, None) if page is None else (page[0], page[0] + page[1])
                keys = {
                    d: [(self._chunk_key(gen, tenant, c), c) for c in sorted(expected[d], key=chunk_position)[lo:hi]]
                    for d in pending
                }
                async with self._r.pipeline(transaction=True) as pipe:
                    for d in pending:
                        pipe.smembers(self._doc_key(gen, tenant, d))
                        for key, _ in keys[d]:
                            pipe.hmget(key, list(fields))
                    replies = iter(await pipe.execute())
                changed = []
                for d in pending:
                    now = {as_str(m) for m in next(replies)}
                    rows[d] = [(key, cid, next(replies)) for key, cid in keys[d]]
                    if now != expected[d]:
                        expected[d] = now
                        changed.append(d)
                if not changed:
                    break
                pending = changed
        # A set still changing after every round is a doc being written in slices (it grows with
        # each slice): its write marker, which the callers read, shows it as being written.
        return {d: rows[d] for d in doc_ids}

    async def as_written(self, doc_ids: Sequence[str], tenant: str = DEFAULT_TENANT) -> dict[str, list[StoredChunk]]:
        """Each stored doc's chunks in position order, with only what says what was written
        (text, version, source, metadata and how the chunks join): what an event of the
        stored version is compared with (``memory.replays``). Many chunks are decoded in a
        thread, off the event loop."""
        fields = ("text", "version", "source", "metadata", *JOIN_FIELDS)
        rows = await self._chunk_rows(doc_ids, tenant, fields)

        def decoded() -> dict[str, list[StoredChunk]]:
            out: dict[str, list[StoredChunk]] = {}
            for d, chunks in rows.items():
                found = [
                    _stored(types.SimpleNamespace(id=key, **dict(zip(fields, values, strict=True))), ())
                    for key, _, values in chunks
                    if values[0] is not None
                ]
                if found:
                    out[d] = found
            return out

        many = sum(len(c) for c in rows.values()) > _DECODED_INLINE
        return await asyncio.to_thread(decoded) if many else decoded()

    async def turn_entries(self, doc_ids: Sequence[str], tenant: str = DEFAULT_TENANT) -> dict[str, list[TurnEntry]]:
        """Each stored doc's chunks in position order, with the text and context they were indexed with."""
        rows = await self._chunk_rows(doc_ids, tenant, ["text", "context", "context_vec", "kind", "ts"])
        out: dict[str, list[TurnEntry]] = {}
        for d, chunks in rows.items():
            entries = [
                TurnEntry(cid, as_str(text), _text(context), _text(context_vec), _text(kind), _float_or_none(ts) or 0.0)
                for _, cid, (text, context, context_vec, kind, ts) in chunks
                if text is not None
            ]
            if entries:
                out[d] = entries
        return out

    async def turns(
        self, doc_ids: Sequence[str], tenant: str = DEFAULT_TENANT, *, page: tuple[int, int] | None = None
    ) -> dict[str, list[StoredChunk]]:
        """Each stored doc's chunks in position order, as a search leg returns them (for the
        turns around a hit and lookups by id); with ``page`` (offset, limit), only those."""
        fields = (*self._fields, *JOIN_FIELDS)
        rows = await self._chunk_rows(doc_ids, tenant, fields, page)
        out: dict[str, list[StoredChunk]] = {}
        for d, chunks in rows.items():
            found = [
                _stored(types.SimpleNamespace(id=key, **dict(zip(fields, values, strict=True))), self._tag_keys)
                for key, _, values in chunks
                if values[0] is not None
            ]
            if found:
                out[d] = found
        return out

    async def chunk_count(self, doc_id: str, tenant: str = DEFAULT_TENANT) -> int:
        """How many chunks the doc's stored version has (0: none stored)."""
        gen = await self._generation()
        async with translate_errors("chunk count"):
            return int(await self._r.scard(self._doc_key(gen, tenant, doc_id)))

    async def recontext(
        self,
        doc_id: str,
        updates: Sequence[tuple[TurnEntry, str, str, np.ndarray | None]],
        tenant: str = DEFAULT_TENANT,
        vector_keys: Mapping[str, str] | None = None,
    ) -> bool:
        """Re-index a turn's chunks with a new context (and vector, where given, with its
        ``vector_keys`` entry), atomically, only if the doc still has exactly these chunks with
        these texts and contexts (False if not: whoever changed it indexed it with its own context)."""
        check_tenant(tenant)
        vector_keys = vector_keys or {}
        async with translate_errors("context write"):
            for _ in range(_WATCH_RETRIES):
                async with self._r.pipeline(transaction=True) as pipe:
                    try:
                        gen = await self._write_generation(pipe, unversioned=True)
                        doc_key = self._doc_key(gen, tenant, doc_id)
                        keys = [self._chunk_key(gen, tenant, u[0].chunk_id) for u in updates]
                        await pipe.watch(doc_key, *keys)
                        members = {as_str(m) for m in await pipe.smembers(doc_key)}
                        if members != {u[0].chunk_id for u in updates}:
                            return False
                        for key, (entry, _, _, _) in zip(keys, updates, strict=True):
                            text, context, context_vec = await pipe.hmget(key, ["text", "context", "context_vec"])
                            if text is None or (as_str(text), _text(context), _text(context_vec)) != (
                                entry.text,
                                entry.context,
                                entry.context_vec,
                            ):
                                return False
                        pipe.multi()  # type: ignore[no-untyped-call]
                        for key, (entry, context, context_vec, vector) in zip(keys, updates, strict=True):
                            fields: dict[str, Any] = {
                                "context": context,
                                "context_vec": context_vec,
                                "terms": turn_terms(entry.text, context, entry.timestamp),
                            }
                            if vector is not None:
                                fields["vector"] = np.asarray(vector, dtype=np.float32).tobytes()
                                if vkey := vector_keys.get(entry.chunk_id):
                                    fields["vkey"] = vkey
                                else:  # the old key names what the model read before
                                    pipe.hdel(key, "vkey")
                            pipe.hset(key, mapping=fields)  # type: ignore[arg-type]
                        await pipe.execute()
                        return True
                    except rexc.WatchError as exc:
                        raise_if_lost(exc, f"write of {doc_id!r}")
                        continue
        raise IndexError_(f"context write of {doc_id!r} kept conflicting; giving up after {_WATCH_RETRIES} tries")
