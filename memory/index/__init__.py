"""Redis I/O for chunks: index creation, versioned writes, and the two search legs.

Every redis exception is translated here (``memory.index.errors``); none leaves ``memory/``.
This package is the façade: import from ``memory.index``, not from its modules. The key
layout is ``memory.keys``.
"""

from memory.index.browsing import MAX_PAGE, ChunkPage, Group, PageKey, next_key
from memory.index.chunk_index import ChunkIndex
from memory.index.codec import Analysis, TurnEntry, analyze, analyze_records, turn_terms
from memory.index.codec import _record_mapping as _record_mapping  # private: patch it in memory.index.codec
from memory.index.copying import DocState
from memory.index.errors import IndexError_, QuerySyntaxError, WriteInProgress, raise_if_lost, translate_errors
from memory.index.errors import _translated as _translated  # private: the translation table's tests use it
from memory.index.hits import LegHit
from memory.index.lifecycle import redis_now
from memory.index.listings import BULK_QUERY_TIMEOUT_MS
from memory.index.registry import GenerationRegistry
from memory.index.reuse import vector_key
from memory.index.turns import Opening
from memory.index.versioned import UNVERSIONED_TOMBSTONE

__all__ = [
    "BULK_QUERY_TIMEOUT_MS",
    "MAX_PAGE",
    "UNVERSIONED_TOMBSTONE",
    "Analysis",
    "ChunkIndex",
    "ChunkPage",
    "DocState",
    "GenerationRegistry",
    "Group",
    "IndexError_",
    "LegHit",
    "Opening",
    "PageKey",
    "QuerySyntaxError",
    "TurnEntry",
    "WriteInProgress",
    "analyze",
    "analyze_records",
    "next_key",
    "raise_if_lost",
    "redis_now",
    "translate_errors",
    "turn_terms",
    "vector_key",
]
