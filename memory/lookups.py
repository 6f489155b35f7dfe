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
        offset: int = 0,
        version: int | None = None,
    ) -> list[Lookup]:
        """Each doc's current content (its stored chunks joined in order) and version, and
        with ``history`` a found document's earlier versions (``memory.index.history``).

        ``offset``: each content from that character on. ``version``: that version of the
        doc (one doc), current or kept in its history; ``not_found`` when it is neither,
        ``writing`` when the doc is being written and its history does not hold it.

        With ``content_chars``, contents are read only as far as a reply of that many bytes
        shows them (``water_level``; each doc's ``whole`` says whether it was read to its
        end, and ``size`` how long it is): a longer reply is cut anyway
        (``ChunkIndex.openings``).

        Visibility is a search's: only the tenant's own docs, only those matching the filter
        (an earlier version by its own metadata), and a doc being written in slices shows no
        mix of versions (``writing`` while the chunks stored are not all of the version its
        marker shows). A doc that is not shown shows no history either.

        Raises:
            InvalidRequest: an unknown filter key, or ``version`` with ``history``.
            BackendUnavailable: Redis is unreachable.
        """
        if version is not None and history:
            raise InvalidRequest("a get of one version reads no history: ask without the version for it")
        flt = normalize_filter(metadata_filter, allowed=self._index.cfg.filter_keys).including("tenant", [tenant])
        await self._index.refuse_mismatch()
        wanted = list(dict.fromkeys(doc_ids))
        stored = await self._index.openings(wanted, tenant, content_chars, skip=offset)
        out = await self._shown(wanted, stored, tenant, flt, offset)
        if content_chars is not None and not read_far_enough(out, content_chars):
            # A doc not shown (outside the filter, being written) took a share it does not
            # show, so a doc shown was read short of where a reply cuts it: read those shown
            # again without it, and, should that fall short too (an edit in between), whole.
            shown = [f.doc_id for f in out if f.status == "found"]
            stored = await self._index.openings(shown, tenant, content_chars, skip=offset)
            again = {f.doc_id: f for f in await self._shown(shown, stored, tenant, flt, offset)}
            out = [again.get(f.doc_id, f) for f in out]
            if not read_far_enough(out, content_chars):
                stored = await self._index.openings(wanted, tenant, skip=offset)
                out = await self._shown(wanted, stored, tenant, flt, offset)
        if version is not None:
            out = [await self._of_version(f, version, tenant, flt, offset) for f in out]
        return await self._with_history(out, tenant, flt) if history else out

    async def _shown(
        self, wanted: Sequence[str], stored: Mapping[str, Opening], tenant: str, flt: TagFilter, offset: int
    ) -> list[Lookup]:
        """Each of ``wanted`` as ``stored`` shows it to the request, from character ``offset``
        (see :meth:`lookup`)."""
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
                continue
            # The text read opens where its first chunk does, or where the text before that
            # chunk does (what is put back between it and the one before).
            opens = (first.start or 0) - len(first.gap) - opening.base if opening.first else 0
            text = joined_text(opening.chunks)[max(0, offset - opens) :]
            size = None if opening.length is None else max(0, opening.length - offset)
            out.append(Lookup(doc_id, "found", opening.chunks, text, first.version, whole=opening.whole, size=size))
        return out

    async def _of_version(self, found: Lookup, version: int, tenant: str, flt: TagFilter, offset: int) -> Lookup:
        """``found`` (a doc read as current) if it is of ``version``, else that version from
        the doc's history, from character ``offset`` (see :meth:`lookup`)."""
        if found.status == "found" and found.version == version:
            return found
        kept = (await self._index.history([found.doc_id], tenant)).get(found.doc_id, [])
        for v in kept:
            if v.version == version and _admits(flt, tenant, found.doc_id, v, self._index.cfg.filter_keys):
                return Lookup(found.doc_id, "found", content=v.content[offset:], version=v.version, earlier=v)
        return found if found.status == "writing" else Lookup(found.doc_id, "not_found")

    async def _with_history(self, found: list[Lookup], tenant: str, flt: TagFilter) -> list[Lookup]:
        """``found`` with each document's earlier versions that the request may see: those
        the filter admits (by their own metadata) and older than the version read as current."""
        docs = {f.doc_id: f.version or 0 for f in found if f.status == "found" and f.chunks[0].kind == "document"}
        earlier = await self._index.history(list(docs), tenant, current=docs)
        keys = self._index.cfg.filter_keys

        def shown(doc_id: str, v: Version) -> bool:
            return _admits(flt, tenant, doc_id, v, keys)

        return [
            dataclasses.replace(f, history=tuple(v for v in earlier[f.doc_id] if shown(f.doc_id, v)))
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


def water_level(sizes: Sequence[int], chars: int) -> int:
    """The most characters each of ``sizes`` can keep when ``chars`` are shared among them:
    one that holds fewer keeps all of its own, and the others share what it leaves (pure).
    ``chars`` when all of them fit. ``ChunkIndex.openings`` reads by the same rule."""
    left = chars
    for k, size in enumerate(sorted(sizes)):
        sharing = len(sizes) - k
        if size * sharing > left:
            return -(-left // sharing)
        left -= size
    return chars


def read_far_enough(found: Sequence[Lookup], chars: int) -> bool:
    """Whether each doc of ``found`` read short holds more characters than a reply of
    ``chars`` bytes keeps of the docs it shows (``water_level`` of theirs), so the reply
    cuts it where a whole read would be cut (pure)."""
    shown = [f for f in found if f.status == "found"]
    level = water_level([len(f.content) if f.size is None else f.size for f in shown], chars)
    return all(f.whole or len(f.content) > level for f in shown)


def _admits(flt: TagFilter, tenant: str, doc_id: str, v: Version, keys: Sequence[str]) -> bool:
    """Whether the filter admits an earlier version of ``doc_id``, by its own metadata and source."""
    tags = {**tag_values(v.metadata, keys), "tenant": tenant, "doc_id": doc_id, "kind": "document"}
    return flt.matches(tags | {"source": v.source})


#: Pages of chunks a ``recent`` read goes through at most, for turns it may not show
#: (another filter's, being forgotten): past these it answers with what it found.
_RECENT_PAGES = 20


def _turn_order(item: Lookup) -> tuple[float, str, int]:
    """A looked-up turn's place in time: its timestamp, then its session and turn number."""
    first = item.chunks[0]
    ref = parse_turn(item.doc_id)
    return (first.timestamp or 0.0, ref.session if ref is not None else "", ref.turn if ref is not None else 0)
