"""GraphRAG layer: entities and relations, Leiden communities, stale marks and summaries."""

__all__: list[str] = []
