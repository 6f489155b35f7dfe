"""Read-only listings for people browsing the memory (the explorer): counts, groups, and pages
of chunks in time order, each a bounded query that never reads a tenant's every chunk to
show a page of it.

Pages are keyset-paged on the sortable ``timestamp`` (a :class:`PageKey`), not by offset: the
cost of a page does not grow with how deep it is. Groups (a tenant's agents, an agent's
sessions, a tenant's documents) are one ``FT.AGGREGATE`` over the chunks of that scope.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from redis.commands.search.query import Query

from memory import keys
from memory.errors import InvalidRequest
from memory.filters import TagFilter, conjoin, hash_clause, tag_clause
from memory.index.codec import _float_or_none, _stored
from memory.index.errors import translate_errors
from memory.index.listings import expression_safe, expression_string
from memory.index.sliced import _SlicedWrites
from memory.records import StoredChunk
from memory.schema import as_str

#: The fields a group listing can group by.
GROUP_FIELDS = ("tenant", "agent_id", "session_id", "doc_id")
#: Most rows of one page or group listing.
MAX_PAGE = 500


@dataclass(frozen=True, slots=True)
class PageKey:
    """Where a time-ordered page starts: at ``timestamp`` (inclusive), after the first
    ``skip`` chunks stamped exactly ``timestamp`` (those the previous page showed)."""

    timestamp: float
    skip: int = 0


@dataclass(frozen=True, slots=True)
class ChunkPage:
    """One page of chunks in time order, and the key of the next page (None: the last)."""

    chunks: list[StoredChunk]
    next: PageKey | None


@dataclass(frozen=True, slots=True)
class Group:
    """One value of a group listing: how many chunks carry it, and the latest one's time."""

    value: str
    chunks: int
    last: float | None
    version: int | None = None  # the doc's last applied version (grouped by doc_id in one tenant only)


def next_key(stamps: Sequence[float], start: PageKey | None, *, more: bool) -> PageKey | None:
    """The key of the page after one whose chunks had ``stamps`` (in page order), or None.

    The chunks stamped like the page's last one are skipped by the next page; where the
    whole page shares the start's stamp, those the start skipped are counted too.
    """
    if not more or not stamps:
        return None
    last = stamps[-1]
    same = sum(1 for s in stamps if s == last)
    if start is not None and start.timestamp == last:
        same += start.skip
    return PageKey(last, same)


def _check_listing(limit: int) -> None:
    """A listing reads up to a page and the one row that says another page follows."""
    if not 1 <= limit <= MAX_PAGE + 1:
        raise InvalidRequest(f"a listing holds 1..{MAX_PAGE + 1} values, not {limit}")


class _Browsing(_SlicedWrites):
    """``count_where``, ``chunk_page`` and ``groups``: what the explorer reads."""

    async def count_where(self, tags: Mapping[str, str]) -> int:
        """How many chunks carry exactly these tag values (``tenant``, ``kind``, …); no chunk is read."""
        query = hash_clause({k: [v] for k, v in tags.items()})
        q = Query(query).paging(0, 0).dialect(2)
        async with translate_errors("chunk count"):
            res = await self._ft().search(q)
        return int(res.total)

    async def chunk_page(
        self,
        tags: Mapping[str, str],
        *,
        limit: int,
        start: PageKey | None = None,
        order: Literal["asc", "desc"] = "desc",
        also: TagFilter | None = None,
    ) -> ChunkPage:
        """A page of the chunks whose tags equal ``tags`` (and match the filter ``also``), by
        timestamp (``order``), from ``start``.

        One FT.SEARCH, sorted on the sortable timestamp and bounded by it from ``start``, so a
        deep page costs what the first does. The tags are matched on their hashed NUMERIC
        fields (exact for any value) and re-checked on the chunks read (a hash may collide).
        Chunks stamped alike keep the engine's order between pages while the index holds still.

        Raises:
            InvalidRequest: ``limit`` outside 1..``MAX_PAGE``.
            BackendUnavailable: Redis is unreachable.
        """
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidRequest(f"a page holds 1..{MAX_PAGE} chunks, not {limit}")
        bound = "*"
        if start is not None:
            edge = repr(float(start.timestamp))
            bound = f"@timestamp:[-inf {edge}]" if order == "desc" else f"@timestamp:[{edge} +inf]"
        want = (also or TagFilter()).without(tags)
        for key, value in tags.items():
            want = want.including(key, [value])
        query = conjoin(want.hash_query(), bound)
        skip = start.skip if start is not None else 0
        q = (
            Query(query)
            .paging(skip, limit + 1)
            .return_fields(*self._fields)
            .sort_by("timestamp", asc=order == "asc")
            .dialect(2)
        )
        async with translate_errors("chunk page"):
            res = await self._ft().search(q)
        rows = [_stored(d, self._tag_keys) for d in res.docs]
        more = len(rows) > limit
        rows = rows[:limit]
        stamps = [r.timestamp or 0.0 for r in rows]
        return ChunkPage([r for r in rows if want.matches(r.tags)], next_key(stamps, start, more=more))

    async def groups(
        self,
        field: str,
        tags: Mapping[str, str],
        *,
        limit: int,
        offset: int = 0,
        where: Mapping[str, str] | None = None,
    ) -> list[Group]:
        """The distinct ``field`` values (``GROUP_FIELDS``) of the chunks whose TAG values are
        ``tags`` and whose stored values equal ``where`` exactly, in code point order, each with
        its chunk count, latest timestamp and (grouped by ``doc_id`` in one tenant) the doc's
        last applied version.

        One FT.AGGREGATE over the chunks in scope: ``tags`` must be plain values (a tenant, a
        kind); ``where`` may hold anything (an agent id), matched on its hashed field and then
        compared whole.

        Raises:
            InvalidRequest: an unknown ``field``, or ``limit`` outside 1..``MAX_PAGE`` + 1.
            BackendUnavailable: Redis is unreachable.
        """
        if field not in GROUP_FIELDS:
            raise InvalidRequest(f"cannot group by {field!r}: only {', '.join(GROUP_FIELDS)}")
        _check_listing(limit)
        where = where or {}
        query = conjoin(tag_clause({k: [v] for k, v in tags.items()}), hash_clause({k: [v] for k, v in where.items()}))
        # Loading a field is most of the cost (the timestamp is sortable: read without a load),
        # so a doc's version is read from its version key for the page's docs only: 0.66 x the
        # aggregate's time at 100,000 chunks, measured here.
        versions = field == "doc_id" and "tenant" in tags
        loaded = dict.fromkeys((field, *where))
        args: list[Any] = [query, "LOAD", len(loaded), *(f"@{f}" for f in loaded)]
        for key, value in sorted(where.items()):
            # The hashed clause matched it already; the whole comparison only rules out a hash
            # collision, and an expression string cannot hold a backslash, quote or line break.
            if expression_safe(value) == value:
                args += ["FILTER", f"@{key} == {expression_string(value)}"]
        args += ["GROUPBY", 1, f"@{field}", "REDUCE", "COUNT", 0, "AS", "n"]
        args += ["REDUCE", "MAX", 1, "@timestamp", "AS", "last"]
        args += ["SORTBY", 2, f"@{field}", "ASC", "MAX", 0, "LIMIT", offset, limit, "DIALECT", 2]
        async with translate_errors("group listing"):
            reply = await self._r.execute_command("FT.AGGREGATE", self._search_name(), *args)  # type: ignore[no-untyped-call]
        out: list[Group] = []
        for pairs in _rows(reply):
            if pairs.get(field) is None:
                continue
            out.append(
                Group(
                    value=as_str(pairs[field]),
                    chunks=int(float(as_str(pairs.get("n", 0)))),
                    last=_float_or_none(pairs.get("last")),
                )
            )
        if versions and out:
            gen = await self._generation()
            async with translate_errors("group listing"):
                stored = await self._r.mget([self._ver_key(gen, tags["tenant"], g.value) for g in out])
            out = [
                dataclasses.replace(g, version=None if v is None else int(v)) for g, v in zip(out, stored, strict=True)
            ]
        return out

    async def _directory_page(
        self, key_of: Callable[[str, int, str], str], tenant: str, *, limit: int, offset: int
    ) -> tuple[int, list[str]] | None:
        """The generation followed and a page of the names its directory set ``key_of`` holds
        for ``tenant`` (by rank: code point order); None when the generation keeps no directory.

        Raises:
            InvalidRequest: ``limit`` outside 1..``MAX_PAGE`` + 1.
            BackendUnavailable: Redis is unreachable.
        """
        _check_listing(limit)
        gen = await self._generation()
        if not await self.has_directory(gen):
            return None
        async with translate_errors("directory listing"):
            found = await self._r.zrange(key_of(self._cfg.name, gen, tenant), offset, offset + limit - 1)
        return gen, [as_str(m) for m in found]

    async def documents(self, tenant: str, *, limit: int, offset: int = 0) -> list[Group]:
        """A page of the tenant's documents in code point order, each with its chunk count,
        latest time and last applied version: from the directory (what the page holds is
        read), else (a generation older than it) by :meth:`groups`.

        Raises:
            InvalidRequest: ``limit`` outside 1..``MAX_PAGE`` + 1.
            BackendUnavailable: Redis is unreachable.
        """
        page = await self._directory_page(keys.dir_docs_key, tenant, limit=limit, offset=offset)
        if page is None:
            return await self.groups("doc_id", {"tenant": tenant, "kind": "document"}, limit=limit, offset=offset)
        gen, ids = page
        if not ids:
            return []
        name = self._cfg.name
        async with translate_errors("document listing"), self._r.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.dir_last_key(name, gen, tenant), ids)
            pipe.mget([self._ver_key(gen, tenant, d) for d in ids])
            for d in ids:
                pipe.scard(self._doc_key(gen, tenant, d))
            last, versions, *counts = await pipe.execute()
        return [
            Group(d, int(n), _float_or_none(t), None if v is None else int(v))
            for d, t, v, n in zip(ids, last, versions, counts, strict=True)
        ]

    async def agents(self, tenant: str, *, limit: int, offset: int = 0) -> list[Group]:
        """A page of the tenant's agents with turns, in code point order, each with its turn
        chunk count and latest turn's time: from the directory, else by :meth:`groups`.

        Raises:
            InvalidRequest: ``limit`` outside 1..``MAX_PAGE`` + 1.
            BackendUnavailable: Redis is unreachable.
        """
        page = await self._directory_page(keys.dir_agents_key, tenant, limit=limit, offset=offset)
        if page is None:
            return await self.groups("agent_id", {"tenant": tenant, "kind": "transcript"}, limit=limit, offset=offset)
        gen, agents = page
        if not agents:
            return []
        name = self._cfg.name
        async with translate_errors("agent listing"), self._r.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.dir_chunks_key(name, gen, tenant), agents)
            for a in agents:
                pipe.zrange(keys.dir_turns_key(name, gen, tenant, a), -1, -1, withscores=True)
            counts, *latest = await pipe.execute()
        return [
            Group(a, int(n or 0), float(top[0][1]) if top else None)
            for a, n, top in zip(agents, counts, latest, strict=True)
        ]

    async def directory_tenants(self) -> set[str]:
        """The tenants the directory lists anything of (a scan: for doctor)."""
        gen = await self._generation()
        root = keys.key_root(self._cfg.name, gen)
        found = set()
        async with translate_errors("directory check"):
            for kind in ("docs", "chunks"):
                prefix = f"{root}dir:{kind}:"
                async for raw in self._r.scan_iter(match=prefix + "*", count=1000):
                    found.add(as_str(raw)[len(prefix) :])
        return found

    async def directory_drift(self, tenants: Sequence[str]) -> list[str]:
        """What the directory says of each of these tenants that its chunks do not, in words
        (empty: they agree); for doctor: it aggregates each tenant's chunks. A writer of an
        older release writing into this generation (a rolling upgrade) leaves the directory short.
        """
        gen = await self._generation()
        name = self._cfg.name
        # New docs being written in slices are stored, not yet listed.
        hidden = [t for (t, _), m in (await self.unfinished_writes()).items() if m.shown is None]
        found = []
        for tenant in tenants:
            query = tag_clause({"tenant": [tenant], "kind": ["document"]})
            args: list[Any] = [query, "LOAD", 1, "@doc_id", "GROUPBY", 0, "REDUCE", "COUNT_DISTINCT", 1, "@doc_id"]
            args += ["AS", "n", "DIALECT", 2]
            async with translate_errors("directory check"):
                listed_docs = int(await self._r.zcard(keys.dir_docs_key(name, gen, tenant)))
                counted = sum(int(v) for v in await self._r.hvals(keys.dir_chunks_key(name, gen, tenant)))
                reply = await self._r.execute_command("FT.AGGREGATE", self._search_name(), *args)  # type: ignore[no-untyped-call]
            rows = _rows(reply)
            docs = int(float(as_str(rows[0].get("n", 0)))) - hidden.count(tenant) if rows else 0
            turns = await self.count_where({"tenant": tenant, "kind": "transcript"})
            wrong = []
            if listed_docs != docs:
                wrong.append(f"{listed_docs} documents listed, {docs} stored")
            if counted != turns:
                wrong.append(f"{counted} turn chunks counted, {turns} stored")
            if wrong:
                found.append(f"tenant {tenant}: " + ", ".join(wrong))
        return found


def _rows(reply: Any) -> list[dict[str, Any]]:
    """An ``FT.AGGREGATE`` reply's rows as field -> value: RESP3 answers a map whose ``results``
    hold ``extra_attributes``; RESP2 a list (the count, then each row's field/value pairs)."""
    if isinstance(reply, Mapping):
        results = reply.get(b"results", reply.get("results")) or ()
        rows = []
        for item in results:
            attrs = item.get(b"extra_attributes", item.get("extra_attributes")) or {}
            rows.append({as_str(k): v for k, v in attrs.items()})
        return rows
    return [{as_str(k): v for k, v in zip(row[::2], row[1::2], strict=False)} for row in list(reply)[1:]]
