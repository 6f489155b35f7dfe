"""Query texts that crash the embedding worker, shared by every daemon through Redis.

A query that crashes the worker twice, the second time alone, is refused from then on by the
daemon that found it (``SentenceTransformerEmbedder``). Asked again of the group, it may land
on another daemon, whose worker it would crash twice more (each crash an outage of that
daemon's queries while the worker restarts). So the digests are also kept in Redis, and every
daemon's sync loop (``sync``) pushes what its embedder found and learns what the others did.
"""

from __future__ import annotations

import time
from typing import Protocol

import redis.asyncio as aredis

from memory.index import translate_errors
from memory.keys import poison_key, poison_version_key
from memory.schema import as_str


class PoisonHolder(Protocol):
    """What the sync needs of an embedder: its refused digests, and a way to add more."""

    def poison_digests(self) -> set[str]:
        """Digests of the query texts this embedder refuses (each crashed its worker)."""
        ...

    def learn_poison(self, digests: set[str]) -> None:
        """Refuse these query digests too (found by another daemon of the group)."""
        ...


class SharedPoison:
    """The group's refused query digests: a sorted set by when each was found, capped."""

    def __init__(self, *, client: aredis.Redis, name: str, limit: int) -> None:
        self._r = client
        self._key = poison_key(name)
        self._version_key = poison_version_key(name)
        self._limit = limit
        self._seen_version: int | None = None
        self._known: set[str] = set()  # what the group holds, as last read plus what this daemon added

    async def add(self, digests: set[str]) -> None:
        """Record digests found by this daemon (the oldest beyond the cap are dropped)."""
        if not digests:
            return
        now = time.time()
        async with translate_errors("poison list"), self._r.pipeline(transaction=True) as pipe:
            pipe.zadd(self._key, dict.fromkeys(digests, now))
            pipe.zremrangebyrank(self._key, 0, -(self._limit + 1))
            pipe.incr(self._version_key)
            await pipe.execute()

    async def changed_digests(self) -> set[str] | None:
        """Every shared digest if the list changed since the last call, else None (one GET)."""
        async with translate_errors("poison list"):
            raw = await self._r.get(self._version_key)
            version = int(raw) if raw is not None else 0
            if version == self._seen_version:
                return None
            members = await self._r.zrange(self._key, 0, -1)
        self._seen_version = version
        return {as_str(m) for m in members}

    async def sync(self, holder: PoisonHolder) -> tuple[int, int]:
        """Push the holder's digests the group lacks, learn the group's it lacks: (pushed, learned)."""
        shared = await self.changed_digests()
        if shared is not None:
            self._known = shared
        local = holder.poison_digests()
        missing = local - self._known
        await self.add(missing)
        self._known |= missing
        learned = self._known - local
        if learned:
            holder.learn_poison(learned)
        return len(missing), len(learned)
