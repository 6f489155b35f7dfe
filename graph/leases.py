"""Leases on graph work, so that daemons sharing a graph never duplicate or undo it.

Two kinds, both under the graph's hash tag:

- claims (``claim:<cid>``): a short lease on summarizing one due community, whose value
  carries a fencing token (``owner|token``) from the graph's one counter (``fence``);
- named singleton leases (``lock:<name>``, the community recompute's), whose value is
  unique to each acquisition.

Either is released or renewed only while it still holds our value: one that expired may be
someone else's now.
"""

from __future__ import annotations

import time
import uuid

import redis.asyncio as aredis

from graph import scripts
from memory import keys
from memory.index import translate_errors


def claim_value(owner: str, token: int) -> str:
    """What a claim's key holds while the claim stands (``claim.lua`` writes it)."""
    return f"{owner}|{token}"


#: The lease the community recompute holds while it computes and stores the communities.
RECOMPUTE_LOCK = "recompute"


class Leases:
    """Claims, fencing tokens and singleton leases of one graph (keys under ``prefix``)."""

    def __init__(self, *, client: aredis.Redis, prefix: str) -> None:
        self._r = client
        self._prefix = prefix
        self._claim = client.register_script(scripts.CLAIM)
        self._release = client.register_script(scripts.RELEASE)
        self._renew = client.register_script(scripts.RENEW)

    def _k(self, suffix: str) -> str:
        return keys.graph_key(self._prefix, suffix)

    async def claim(self, cid: str, owner: str, ttl_s: float, *, now: float | None = None) -> int | None:
        """A short lease on summarizing one community that is due, so daemons never duplicate work.

        Returns:
            The lease's fencing token (larger for every later claim, cluster-wide), or
            ``None`` when another worker holds the community or it is not due any more.
        """
        async with translate_errors("claim"):
            token = await self._claim(
                keys=[self._k(f"claim:{cid}")],
                args=[self._prefix, cid, owner, int(ttl_s * 1000), repr(now if now is not None else time.time())],
            )
        return int(token) or None

    async def release(self, cid: str, owner: str, token: int) -> None:
        """Give a claim back, if it is still this lease (an expired one may be another's now)."""
        async with translate_errors("claim"):
            await self._release(keys=[self._k(f"claim:{cid}")], args=[claim_value(owner, token)])

    async def fence(self) -> int:
        """A new fencing token (for writes of community chunks outside a claim)."""
        async with translate_errors("claim"):
            return int(await self._r.incr(self._k("fence")))

    async def lock(self, name: str, owner: str, ttl_s: float) -> str | None:
        """A named singleton lease (community recompute): its value, or ``None`` when held.

        The value is unique to this acquisition, so that neither another daemon nor another
        task of this one can release, renew or commit under a lease that expired and was
        taken again.
        """
        lease = f"{owner}|{uuid.uuid4().hex[:12]}"
        async with translate_errors("lock"):
            taken = await self._r.set(keys.graph_lock_key(self._prefix, name), lease, nx=True, px=int(ttl_s * 1000))
        return lease if taken else None

    async def renew(self, name: str, lease: str, ttl_s: float) -> bool:
        """Extend a lease that is still ours; false when it expired (and may be another's)."""
        async with translate_errors("lock"):
            return bool(
                await self._renew(keys=[keys.graph_lock_key(self._prefix, name)], args=[lease, int(ttl_s * 1000)])
            )

    async def unlock(self, name: str, lease: str) -> None:
        """Release a lease that is still ours (one atomic compare-and-delete)."""
        async with translate_errors("lock"):
            await self._release(keys=[keys.graph_lock_key(self._prefix, name)], args=[lease])
