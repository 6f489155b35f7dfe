"""Vectors found by what was embedded: an edit's unchanged chunks keep theirs (no model call).

Every chunk hash holds ``vkey``, a digest of the model's identity and the exact text it read
(``vector_key``); one pipelined round trip asks the index, per distinct key, for one stored
vector of the same tenant. Any chunk of the index searches see may answer, of any doc or version:
the vector depends only on the key's inputs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from memory.filters import hash_field, value_hash
from memory.index.errors import translate_errors
from memory.index.lifecycle import _Lifecycle
from memory.records import DEFAULT_TENANT
from memory.schema import as_str

#: The TAG field holding a chunk's ``vector_key``.
VECTOR_KEY_FIELD = "vkey"


def vector_key(model: str, text: str) -> str:
    """The key of the vector ``model`` (its identity, precision included) gives ``text``."""
    return hashlib.blake2b(f"{model}\x1f{text}".encode(), digest_size=16).hexdigest()


class _Reuse(_Lifecycle):
    """``stored_vectors``: the vectors already in the index for some keys."""

    async def stored_vectors(self, keys: Sequence[str], tenant: str = DEFAULT_TENANT) -> dict[str, np.ndarray]:
        """A stored vector for each key that has one in ``tenant`` (never another tenant's:
        that would tell one tenant what another stores)."""
        wanted = sorted(set(keys))
        if not wanted:
            return {}
        await self._generation()  # no generation: recovered, or NotFound, as for every read
        # The alias (or the pinned build), not the cached generation's own index: a reindex
        # may have switched and dropped that one within the cache's lifetime.
        index = self._search_name()
        tenant_field, tenant_hash = hash_field("tenant"), value_hash(tenant)
        async with translate_errors("vector lookup"), self._r.pipeline(transaction=False) as pipe:
            for key in wanted:
                pipe.execute_command(
                    "FT.SEARCH",
                    index,
                    f"@{VECTOR_KEY_FIELD}:{{{key}}} @{tenant_field}:[{tenant_hash} {tenant_hash}]",
                    "RETURN", "2", "vector", "tenant",
                    "LIMIT", "0", "1",
                    "TIMEOUT", "0",
                    "DIALECT", "2",
                )  # fmt: skip
            replies = await pipe.execute()
        out: dict[str, np.ndarray] = {}
        for key, reply in zip(wanted, replies, strict=True):
            fields = _first_hit(reply)
            vec = fields.get(b"vector")
            # The tenant hash may collide: the stored tenant itself decides.
            if vec is None or as_str(fields.get(b"tenant", b"")) != tenant or len(vec) != 4 * self._dims:
                continue
            out[key] = np.frombuffer(vec, dtype=np.float32).copy()
        return out


def _first_hit(reply: Any) -> dict[Any, Any]:
    """The returned fields of an FT.SEARCH reply's first hit, in RESP3 (a map) or RESP2 (a flat list)."""
    if isinstance(reply, dict):
        results = reply.get(b"results") or reply.get("results") or []
        if results and isinstance(results[0], dict):
            got = results[0].get(b"extra_attributes") or results[0].get("extra_attributes") or {}
            return {k.encode() if isinstance(k, str) else k: v for k, v in got.items()}
        return {}
    if isinstance(reply, list) and len(reply) >= 3 and isinstance(reply[2], list):
        flat = reply[2]
        return dict(zip(flat[::2], flat[1::2], strict=False))
    return {}
