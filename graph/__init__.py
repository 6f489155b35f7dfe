"""GraphRAG layer: entities and relations, Leiden communities, stale marks and summaries.
Imports nothing above it but ``memory``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memory.imports import lazy_exports

if TYPE_CHECKING:
    from graph.communities import Community
    from graph.compute import CommunityComputer, Offload, in_thread
    from graph.config import GraphConfig
    from graph.ner import SpacyNer
    from graph.recompute import COMMUNITY_TOMBSTONE_S
    from graph.search import ScopedSearch
    from graph.service import GraphService
    from graph.stale_queue import StaleItem
    from graph.tenants import TenantGraphs

# Names load on first use: the settings read ``GraphConfig`` without loading spaCy or cdlib.
_HOMES: dict[str, str] = {
    "COMMUNITY_TOMBSTONE_S": "graph.recompute",
    "Community": "graph.communities",
    "CommunityComputer": "graph.compute",
    "GraphConfig": "graph.config",
    "GraphService": "graph.service",
    "Offload": "graph.compute",
    "ScopedSearch": "graph.search",
    "SpacyNer": "graph.ner",
    "StaleItem": "graph.stale_queue",
    "TenantGraphs": "graph.tenants",
    "in_thread": "graph.compute",
}


__getattr__ = lazy_exports(__name__, _HOMES, globals())


__all__ = [
    "COMMUNITY_TOMBSTONE_S",
    "Community",
    "CommunityComputer",
    "GraphConfig",
    "GraphService",
    "Offload",
    "ScopedSearch",
    "SpacyNer",
    "StaleItem",
    "TenantGraphs",
    "in_thread",
]
