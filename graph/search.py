"""Queries with a scope: chunks, community summaries, or both, through the same hybrid path."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Literal, get_args

from graph.store import GraphStore
from memory.errors import InvalidRequest
from memory.filters import FilterSpec
from memory.records import Kind
from memory.retrieval import Retriever
from memory.search_results import Lookup, SearchOutcome
from memory.search_spec import SearchSpec

Scope = Literal["chunks", "communities", "all"]

SCOPE_KINDS: dict[str, tuple[str, ...] | None] = {
    "chunks": ("document", "transcript"),
    "communities": ("community",),
    "all": None,
}


def outside_scope(flt: FilterSpec | None, scope: Scope) -> str | None:
    """Why a ``kind`` filter can match nothing in ``scope`` (every kind it names is no kind, or
    outside the scope's), or None: such a search would answer an empty list, untold why (pure)."""
    kinds = SCOPE_KINDS[scope]
    wanted = (flt or {}).get("kind")
    if wanted is None or isinstance(wanted, dict):
        return None
    named = [wanted] if isinstance(wanted, str) else list(wanted)
    every = get_args(Kind)
    if named and not any(k in every for k in named):
        listed = ", ".join(map(repr, named))
        return f"metadata_filter['kind'] names {listed}: no kind of memory (they are {', '.join(every)})"
    if kinds is None or not named or any(k in kinds for k in named):
        return None
    other = "communities" if "community" in named else "chunks"
    return (
        f"metadata_filter['kind'] names {', '.join(map(repr, named))}, outside scope {scope!r} "
        f"(its kinds: {', '.join(kinds)}): ask with scope {other!r} or 'all'"
    )


class ScopedSearch:
    """Adds the scope (as a kind filter inside the engine) and community freshness to a search."""

    def __init__(self, *, retriever: Retriever, stores: Callable[[str], GraphStore] | None) -> None:
        self._retriever = retriever
        self._stores = stores

    async def search(self, spec: SearchSpec, scope: Scope = "chunks") -> tuple[SearchOutcome, dict[str, bool]]:
        """Run the hybrid search within ``scope``.

        Returns:
            The outcome, and for each community in it whether its summary is stale now.
        """
        if (why := outside_scope(spec.metadata_filter, scope)) is not None:
            raise InvalidRequest(why)
        outcome = await self._retriever.search(dataclasses.replace(spec, kinds=SCOPE_KINDS[scope]))
        cids = [str(h.chunk.metadata.get("community_id")) for h in outcome.hits if h.chunk.kind == "community"]
        stale = await self._stores(spec.tenant).is_stale(cids) if self._stores is not None and cids else {}
        return outcome, stale

    async def lookup(
        self,
        doc_ids: Sequence[str],
        *,
        tenant: str,
        metadata_filter: FilterSpec | None = None,
        history: bool = False,
        content_chars: int | None = None,
        offset: int = 0,
        version: int | None = None,
    ) -> list[Lookup]:
        """Memories by id (``Lookups.lookup``)."""
        return await self._retriever.lookups.lookup(
            doc_ids,
            tenant=tenant,
            metadata_filter=metadata_filter,
            history=history,
            content_chars=content_chars,
            offset=offset,
            version=version,
        )

    async def recent(
        self,
        agent_id: str,
        session_id: str | None = None,
        *,
        tenant: str,
        limit: int = 20,
        metadata_filter: FilterSpec | None = None,
    ) -> list[Lookup]:
        """An agent's latest turns, oldest first (``Lookups.recent``)."""
        return await self._retriever.lookups.recent(
            agent_id, session_id, tenant=tenant, limit=limit, metadata_filter=metadata_filter
        )

    async def list_values(
        self, *, tenant: str, field: str, source_prefix: str = "", limit: int = 100, offset: int = 0
    ) -> list[str]:
        """Distinct doc ids or sources of the tenant's documents (``Lookups.list_values``)."""
        return await self._retriever.lookups.list_values(
            tenant=tenant, field=field, source_prefix=source_prefix, limit=limit, offset=offset
        )
