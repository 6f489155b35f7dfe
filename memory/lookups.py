"""Reading memories by id: a doc's (or turn's) current content, an agent's latest turns, the
distinct ids or sources. Each shows what a search would show: the tenant's own, the filter's,
and no mix of a sliced write's versions (``memory.visibility``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from memory.conversation import MAX_RECENT_TURNS, parse_turn
from memory.errors import InvalidRequest
from memory.filters import FilterSpec, TagFilter, normalize_filter, tag_values
from memory.hit_checks import marker_docs
from memory.index import MAX_PAGE, ChunkIndex, LegHit, Opening, PageKey
from memory.index.codec import joined_text
from memory.index.history import Version
from memory.records import DEFAULT_TENANT, StoredChunk
from memory.search_results import Lookup
from memory.visibility import WriteMarker, visible


class Lookups:
    """Reads by id over one ChunkIndex, with a search's visibility."""

    def __init__(self, index: ChunkIndex) -> None:
        self._index = index

    async def lookup(
        self,
        doc_ids: Sequence[str],
        *,
        tenant: str = DEFAULT_TENANT,
        metadata_filter: FilterSpec | None = None,
        history: bool = False,
        content_chars: int | None = None,
    ) -> list[Lookup]:
        """Each doc's current content (its stored chunks joined in order) and version, and
        with ``history`` a found document's earlier versions (``memory.index.history``).

        With ``content_chars``, the contents of the docs taken in order are read only as far
        as they hold that many characters (each doc's ``whole`` says whether it was read to
        its end): for a reply of that many bytes, which cuts a longer one anyway
        (``ChunkIndex.openings``).

        Visibility is a search's: only the tenant's own docs, only those matching the filter,
        and a doc being written in slices shows no mix of versions (``writing`` while the
        chunks stored are not all of the version its marker shows). A doc that is not shown
        shows no history either.

        Raises:
            InvalidRequest: an unknown filter key.
            BackendUnavailable: Redis is unreachable.
        """
        flt = normalize_filter(metadata_filter, allowed=self._index.cfg.filter_keys).including("tenant", [tenant])
        await self._index.refuse_mismatch()
        wanted = list(dict.fromkeys(doc_ids))
        out = await self._shown(wanted, await self._index.openings(wanted, tenant, content_chars), tenant, flt)
        if content_chars is not None and not cut_where_short(out, content_chars):
            # A doc not shown (outside the filter, being written) took characters it does not
            # show, so a doc after it was read shorter than a reply cuts it: read them whole.
            out = await self._shown(wanted, await self._index.openings(wanted, tenant), tenant, flt)
        return await self._with_history(out, tenant, flt) if history else out

    async def _shown(
        self, wanted: Sequence[str], stored: Mapping[str, Opening], tenant: str, flt: TagFilter
    ) -> list[Lookup]:
        """Each of ``wanted`` as ``stored`` shows it to the request (see :meth:`lookup`)."""
        markers = await self.markers([o.chunks for o in stored.values()], tenant)
        out: list[Lookup] = []
        for doc_id in wanted:
            opening = stored.get(doc_id)
            if opening is None or not flt.matches(opening.chunks[0].tags):
                out.append(Lookup(doc_id, "not_found"))
                continue
            first = opening.chunks[0]
            marker = markers.get((first.generation, tenant, doc_id)) if first.generation is not None else None
            if marker is not None and not all(visible(v, marker) for v in opening.versions):
                out.append(Lookup(doc_id, "writing" if marker.shown is not None else "not_found"))
            else:
                text = joined_text(opening.chunks)
                out.append(Lookup(doc_id, "found", opening.chunks, text, first.version, whole=opening.whole))
        return out

    async def _with_history(self, found: list[Lookup], tenant: str, flt: TagFilter) -> list[Lookup]:
        """``found`` with each document's earlier versions that the request may see: those
        the filter admits (by their own metadata) and older than the version read as current."""
        docs = {f.doc_id: f.version or 0 for f in found if f.status == "found" and f.chunks[0].kind == "document"}
        earlier = await self._index.history(list(docs), tenant, current=docs)
        keys = self._index.cfg.filter_keys

        def shown(f: Lookup, v: Version) -> bool:
            tags = {**tag_values(v.metadata, keys), "tenant": tenant, "doc_id": f.doc_id, "kind": "document"}
            return flt.matches(tags | {"source": v.source})

        return [
            dataclasses.replace(f, history=tuple(v for v in earlier[f.doc_id] if shown(f, v)))
            if f.doc_id in earlier
            else f
            for f in found
        ]

    async def recent(
        self,
        agent_id: str,
        session_id: str | None = None,
        *,
        tenant: str = DEFAULT_TENANT,
        limit: int = 20,
        metadata_filter: FilterSpec | None = None,
    ) -> list[Lookup]:
        """An agent's latest ``limit`` turns (in one session, or across its sessions), whole,
        oldest first: by their time, and by session and turn number among equal times.

        The turns are found newest first by their chunks' time, a page at a time, and read
        as :meth:`lookup` reads them (tenant, filter, sliced writes); turns it does not show
        are passed over, so the reply holds the latest ``limit`` the request may see.

        Raises:
            InvalidRequest: an unknown filter key, or ``limit`` outside 1..``MAX_RECENT_TURNS``.
            BackendUnavailable: Redis is unreachable.
        """
        if not 1 <= limit <= MAX_RECENT_TURNS:
            raise InvalidRequest(f"recent reads 1..{MAX_RECENT_TURNS} turns, not {limit}")
        flt = normalize_filter(metadata_filter, allowed=self._index.cfg.filter_keys)
        await self._index.refuse_mismatch()
        tags = {"tenant": tenant, "kind": "transcript", "agent_id": agent_id}
        if session_id is not None:
            tags["session_id"] = session_id
        if not all(flt.admits(k, v) for k, v in tags.items()):
            return []  # the filter excludes the agent (or session, or kind) asked for
        also = flt.without(tags)
        found: dict[str, Lookup] = {}
        seen: set[str] = set()
        start: PageKey | None = None
        for _ in range(_RECENT_PAGES):
            # The filter inside the search: each page holds only turns the request may see.
            page = await self._index.chunk_page(
                tags, limit=min(MAX_PAGE, 2 * limit), start=start, order="desc", also=also
            )
            fresh = list(dict.fromkeys(c.doc_id for c in page.chunks if c.doc_id not in seen))
            seen.update(fresh)
            for item in await self.lookup(fresh, tenant=tenant, metadata_filter=metadata_filter):
                if item.status == "found":
                    found[item.doc_id] = item
            if page.next is None:
                break
            if len(found) >= limit:
                # Done once the next page is older than the limit-th newest turn: turns of the
                # same time may still follow, and they are ordered by session and turn.
                edge = sorted(found.values(), key=_turn_order)[-limit].chunks[0].timestamp or 0.0
                if page.next.timestamp < edge:
                    break
            start = page.next
        return sorted(found.values(), key=_turn_order)[-limit:]

    async def list_values(
        self, *, tenant: str, field: str, source_prefix: str = "", limit: int = 100, offset: int = 0
    ) -> list[str]:
        """The distinct doc ids or sources of the tenant's documents under a source prefix
        (``ChunkIndex.distinct_values``).

        Raises:
            BackendUnavailable: Redis is unreachable.
        """
        await self._index.refuse_mismatch()
        return await self._index.distinct_values(
            tenant=tenant, field=field, source_prefix=source_prefix, limit=limit, offset=offset
        )

    async def markers(
        self, results: Sequence[Sequence[StoredChunk | LegHit]], tenant: str
    ) -> dict[tuple[int, str, str], WriteMarker]:
        """The write markers of the docs ``results`` hold (of ``tenant``), by generation, tenant and doc."""
        # Read after the legs: whatever mix of a sliced write's chunks they returned, the
        # marker read last decides which version of that doc this answer shows. (A doc with
        # no marker was written in one transaction, as before.) Each hit's own generation:
        # the alias the legs searched may have moved since this process last read it.
        return await self._index.write_markers(sorted(marker_docs(results, tenant)))


def cut_where_short(found: Sequence[Lookup], chars: int) -> bool:
    """Whether a reply of ``chars`` bytes cuts every doc of ``found`` read short: the docs
    shown up to and with it hold more characters than that (so the reply cuts it and leaves
    off every doc after it). Pure."""
    held = 0
    for f in found:
        if f.status == "found":
            held += len(f.content)
            if not f.whole and held <= chars:
                return False
    return True


#: Pages of chunks a ``recent`` read goes through at most, for turns it may not show
#: (another filter's, being forgotten): past these it answers with what it found.
_RECENT_PAGES = 20


def _turn_order(item: Lookup) -> tuple[float, str, int]:
    """A looked-up turn's place in time: its timestamp, then its session and turn number."""
    first = item.chunks[0]
    ref = parse_turn(item.doc_id)
    return (first.timestamp or 0.0, ref.session if ref is not None else "", ref.turn if ref is not None else 0)
