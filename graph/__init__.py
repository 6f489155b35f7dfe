"""GraphRAG layer (entities, Leiden communities, staleness): see issue 3; not built yet."""

__all__: list[str] = []
