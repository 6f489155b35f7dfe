"""Transcript turns: reads of a session's neighbouring turns and rewrites of their context."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from redis import exceptions as rexc

from memory.chunking import chunk_id
from memory.index.codec import JOIN_FIELDS, TurnEntry, _float_or_none, _int_or_none, _stored, _text, turn_terms
from memory.index.errors import IndexError_, raise_if_lost, translate_errors
from memory.index.lifecycle import _WATCH_RETRIES, _Lifecycle
from memory.keys import check_tenant
from memory.records import DEFAULT_TENANT, StoredChunk
from memory.schema import as_str


@dataclass(frozen=True, slots=True)
class Opening:
    """A stored doc's chunks read for a lookup: those from ``first`` (0-based) on, how many
    chunks it has, the versions its chunks are of (what shows whether a write marker hides
    it), and its content's length in characters (None for chunks stored without their starts)."""

    chunks: tuple[StoredChunk, ...]
    count: int
    versions: frozenset[int | None]
    first: int = 0
    length: int | None = None
    base: int = 0  # where the content starts among the chunks' starts (``_OPENINGS``)

    @property
    def whole(self) -> bool:
        """Whether ``chunks`` run to the doc's last chunk."""
        return self.first + len(self.chunks) == self.count


#: Lua functions of the scripts below: a chunk set's ids in position order (``chunk_position``),
#: each as ``{position, id}``, and the rows of those from ``lo`` (0-based) to ``hi``: each the
#: chunk id and its fields' values (nil where missing).
_ORDERED = """
local function ordered(set)
  local order = {}
  for j, id in ipairs(redis.call('SMEMBERS', set)) do
    order[j] = {tonumber(string.match(id, '_p(%d+)$')) or 0, id}
  end
  table.sort(order, function(a, b) return a[1] < b[1] end)
  return order
end
local function rows_of(prefix, order, lo, hi, fields)
  local rows = {}
  for j = lo + 1, hi do
    local row = redis.call('HMGET', prefix .. order[j][2], unpack(fields))
    table.insert(row, 1, order[j][2])
    rows[#rows + 1] = row
  end
  return rows
end
"""

#: Each doc's chunks in position order (``_Turns._chunk_rows``): KEYS are the docs' chunk sets;
#: ARGV the chunks' key prefix, the number of fields, the fields, then the first index and
#: count (-1: all) read of each doc; per doc its rows (``rows_of``).
_CHUNK_ROWS = (
    _ORDERED
    + """
local prefix, nf = ARGV[1], tonumber(ARGV[2])
local fields = {}
for f = 1, nf do fields[f] = ARGV[2 + f] end
local lo, n = tonumber(ARGV[3 + nf]), tonumber(ARGV[4 + nf])
local out = {}
for i, set in ipairs(KEYS) do
  local order = ordered(set)
  local hi = #order
  if n >= 0 and lo + n < hi then hi = lo + n end
  out[i] = rows_of(prefix, order, lo, hi, fields)
end
return out
"""
)

#: Each doc's content from a character on (``_Turns.openings``): KEYS are the docs' chunk
#: sets; ARGV the chunks' key prefix, the characters to hold, the character to start from, the
#: number of fields, the fields. Per doc: the versions its chunks are of, the rows (as
#: ``_CHUNK_ROWS``'s) from the chunk holding the start character, its number of chunks, the
#: 0-based index of the first row, its length in characters (-1: unknown), and where its
#: content starts among the chunk starts (not 0 for a doc stored before the text it opens
#: with was kept: its first chunk's start, and its content reads from there).
#:
#: The characters are shared as a reply of that many bytes shares them (``water_level``): each
#: doc past its start is read to the first chunk that starts past the level, so it holds more
#: than the level; a doc shorter than it, whole. A chunk stored without its start (before
#: starts were kept) makes its doc read whole, and it takes nothing from the others.
_OPENINGS = (
    _ORDERED
    + """
local prefix, budget, skip, nf = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local fields = {}
for f = 1, nf do fields[f] = ARGV[4 + f] end
local function chars(s)
  if not s then return 0 end
  local _, n = string.gsub(s, '[^\\128-\\191]', '')
  return n
end
local docs, rests = {}, {}
for i, set in ipairs(KEYS) do
  local order = ordered(set)
  local versions, seen, starts, unknown = {}, {}, {}, false
  for j = 1, #order do
    local v = redis.call('HMGET', prefix .. order[j][2], 'version', 'chunk_start')
    if v[1] and not seen[v[1]] then
      seen[v[1]] = true
      versions[#versions + 1] = v[1]
    end
    starts[j] = tonumber(v[2])
    if starts[j] == nil then unknown = true end
  end
  local length, base = -1, 0
  if #order > 0 and not unknown then
    local opening = redis.call('HGET', prefix .. order[1][2], 'chunk_gap')
    local last = redis.call('HMGET', prefix .. order[#order][2], 'text', 'chunk_tail')
    base = starts[1] - chars(opening)
    length = starts[#order] + chars(last[1]) + chars(last[2]) - base
    rests[#rests + 1] = math.max(0, length - skip)
  end
  docs[i] = {order, versions, starts, unknown, length, base}
end
table.sort(rests)
local level, left = budget, budget
for k = 1, #rests do
  local sharing = #rests - k + 1
  if rests[k] * sharing > left then
    level = math.ceil(left / sharing)
    break
  end
  left = left - rests[k]
end
local out = {}
for i, d in ipairs(docs) do
  local order, versions, starts, unknown, length, base = d[1], d[2], d[3], d[4], d[5], d[6]
  local lo, hi = 0, #order
  if not unknown then
    for j = 2, #order do
      if starts[j] > base + skip then break end
      lo = j - 1
    end
    for j = lo + 1, #order do
      if starts[j] > base + skip + level then
        hi = j
        break
      end
    end
  end
  out[i] = {versions, rows_of(prefix, order, lo, hi, fields), #order, lo, length, base}
end
return out
"""
)


#: Characters no document holds (the content limit is megabytes), exact as a Lua number.
_WHOLE = 2**52


def _keyed(prefix: str, rows: Sequence[Sequence[Any]]) -> list[tuple[str, str, list[Any]]]:
    """A script's rows (``rows_of``'s) as (key, chunk id, the fields' values)."""
    return [(prefix + (cid := as_str(row[0])), cid, list(row[1:])) for row in rows]


def _decoded(
    rows: Sequence[tuple[str, str, list[Any]]], fields: Sequence[str], tag_keys: Sequence[str]
) -> list[StoredChunk]:
    """The chunks of ``rows`` (``fields`` read, the first a text) that are stored."""
    return [
        _stored(types.SimpleNamespace(id=key, **dict(zip(fields, values, strict=True))), tag_keys)
        for key, _, values in rows
        if values[0] is not None
    ]


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
        self,
        doc_ids: Sequence[str],
        tenant: str,
        fields: Sequence[str],
        page: tuple[int, int] | None = None,
    ) -> dict[str, list[tuple[str, str, list[Any]]]]:
        """Each doc's stored chunks in position order as (key, chunk id, ``fields``' values),
        with ``page`` (offset, limit) only those of each doc's chunks: read in one script, so no
        edit falls between a doc's chunk set and its chunks (which would give a new version's
        first chunks under the old set, a cut-short text read as the whole).

        One reply for all the chunks, where a pipeline of a command per chunk cost the event
        loop a reply each: a 4 MiB document's 7,600 chunks took a quarter of a second.
        """
        if not doc_ids:
            return {}
        gen = await self._generation()
        prefix = self._chunk_key(gen, tenant, "")
        lo, n = (0, -1) if page is None else page
        async with translate_errors("turn read"):
            replies = await self._r.register_script(_CHUNK_ROWS)(
                keys=[self._doc_key(gen, tenant, d) for d in doc_ids], args=[prefix, len(fields), *fields, lo, n]
            )
        return {d: _keyed(prefix, rows) for d, rows in zip(doc_ids, replies, strict=True)}

    async def as_written(self, doc_ids: Sequence[str], tenant: str = DEFAULT_TENANT) -> dict[str, list[StoredChunk]]:
        """Each stored doc's chunks in position order, with only what says what was written
        (text, version, source, metadata and how the chunks join): what an event of the
        stored version is compared with (``memory.replays``). Many chunks are decoded in a
        thread, off the event loop."""
        fields = ("text", "version", "source", "metadata", *JOIN_FIELDS)
        rows = await self._chunk_rows(doc_ids, tenant, fields)

        def decoded() -> dict[str, list[StoredChunk]]:
            return {d: found for d, chunks in rows.items() if (found := _decoded(chunks, fields, ()))}

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
        return {d: found for d, chunks in rows.items() if (found := _decoded(chunks, fields, self._tag_keys))}

    async def openings(
        self, doc_ids: Sequence[str], tenant: str, chars: int | None = None, *, skip: int = 0
    ) -> dict[str, Opening]:
        """Each stored doc's chunks as :meth:`turns` reads them, from the one holding character
        ``skip`` on and only as far as a reply of ``chars`` bytes can show of the docs
        (``water_level``; ``None``: to their ends), with the versions of all its chunks: in
        one script, so the versions and the chunks read are of one moment.

        Why: a reply cut to ``chars`` bytes never shows more, and reading a 4 MiB document's
        thousands of chunks whole held the event loop for every other question.
        """
        if not doc_ids:
            return {}
        gen = await self._generation()
        prefix = self._chunk_key(gen, tenant, "")
        fields = (*self._fields, *JOIN_FIELDS)
        async with translate_errors("turn read"):
            replies = await self._r.register_script(_OPENINGS)(
                keys=[self._doc_key(gen, tenant, d) for d in doc_ids],
                args=[prefix, _WHOLE if chars is None else chars, skip, len(fields), *fields],
            )

        def decoded() -> dict[str, Opening]:
            out: dict[str, Opening] = {}
            for d, (versions, rows, count, first, length, base) in zip(doc_ids, replies, strict=True):
                if chunks := _decoded(_keyed(prefix, rows), fields, self._tag_keys):
                    out[d] = Opening(
                        tuple(chunks),
                        int(count),
                        frozenset(_int_or_none(v) for v in versions),
                        int(first),
                        None if int(length) < 0 else int(length),
                        int(base),
                    )
            return out

        many = sum(len(rows) for _, rows, *_ in replies) > _DECODED_INLINE
        return await asyncio.to_thread(decoded) if many else decoded()

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
