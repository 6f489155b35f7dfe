"""Bulk listings over the search index: community summaries (for a reindex), a forget's docs, and
the distinct ids or sources of a tenant's documents (the contract's ``list``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from redis.commands.search.aggregation import AggregateRequest, Asc
from redis.commands.search.query import Query

from memory.errors import InvalidRequest
from memory.filters import hash_clause, tag_clause
from memory.index.codec import _stored
from memory.index.errors import translate_errors
from memory.index.lifecycle import _Lifecycle
from memory.records import DEFAULT_TENANT, ChunkRecord
from memory.schema import MAX_SEARCH_OFFSET, as_str

#: Search timeout of bulk listings (a reindex's summaries), not of askers' queries.
BULK_QUERY_TIMEOUT_MS = 60_000
# Most listings of one forget (see doc_ids_where).
_LISTING_PASSES = 4


class _Listings(_Lifecycle):
    """Paged listings that are not an asker's query (longer timeout, every hit)."""

    async def _bulk_pages(self, query: str, fields: Sequence[str], what: str, page: int) -> AsyncIterator[Any]:
        """Every hit of ``query``, page by page in timestamp order (a bulk listing).

        Not an asker's query: deep pages of a big index may outlive the search timeout,
        which now fails the query (ON_TIMEOUT FAIL) instead of cutting it.
        """
        offset = 0
        while True:
            q = (
                Query(query)
                .paging(offset, page)
                .return_fields(*fields)
                .sort_by("timestamp")
                .timeout(BULK_QUERY_TIMEOUT_MS)
                .dialect(2)
            )
            async with translate_errors(what):
                res = await self._ft().search(q)
            for doc in res.docs:
                yield doc
            offset += len(res.docs)
            if len(res.docs) < page:
                return

    async def community_records(self, *, since: float = 0.0, page: int = 500) -> list[ChunkRecord]:
        """Every community-summary chunk of this index (written at or after ``since``).

        Summaries come from the graph, not from Kafka, so a reindex carries them over from
        the old generation instead of replaying them.
        """
        out: list[ChunkRecord] = []
        fields = tuple(dict.fromkeys((*self._fields, "position", "version", "timestamp")))
        query = f"@kind:{{community}} @timestamp:[{since!r} +inf]"
        async for doc in self._bulk_pages(query, fields, "community listing", page):
            stored = _stored(doc, self._tag_keys)
            tags = dict(stored.tags)
            tenant = tags.pop("tenant", DEFAULT_TENANT)
            out.append(
                ChunkRecord(
                    chunk_id=stored.chunk_id,
                    doc_id=stored.doc_id,
                    position=int(as_str(getattr(doc, "position", "0"))),
                    text=stored.text,
                    kind="community",
                    source=stored.source,
                    tags=tags,
                    metadata=stored.metadata,
                    version=int(float(as_str(getattr(doc, "version", "0")))),
                    timestamp=stored.timestamp or 0.0,
                    tenant=tenant,
                )
            )
        return out

    async def doc_ids_where(self, tenant: str, tags: dict[str, str], *, page: int = 1000) -> set[str]:
        """Ids of the docs of ``tenant`` with a chunk whose tags equal ``tags`` (a forget's listing).

        Filtered on the hashed NUMERIC fields, which match any value exactly (a TAG query
        cannot hold some characters), and re-checked against the stored tags (a hash may
        collide).
        """
        want = {**tags, "tenant": tenant}
        query = hash_clause({k: [v] for k, v in want.items()})
        fields = tuple(dict.fromkeys(("doc_id", "timestamp", *want)))
        found: set[str] = set()
        # Listed again until a pass finds nothing new: the listing pages by offset, and chunks
        # deleted meanwhile (another daemon forgetting one of these sessions) move later ones
        # up past a page boundary, unseen (a few turns of an agent-wide forget would survive).
        # Bounded: new matching turns could keep arriving. Not an FT.AGGREGATE cursor: RediSearch
        # ends a paused cursor early, silently, when writes change a numeric tree it reads
        # (decision 0021).
        for _ in range(_LISTING_PASSES):
            before = len(found)
            found |= {
                as_str(getattr(doc, "doc_id", ""))
                async for doc in self._bulk_pages(query, fields, "doc listing", page)
                if all(as_str(getattr(doc, k, "")) == v for k, v in want.items())
            }
            if len(found) == before:
                break
        return found

    async def distinct_values(
        self, *, tenant: str, field: str, source_prefix: str = "", limit: int = 100, offset: int = 0
    ) -> list[str]:
        """The distinct ``field`` values (``doc_id`` or ``source``) of the tenant's documents whose
        source starts with ``source_prefix``, in code point order, ``limit`` from ``offset``.

        One FT.AGGREGATE: the tenant and kind as TAG clauses (nothing is scored here, and tenant
        names and ``document`` are plain TAG values), the prefix as a ``startswith`` filter, so
        only the matching values leave Redis (a prefix with a character an expression cannot
        hold is matched here instead, over a few aggregations of doubling size). It reads every
        document chunk of the tenant: a TAG prefix query would read only the matching ones, but
        RediSearch expands a prefix into at most MAXPREFIXEXPANSIONS (200) values, silently
        (decision 0025).
        """
        if field not in ("doc_id", "source"):
            raise InvalidRequest(f"cannot list {field!r}: only doc_id or source")
        # Loading a field is most of the cost (~2 us a chunk here): only what is read.
        loaded = ("@source",) if field == "source" else ("@doc_id", "@source")
        # RediSearch's expression strings mangle backslashes and quotes and refuse line breaks
        # (measured): the prefix's part before the first such character is filtered in Redis,
        # and the whole prefix, with the page, here.
        safe = expression_safe(source_prefix)
        exact = len(safe) < len(source_prefix)
        groups = [f"@{field}", "@source"] if exact and field != "source" else [f"@{field}"]

        def request(start: int, num: int) -> AggregateRequest:
            # A new request each time: its limit() appends to the plan, it does not replace.
            req = AggregateRequest(tag_clause({"kind": ["document"], "tenant": [tenant]})).load(*loaded)
            if safe:
                req = req.filter(f"startswith(@source, {expression_string(safe)})")
            # redis-py types sort_by's fields as str; it takes Asc too.
            req = req.group_by(groups).sort_by(Asc(f"@{field}"), max=0)  # type: ignore[arg-type]
            return req.limit(start, num).dialect(2)

        if not exact:
            return [value for value, _ in (await self._value_rows(request(offset, limit), field))[0]]
        # Matched here: the part's rows in order, read in pages that double (each page is a
        # whole aggregation), until the page asked for is full.
        out: list[str] = []
        start, size = 0, _EXACT_PAGE
        while len(out) < offset + limit:
            if start > MAX_SEARCH_OFFSET:
                raise InvalidRequest(
                    f"over {MAX_SEARCH_OFFSET:,} documents' sources start with {safe!r}, the part of the prefix "
                    "before its first backslash, quote or control character: list a longer prefix"
                )
            rows, read = await self._value_rows(request(start, size), field)
            for value, source in rows:
                if source.startswith(source_prefix) and not (out and out[-1] == value):
                    out.append(value)
            if read < size:
                break
            start, size = start + size, size * 2
        return out[offset : offset + limit]

    async def _value_rows(self, req: AggregateRequest, field: str) -> tuple[list[tuple[str, str]], int]:
        """``(value of field, source)`` of each row (the source is empty when not grouped by),
        and how many rows Redis returned."""
        async with translate_errors("value listing"):
            res = await self._ft().aggregate(req)
        out: list[tuple[str, str]] = []
        for row in res.rows:
            pairs = {as_str(k): v for k, v in zip(row[::2], row[1::2], strict=False)}
            value = pairs.get(field)
            if value is not None:
                out.append((as_str(value), as_str(pairs.get("source", ""))))
        return out, len(res.rows)


#: Rows of the first page read when the prefix is matched here.
_EXACT_PAGE = 10_000


def expression_safe(prefix: str) -> str:
    """The part of ``prefix`` before its first character an expression string cannot hold as
    it is: a backslash, a quote or a control character."""
    for i, c in enumerate(prefix):
        if c in "\\\"'" or ord(c) < 0x20 or c == "\x7f":
            return prefix[:i]
    return prefix


def expression_string(value: str) -> str:
    """``value`` as a double-quoted string literal of a RediSearch expression (FILTER, APPLY)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
