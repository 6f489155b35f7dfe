"""Writing a recompute's communities: the map, the entity index, the stale marks of the new and
changed ones, and the removed ones' state, in one transaction under the recompute's lease."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aredis
import redis.exceptions as rexc

from graph.communities import Community
from graph.errors import LeaseLost
from graph.leases import RECOMPUTE_LOCK
from memory import keys
from memory.index import raise_if_lost, translate_errors
from memory.schema import as_str

#: Tries to store a recompute's result while the lease is renewed under it.
_LEASE_RETRIES = 5


class CommunityWrites:
    """Writes a recompute's result into one graph (``GraphStore.community_writes``)."""

    def __init__(self, *, client: aredis.Redis, prefix: str) -> None:
        self._r = client
        self._prefix = prefix

    def _k(self, suffix: str) -> str:
        return keys.graph_key(self._prefix, suffix)

    async def replace(
        self,
        communities: Sequence[Community],
        *,
        changed: set[str],
        removed: set[str],
        events: list[dict[str, Any]],
        drift_seen: int,
        now: float,
        lease: str | None = None,
    ) -> None:
        """Store a recompute's result atomically and mark new/changed communities stale.

        With ``lease`` (the recompute lock's value), only while the lease still holds: a
        recompute that outlived its lease was computed from communities another daemon may
        have replaced since, and would drop that daemon's new ids from the removals.

        Raises:
            LeaseLost: the lease expired or was taken by another recompute; nothing written.
        """
        ent_comm: dict[str, list[str]] = {}
        for c in communities:
            for m in c.members:
                ent_comm.setdefault(m, []).append(c.id)
        # Generations come from the fencing counter (see lua/apply.lua): reserved here, in one step.
        async with translate_errors("community write"):
            top = int(await self._r.incrby(self._k("fence"), len(changed))) if changed else 0
        gens = {cid: top - i for i, cid in enumerate(sorted(changed))}
        lock_key = keys.graph_lock_key(self._prefix, RECOMPUTE_LOCK)
        # The renewal of our own lease (its expiry set again) also aborts a transaction that
        # watches the lock: then the lease is read again, and the result stored while it holds.
        for _ in range(_LEASE_RETRIES):
            async with translate_errors("community write"), self._r.pipeline(transaction=True) as pipe:
                if lease is not None:
                    await pipe.watch(lock_key)
                    if as_str(await pipe.get(lock_key) or b"") != lease:
                        raise LeaseLost("the recompute lease expired before its result was stored")
                    pipe.multi()  # type: ignore[no-untyped-call]
                self._queue(pipe, communities, ent_comm, changed, removed, events, gens, drift_seen, now)
                try:
                    await pipe.execute()
                    return
                except rexc.WatchError as exc:
                    raise_if_lost(exc, "community write")
        raise LeaseLost("the recompute lease kept changing while its result was stored")

    def _queue(
        self,
        pipe: Any,
        communities: Sequence[Community],
        ent_comm: dict[str, list[str]],
        changed: set[str],
        removed: set[str],
        events: list[dict[str, Any]],
        gens: dict[str, int],
        drift_seen: int,
        now: float,
    ) -> None:
        """The transaction's commands (see :meth:`replace`)."""
        pipe.delete(self._k("comms"), self._k("ent_comm"))
        if communities:
            pipe.hset(
                self._k("comms"),
                mapping={
                    c.id: json.dumps(
                        {"level": c.level, "members": sorted(c.members), "parent": c.parent, "updated_at": now}
                    )
                    for c in communities
                },
            )
        if ent_comm:
            pipe.hset(self._k("ent_comm"), mapping={k: json.dumps(sorted(v)) for k, v in ent_comm.items()})
        # A removed community's summary chunk is deleted from the index after this
        # transaction; until that succeeds its id waits here (see pending_drops).
        if removed:
            pipe.sadd(self._k("pending_drop"), *sorted(removed))
        if communities:
            pipe.srem(self._k("pending_drop"), *sorted(c.id for c in communities))
        for cid in removed:
            pipe.hdel(self._k("stale"), cid)
            pipe.zrem(self._k("stale_q"), cid)
            pipe.zrem(self._k("stale_first"), cid)
            pipe.delete(self._k(f"stale_docs:{cid}"), self._k(f"summary:{cid}"))
            # A writer of the removed community's summary cannot commit (the community is
            # gone) and its chunk write is refused by the drop's later token: no need to
            # keep its fencing token.
            pipe.hdel(self._k("summary_token"), cid)
            pipe.hdel(self._k("gen"), cid)
            pipe.hdel(self._k("failures"), cid)
            pipe.hdel(self._k("last_error"), cid)
        levels = {c.id: c.level for c in communities}
        for cid in changed:
            pipe.hsetnx(
                self._k("stale"), cid, json.dumps({"level": levels[cid], "first": now, "last": now, "count": 0})
            )
            pipe.zadd(self._k("stale_q"), {cid: now}, nx=True)
            pipe.zadd(self._k("stale_first"), {cid: now}, nx=True)
            pipe.hset(self._k("gen"), cid, gens[cid])
        pipe.decrby(self._k("drift"), drift_seen)
        pipe.set(self._k("last_recompute"), repr(now))
        for ev in events:
            pipe.lpush(self._k("events"), json.dumps({**ev, "at": now}))
        pipe.ltrim(self._k("events"), 0, 999)
