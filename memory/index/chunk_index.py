"""``ChunkIndex``: the index's parts, one protocol per module, joined into one object."""

from __future__ import annotations

from memory.index.browsing import _Browsing
from memory.index.copying import _Copying
from memory.index.listings import _Listings
from memory.index.reuse import _Reuse
from memory.index.search import _Search
from memory.index.turns import _Turns
from memory.index.versioned import _VersionedWrites


class ChunkIndex(_VersionedWrites, _Turns, _Copying, _Listings, _Browsing, _Search, _Reuse):
    """Chunks of every document in one RediSearch index, plus per-doc version bookkeeping.

    The index is generational (``memory.generations``): by default this object follows the
    active generation (writes go to it, searches go through the alias ``cfg.name``); with
    ``generation`` it is pinned to one generation (what a reindex builds). Key layout under
    a generation's root ``<name>:g<N>:`` (``memory.keys``): ``chunk:<tenant>:<chunk_id>``
    hashes (indexed), ``ver:<tenant>:<doc_id>`` the last applied version (kept after a
    delete, as a tombstone, so an older upsert can never resurrect the doc),
    ``doc:<tenant>:<doc_id>`` the set of its chunk ids.

    Its parts: ``lifecycle`` (creation, adoption, the generation followed), ``versioned``
    and ``sliced`` (writes), ``turns`` (transcript turns), ``copying`` and ``listings``
    (for reindex and forget), ``browsing`` (the explorer's pages), ``search`` (the legs),
    ``reuse`` (vectors found by what was embedded); ``codec`` says what a chunk hash holds.
    """
