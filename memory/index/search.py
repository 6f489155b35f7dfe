"""The search legs: BM25 over analyzed terms and HNSW KNN, both refused on a mismatched index."""

from __future__ import annotations

import numpy as np
from redis.commands.search.query import Query

from memory.index.codec import _stored
from memory.index.errors import translate_errors
from memory.index.lifecycle import _Lifecycle
from memory.records import StoredChunk


class _Search(_Lifecycle):
    """``search_text`` and ``search_vector``."""

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
