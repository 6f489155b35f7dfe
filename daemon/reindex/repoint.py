"""Re-pointing the graph after a chunking or model change (the graph is shared, not per generation)."""

from __future__ import annotations

from typing import Any

import structlog

from daemon.settings import Settings
from memory.index import ChunkIndex

log = structlog.get_logger()


async def repoint_graph(settings: Settings, redis: Any, target: ChunkIndex, embedder: Any = None) -> int:
    """After a chunking change, every tenant's graph re-extracted from the new chunks: its
    entities' chunk references and co-occurrence edges would otherwise name the old ones.
    Every tenant is tried even if one fails; the first failure is raised at the end."""
    from daemon.components import build_graph, load_ner

    ner = await load_ner(settings)
    try:
        registry = build_graph(settings, redis=redis, index=target, embedder=embedder, ner=ner)
        done, failure = 0, None
        for tenant in await registry.tenants():
            try:
                done += await registry.service(tenant).repoint(target)
            except Exception as exc:
                log.error("reindex.graph_repoint_tenant_failed", tenant=tenant, error=str(exc))
                failure = failure or exc
        if failure is not None:
            raise failure
        return done
    finally:
        if ner is not None:
            ner.close()
