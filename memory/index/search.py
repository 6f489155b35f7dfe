"""The search legs: BM25 over analyzed terms and HNSW KNN, both refused on a mismatched index.

Two forms of each leg: ``rank_text`` and ``rank_vector`` return ``LegHit``s (ids and the few
fields fusion and the re-checks read), and ``hydrate`` reads the winners whole, what
retrieval does; ``search_text`` and ``search_vector`` return every candidate whole.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, overload

import numpy as np
from redis.commands.search.query import Query
from redis.exceptions import NoScriptError

from memory.index.codec import _stored
from memory.index.errors import translate_errors
from memory.index.hits import LegHit, leg_fields, leg_hits, reply_distances, whole_chunks
from memory.index.lifecycle import _Lifecycle
from memory.index.marker_list import MAX_READ
from memory.records import StoredChunk
from memory.schema import as_str
from memory.visibility import WriteMarker

# KEYS: the chunk hashes, then the write markers; ARGV: how many chunk hashes, then the fields.
# One command for all the winners: pipelined, the 50 HMGETs of a top_k of 50 cost more to
# pack in redis-py than the rest of the query's Redis calls together.
_HYDRATE = """
local n = tonumber(ARGV[1])
local fields = {unpack(ARGV, 2)}
local rows, markers = {}, {}
for i = 1, n do rows[i] = redis.call('HMGET', KEYS[i], unpack(fields)) end
-- Markers exist only while a sliced write is in flight (and a few minutes after, until they
-- expire): one EXISTS over them all answers the common case (at top_k 50, 18% less of this
-- script's Redis time than a GET per candidate's doc). In groups: unpack takes at most a few
-- thousand values.
local any = false
for i = n + 1, #KEYS, 1000 do
  if redis.call('EXISTS', unpack(KEYS, i, math.min(i + 999, #KEYS))) > 0 then any = true break end
end
if any then
  for i = n + 1, #KEYS do markers[i - n] = redis.call('GET', KEYS[i]) end
end
return {rows, markers}
"""
_HYDRATE_SHA = hashlib.sha1(_HYDRATE.encode()).hexdigest()

# KEYS: the chunk hashes, then the list of marker keys (memory.index.marker_list); ARGV: how
# many chunk hashes, the list's sentinel, then the fields. Returns the rows and 0 with every
# write marker standing in the index, as two lists (their keys, their values); or 1 where
# more are listed than this read should take, 2 where the list is not complete (lost). Where
# none stands, as almost always, nothing else is read: at top_k 50 the marker keys of 150 to
# 300 candidates' docs cost more than the rest of this read. The listed keys are read without
# being declared: this index never runs on a cluster.
_HYDRATE_ANY = """
local n = tonumber(ARGV[1])
local fields = {unpack(ARGV, 3)}
local rows = {}
for i = 1, n do rows[i] = redis.call('HMGET', KEYS[i], unpack(fields)) end
local list = KEYS[n + 1]
if redis.call('SISMEMBER', list, ARGV[2]) == 0 then return {rows, 2} end
if redis.call('SCARD', list) > MAX_READ + 1 then return {rows, 1} end
local names, values = {}, {}
for _, key in ipairs(redis.call('SMEMBERS', list)) do
  if key ~= ARGV[2] then
    local value = redis.pcall('GET', key)
    if type(value) == 'string' then names[#names + 1] = key; values[#values + 1] = value end
  end
end
return {rows, 0, names, values}
""".replace("MAX_READ", str(MAX_READ))
_HYDRATE_ANY_SHA = hashlib.sha1(_HYDRATE_ANY.encode()).hexdigest()


class _Search(_Lifecycle):
    """``rank_text``, ``rank_vector`` and ``hydrate``; ``search_text`` and ``search_vector``."""

    async def search_text(self, query: str, *, k: int) -> list[StoredChunk]:
        """A BM25 leg: ``query`` is a full, already-escaped RediSearch query over analyzed terms.

        ``VERBATIM``: the terms were analyzed by ``memory.text`` (or are identifiers) and
        the fields are NOSTEM, so RediSearch must not expand them with its own stemmer.
        """
        q = Query(query).scorer("BM25STD").verbatim().paging(0, k).return_fields(*self._fields).dialect(2)
        # The terms were analyzed by this process's analyzer: meaningless to an index built
        # with another one (a request with dense_weight 0 runs only these legs).
        await self._refuse_mismatch()
        async with translate_errors("text search"):
            res = await self._ft().search(q)
        return [_stored(d, self._tag_keys) for d in res.docs]

    async def search_vector(self, vector: np.ndarray, *, filter_query: str, k: int) -> list[StoredChunk]:
        """The HNSW leg: KNN ``k`` within ``filter_query`` (applied inside the engine)."""
        base = filter_query if filter_query == "*" else f"({filter_query})"
        q = (
            Query(f"{base}=>[KNN {k} @vector $vec EF_RUNTIME $ef AS vector_distance]")
            .sort_by("vector_distance")
            .paging(0, k)
            .return_fields(*self._fields, "vector_distance")
            .dialect(2)
        )
        # The query was embedded with this process's model: meaningless to another's index.
        await self._refuse_mismatch()
        params = {"vec": np.asarray(vector, dtype=np.float32).tobytes(), "ef": max(self._cfg.hnsw_ef_runtime, k)}
        async with translate_errors("vector search"):
            res = await self._ft().search(q, query_params=params)
        return [_stored(d, self._tag_keys) for d in res.docs]

    async def _ranked(
        self, what: str, args: list[Any], tag_keys: Sequence[str], max_distance: float | None = None
    ) -> list[LegHit]:
        # FT.SEARCH sent and read as is: redis-py's Query and Result objects (and the decoding
        # of every returned value) were most of a leg's client-side CPU.
        async with translate_errors(what):
            reply = await self._batch.execute("FT.SEARCH", self._search_name(), *args)
        hits = leg_hits(reply, tag_keys)
        if max_distance is None:
            return hits
        # A KNN reply is nearest first: the candidates within reach are a prefix of it.
        return hits[: sum(1 for d in reply_distances(reply) if d <= max_distance)]

    async def rank_text(
        self, query: str, *, k: int, tag_keys: Sequence[str] = ("tenant",), idents: bool = False
    ) -> list[LegHit]:
        """``search_text``'s candidates in its order, as ``LegHit``s carrying ``tag_keys``
        (and their identifiers, with ``idents``)."""
        fields = leg_fields(tag_keys, idents=idents)
        await self._refuse_mismatch()  # as search_text
        args: list[Any] = [query, "VERBATIM", "SCORER", "BM25STD", "RETURN", len(fields), *fields]
        return await self._ranked("text search", [*args, "LIMIT", 0, k, "DIALECT", 2], tag_keys)

    async def rank_vector(
        self,
        vector: np.ndarray,
        *,
        filter_query: str,
        k: int,
        tag_keys: Sequence[str] = ("tenant",),
        max_distance: float | None = None,
    ) -> list[LegHit]:
        """``search_vector``'s candidates in its order, as ``LegHit``s carrying ``tag_keys``;
        with ``max_distance``, only those at most that far (cosine distance) from ``vector``."""
        base = filter_query if filter_query == "*" else f"({filter_query})"
        fields = leg_fields(tag_keys) + (("vector_distance",) if max_distance is not None else ())
        await self._refuse_mismatch()  # as search_vector
        vec = np.asarray(vector, dtype=np.float32).tobytes()
        args: list[Any] = [
            f"{base}=>[KNN {k} @vector $vec EF_RUNTIME $ef AS vector_distance]",
            "RETURN",
            len(fields),
            *fields,
            "SORTBY",
            "vector_distance",
            "ASC",
            "LIMIT",
            0,
            k,
            "DIALECT",
            2,
            "PARAMS",
            4,
            "vec",
            vec,
            "ef",
            max(self._cfg.hnsw_ef_runtime, k),
        ]
        return await self._ranked("vector search", args, tag_keys, max_distance)

    def standing_markers(
        self, standing: Mapping[str, WriteMarker], docs: Iterable[tuple[int, str, str]]
    ) -> dict[tuple[int, str, str], WriteMarker]:
        """The markers of ``docs`` (``(generation, tenant, doc_id)``) among ``standing``
        (markers by key, as ``hydrate`` without docs returns them)."""
        if not standing:
            return {}
        return {d: m for d in docs if (m := standing.get(self._marker_key(*d))) is not None}

    @overload
    async def hydrate(
        self, hits: Sequence[LegHit], markers_of: Sequence[tuple[int, str, str]]
    ) -> tuple[list[StoredChunk | None], dict[tuple[int, str, str], WriteMarker]]: ...

    @overload
    async def hydrate(
        self, hits: Sequence[LegHit], markers_of: None
    ) -> tuple[list[StoredChunk | None], dict[str, WriteMarker] | None]: ...

    async def hydrate(
        self, hits: Sequence[LegHit], markers_of: Sequence[tuple[int, str, str]] | None
    ) -> tuple[list[StoredChunk | None], dict[tuple[int, str, str], WriteMarker] | dict[str, WriteMarker] | None]:
        """Each hit's chunk whole, as ``search_text`` returns it (None where it is gone), and
        the write markers of ``markers_of`` (``(generation, tenant, doc_id)``), read together
        in one script (one round trip, atomic).

        Read with the chunks, the markers decide what shows of whatever a write did since the
        legs ran, as after the legs (``memory.visibility``). Never the ``vector``: it is not returned.
        ``markers_of`` None: every marker standing in the index instead, by key (see
        ``standing_markers``), or None where too many stand to read them with the chunks.
        """
        if not hits and not markers_of:  # nothing read, nothing a marker could hide
            return [], {}
        fields = self._fields
        if markers_of is None:
            keys = [*(h.key for h in hits), self.marker_list.key]
            call = ("EVALSHA", _HYDRATE_ANY_SHA, len(keys), *keys, len(hits), self.marker_list.sentinel, *fields)
            script = _HYDRATE_ANY
        else:
            keys = [*(h.key for h in hits), *(self._marker_key(g, t, d) for g, t, d in markers_of)]
            call = ("EVALSHA", _HYDRATE_SHA, len(keys), *keys, len(hits), *fields)
            script = _HYDRATE
        async with translate_errors("chunk read"):
            try:
                reply = await self._batch.execute(*call)
            except NoScriptError:  # a restarted or flushed Redis: load it and ask again
                await self._r.script_load(script)
                reply = await self._batch.execute(*call)
        rows = reply[0]
        chunks = whole_chunks([(h.key, row) for h, row in zip(hits, rows, strict=True)], fields, self._tag_keys)
        if markers_of is None:
            if reply[1]:  # too many listed (prune them) or the list lost (rebuild it)
                self.marker_list.tend(incomplete=reply[1] == 2)
                return chunks, None
            standing = ((as_str(k), WriteMarker.decode(v)) for k, v in zip(reply[2], reply[3], strict=True))
            return chunks, {k: m for k, m in standing if m is not None}
        raw_markers = reply[1]
        # No marker at all comes back as an empty list (see _HYDRATE).
        pairs = zip(markers_of, raw_markers, strict=True) if raw_markers else ()
        markers = {k: m for k, v in pairs if (m := WriteMarker.decode(v)) is not None}
        return chunks, markers
