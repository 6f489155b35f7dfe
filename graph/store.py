"""The entity graph in Redis: per-document contributions, applied atomically, plus the
community map and the stale-summary queue.

Every document's contribution (its entities, their chunk ids, its co-occurrence edge
weights) is stored as one JSON value. Applying a change is one Lua script: subtract the
old contribution, add the new one, and mark stale every community of every touched
entity (old and new). Integer weights make the result exact after any sequence of edits,
and a node disappears with the last document that mentions it. All keys share one hash
tag, so the script also runs on Redis Cluster.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis
import redis.exceptions as rexc
import structlog

from graph.communities import Community
from memory.errors import MemdError
from memory.index import translate_errors
from memory.records import DEFAULT_TENANT

log = structlog.get_logger()


def _parse_graph(
    nodes_raw: dict[Any, Any], edges_raw: dict[Any, Any]
) -> tuple[dict[str, tuple[str, str]], list[tuple[str, str, int]]]:
    nodes = {_s(k): tuple(json.loads(v)) for k, v in nodes_raw.items()}
    edges = []
    for f, w in edges_raw.items():
        a, b = _s(f).split(EDGE_SEP)
        edges.append((a, b, int(w)))
    return nodes, sorted(edges)


class LeaseLost(MemdError):
    """A singleton lease (the recompute's) expired or changed hands before its work was stored."""

    code = "lease_lost"


EDGE_SEP = "\x1f"

_APPLY = r"""
local P, doc, newj, ver, now, refresh = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
local function vgt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
-- A set's members in commands of 1,000 (unpack's limit is ~8,000): one call per chunk id
-- made a doc's change cost a Lua-to-Redis call per mention.
local function members(cmd, key, list)
  for i = 1, #list, 1000 do redis.call(cmd, key, unpack(list, i, math.min(i + 999, #list))) end
end
local oldj = redis.call('GET', KEYS[1])
local old = nil
if oldj then old = cjson.decode(oldj) end
if refresh == '1' then
  -- a re-chunked doc: replaces only a live contribution of its own version (never an older or
  -- newer one, a delete's tombstone, or an unversioned one)
  if ver == '' or not old or old.v ~= ver or old.d then return {0, '[]', '[]'} end
elseif ver ~= '' and old and type(old.v) == 'string' and not vgt(ver, old.v) then
  return {0, '[]', '[]'}  -- a replay
elseif ver == '' and oldj and oldj == newj then
  return {0, '[]', '[]'}  -- an unversioned item delivered again, unchanged (at-least-once)
end
local touched, inold, innew, delta = {}, {}, {}, {}
local new = nil
if newj ~= '' then new = cjson.decode(newj) end
if old then
  for key, info in pairs(old.e) do
    touched[key] = true
    inold[key] = true
    redis.call('SREM', P .. ':ent_docs:' .. key, doc)
    members('SREM', P .. ':ent_chunks:' .. key, info[3])
    if redis.call('SCARD', P .. ':ent_docs:' .. key) == 0 then
      redis.call('HDEL', P .. ':nodes', key)
      redis.call('DEL', P .. ':ent_chunks:' .. key)
    elseif redis.call('HGET', P .. ':nodes', key) == cjson.encode({info[1], info[2]}) then
      -- this doc may have set the node's name and type: take them from its new version if it
      -- still mentions the entity, else from a document that still does, so they are never
      -- ones no document states
      local oi = new and new.e[key]
      if not oi then
        local other = redis.call('GET', P .. ':contrib:' .. redis.call('SRANDMEMBER', P .. ':ent_docs:' .. key))
        oi = other and cjson.decode(other).e[key]
      end
      if oi then redis.call('HSET', P .. ':nodes', key, cjson.encode({oi[1], oi[2]})) end
    end
  end
  for _, e in ipairs(old.x) do
    local f = e[1] .. '\31' .. e[2]
    delta[f] = (delta[f] or 0) - e[3]
    local w = redis.call('HINCRBY', P .. ':edges', f, -e[3])
    if w <= 0 then redis.call('HDEL', P .. ':edges', f) end
  end
end
if new then
  for key, info in pairs(new.e) do
    touched[key] = true
    innew[key] = true
    redis.call('HSETNX', P .. ':nodes', key, cjson.encode({info[1], info[2]}))
    redis.call('SADD', P .. ':ent_docs:' .. key, doc)
    members('SADD', P .. ':ent_chunks:' .. key, info[3])
  end
  for _, e in ipairs(new.x) do
    local f = e[1] .. '\31' .. e[2]
    delta[f] = (delta[f] or 0) + e[3]
    redis.call('HINCRBY', P .. ':edges', f, e[3])
  end
  redis.call('SET', KEYS[1], newj)
elseif ver ~= '' then
  redis.call('SET', KEYS[1], cjson.encode({v = ver, e = {}, x = {}, d = 1}))  -- a delete's tombstone
else
  redis.call('DEL', KEYS[1])
end
local drift = 0
for key, _ in pairs(touched) do
  if (inold[key] or false) ~= (innew[key] or false) then drift = drift + 1 end
end
for _, d in pairs(delta) do
  if d ~= 0 then drift = drift + 1 end
end
if drift > 0 then redis.call('INCRBY', P .. ':drift', drift) end
local marked, keys = {}, {}
for key, _ in pairs(touched) do
  table.insert(keys, key)
  local cj = redis.call('HGET', P .. ':ent_comm', key)
  if cj then
    for _, cid in ipairs(cjson.decode(cj)) do marked[cid] = true end
  end
end
local cids = {}
for cid, _ in pairs(marked) do
  table.insert(cids, cid)
  local s = redis.call('HGET', P .. ':stale', cid)
  local rec
  if s then
    rec = cjson.decode(s)
    rec.last = now
    rec.count = rec.count + 1
  else
    local c = redis.call('HGET', P .. ':comms', cid)
    local level = 0
    if c then level = cjson.decode(c).level end
    rec = {level = level, first = now, last = now, count = 1}
    redis.call('ZADD', P .. ':stale_q', now, cid)
  end
  redis.call('HSET', P .. ':stale', cid, cjson.encode(rec))
  redis.call('ZADD', P .. ':stale_first', 'NX', rec.first, cid)
  redis.call('SADD', P .. ':stale_docs:' .. cid, doc)
  -- From the one fencing counter, not a per-community count: a removed community's entry
  -- goes, and a count restarting at 1 when the same members come back would let a summary
  -- begun before the removal clear the new community's mark (it read generation 1 too).
  redis.call('HSET', P .. ':gen', cid, redis.call('INCR', P .. ':fence'))
end
return {1, cjson.encode(keys), cjson.encode(cids)}
"""

# Clear community ``cid``'s stale mark unless it was marked again since ``gen``: true when
# cleared. One Lua function, shared by the scripts that clear a mark.
_CLEAR_FN = r"""
local function clear_if_gen(P, cid, gen)
  if (redis.call('HGET', P .. ':gen', cid) or '0') ~= gen then return false end
  redis.call('HDEL', P .. ':stale', cid)
  redis.call('ZREM', P .. ':stale_q', cid)
  redis.call('ZREM', P .. ':stale_first', cid)
  redis.call('DEL', P .. ':stale_docs:' .. cid)
  redis.call('HDEL', P .. ':failures', cid)
  return true
end
"""

_CLEAR_IF_GEN = (
    _CLEAR_FN
    + r"""
if clear_if_gen(ARGV[1], ARGV[2], ARGV[3]) then return 1 end
return 0
"""
)

# A claim is taken only while the community is due (still stale, its backoff over), so a
# worker that read an old due list never redoes what another worker just finished. The
# claim's value carries a fencing token from one counter: later claims get larger tokens.
_CLAIM = r"""
local P, cid, owner, ttl, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local score = redis.call('ZSCORE', P .. ':stale_q', cid)
if not score or tonumber(score) > now then return 0 end
local token = redis.call('INCR', P .. ':fence')
if not redis.call('SET', P .. ':claim:' .. cid, owner .. '|' .. token, 'NX', 'PX', ttl) then return 0 end
return token
"""

_RECORD_FAILURE = r"""
local P, cid, retry_at = ARGV[1], ARGV[2], ARGV[3]
if not redis.call('ZSCORE', P .. ':stale_q', cid) then return 0 end
redis.call('ZADD', P .. ':stale_q', 'XX', retry_at, cid)
return redis.call('HINCRBY', P .. ':failures', cid, 1)
"""

# Delete a key only while it still holds our value (a lease that expired may be someone else's now).
_RELEASE = r"""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Extend a lease only while it is still ours.
_RENEW = r"""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

# Store a summary record only if the community still exists and no summary of a later token
# was stored; then clear the mark unless the community was marked again since ``gen``.
# Returns {written, cleared}.
_COMMIT_SUMMARY = (
    _CLEAR_FN
    + r"""
local P, cid, token, gen = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
if redis.call('HEXISTS', P .. ':comms', cid) == 0 then return {0, 0} end
local skey = P .. ':summary:' .. cid
-- The token of the last stored summary (or drop) lives apart from the record, so that a
-- drop, which deletes the record, still fences off every earlier lease.
local stored = redis.call('HGET', P .. ':summary_token', cid) or redis.call('HGET', skey, 'token')
if stored and tonumber(stored) >= token then return {0, 0} end
redis.call('HSET', P .. ':summary_token', cid, ARGV[3])
redis.call('DEL', skey)
if #ARGV > 4 then
  for i = 5, #ARGV, 2 do redis.call('HSET', skey, ARGV[i], ARGV[i + 1]) end
end
if clear_if_gen(P, cid, gen) then return {1, 1} end
return {1, 0}
"""
)


# Up to this many entities, chunk ids and edges (Contribution.size), a contribution's JSON is
# encoded on the event loop (~2 ms at 6,500: 500 entities of 8 chunk ids, 2,000 edges; measured);
# larger ones in a thread.
_INLINE_JSON_ITEMS = 6_000


@dataclass(frozen=True, slots=True)
class Contribution:
    """What one document adds to the graph."""

    entities: dict[str, tuple[str, str, list[str]]]  # key -> (name, type, chunk ids)
    edges: dict[tuple[str, str], int]

    def size(self) -> int:
        """Entities, their chunk ids and edges: what encoding it costs (an entity of a 9,400-chunk
        document carries 9,400 ids)."""
        return len(self.entities) + sum(len(c) for _, _, c in self.entities.values()) + len(self.edges)

    def to_json(self, version: int | None) -> str:
        """The stored form; versions travel as decimal strings (Lua numbers are doubles)."""
        return json.dumps(
            {
                "v": str(version) if version is not None else None,
                "e": {k: [n, t, sorted(c)] for k, (n, t, c) in sorted(self.entities.items())},
                "x": [[a, b, w] for (a, b), w in sorted(self.edges.items())],
            },
            separators=(",", ":"),
        )


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    """Whether the change applied, which entities it touched, which communities it marked."""

    applied: bool
    touched: list[str]
    marked: list[str]


@dataclass(frozen=True, slots=True)
class StaleItem:
    """One community waiting for a new summary."""

    community_id: str
    level: int
    first_marked_at: float
    last_marked_at: float
    change_count: int
    doc_ids: list[str]


class GraphStore:
    """Redis-backed graph, communities and stale queue of one index."""

    def __init__(self, *, client: aredis.Redis, name: str, tenant: str = DEFAULT_TENANT) -> None:
        self._r = client
        self.tenant = tenant
        # One hash tag per (index, tenant): a tenant's graph never shares a key with another's.
        self.prefix = "{" + f"{name}:{tenant}" + "}:g"
        self._apply = client.register_script(_APPLY)
        self._clear = client.register_script(_CLEAR_IF_GEN)
        self._claim = client.register_script(_CLAIM)
        self._release = client.register_script(_RELEASE)
        self._renew = client.register_script(_RENEW)
        self._commit = client.register_script(_COMMIT_SUMMARY)
        self._fail = client.register_script(_RECORD_FAILURE)

    def _k(self, suffix: str) -> str:
        return f"{self.prefix}:{suffix}"

    async def apply(
        self,
        doc_id: str,
        version: int | None,
        contrib: Contribution | None,
        *,
        now: float | None = None,
        refresh: bool = False,
    ) -> ApplyOutcome:
        """Replace ``doc_id``'s contribution (``None`` = delete) and mark touched communities stale.

        Versioned changes at or below the stored version are ignored (a replay), except that
        ``refresh`` replaces a contribution of the same version (the doc was re-chunked).
        """
        if contrib is None:
            newj = ""
        elif contrib.size() <= _INLINE_JSON_ITEMS:
            newj = contrib.to_json(version)
        else:
            # A capped contribution's JSON (~1 MB) took 30-65 ms to encode: not on the loop.
            newj = await asyncio.to_thread(contrib.to_json, version)
        async with translate_errors("graph apply"):
            res = await self._apply(
                keys=[self._k(f"contrib:{doc_id}")],
                args=[
                    self.prefix,
                    doc_id,
                    newj,
                    "" if version is None else str(version),
                    repr(now or time.time()),
                    "1" if refresh else "0",
                ],
            )
        applied, touched, marked = int(res[0]), json.loads(res[1]), json.loads(res[2])
        # cjson encodes an empty Lua table as {}: normalize to lists.
        return ApplyOutcome(bool(applied), list(touched or []), sorted(marked or []))

    async def doc_ids(self) -> list[str]:
        """Every doc with a contribution in this graph."""
        head = len(self._k("contrib:"))
        async with translate_errors("graph doc listing"):
            return sorted({_s(k)[head:] async for k in self._r.scan_iter(match=f"{self._k('contrib:')}*", count=1000)})

    async def graph(self) -> tuple[dict[str, tuple[str, str]], list[tuple[str, str, int]]]:
        """All nodes (key -> (name, type)) and weighted edges."""
        async with translate_errors("graph read"):
            nodes_raw = await self._r.hgetall(self._k("nodes"))
            edges_raw = await self._r.hgetall(self._k("edges"))
        # Parsed in a thread: for a graph of tens of thousands of edges it held the event loop
        # (and every query) ~0.2 s at each community recompute.
        return await asyncio.to_thread(_parse_graph, nodes_raw, edges_raw)

    async def nodes(self, keys: Sequence[str]) -> dict[str, tuple[str, str]]:
        """(name, type) of the given entity keys that exist."""
        if not keys:
            return {}
        async with translate_errors("graph read"):
            values = await self._r.hmget(self._k("nodes"), list(keys))
        return {k: tuple(json.loads(v)) for k, v in zip(keys, values, strict=True) if v is not None}

    async def due(self, now: float, limit: int) -> list[str]:
        """Stale community ids whose score (first mark, or retry time) is at or before ``now``."""
        async with translate_errors("stale read"):
            ids = await self._r.zrangebyscore(self._k("stale_q"), "-inf", now, start=0, num=limit)
        return [_s(c) for c in ids]

    async def failures(self, cid: str) -> int:
        """Failed summary attempts of a community since its last success."""
        async with translate_errors("stale read"):
            return int(await self._r.hget(self._k("failures"), cid) or 0)

    async def entity_chunks(self, keys: Sequence[str]) -> list[str]:
        """Chunk ids mentioning any of ``keys``."""
        if not keys:
            return []
        async with translate_errors("graph read"):
            return sorted(_s(c) for c in await self._r.sunion([self._k(f"ent_chunks:{k}") for k in keys]))

    async def entity_docs(self, key: str) -> set[str]:
        """Doc ids mentioning an entity."""
        async with translate_errors("graph read"):
            return {_s(d) for d in await self._r.smembers(self._k(f"ent_docs:{key}"))}

    async def drift(self) -> int:
        """Entity and edge changes since the last community recompute."""
        async with translate_errors("graph read"):
            return int(await self._r.get(self._k("drift")) or 0)

    async def last_recompute(self) -> float:
        """When communities were last recomputed (epoch seconds; 0 if never)."""
        async with translate_errors("graph read"):
            return float(await self._r.get(self._k("last_recompute")) or 0.0)

    async def communities(self) -> list[Community]:
        """The current communities."""
        async with translate_errors("graph read"):
            raw = await self._r.hgetall(self._k("comms"))
        return sorted((_community(_s(cid), v) for cid, v in raw.items()), key=lambda c: (c.level, c.id))

    async def community(self, cid: str) -> Community | None:
        """One current community, or None when it does not exist (any more).

        Why not ``communities()``: a summary needs one, and reading and parsing all of them
        for each summary cost ~19 ms of event-loop time per summary at 3,000 communities
        (measured here), through a whole post-recompute backlog of summaries.
        """
        async with translate_errors("graph read"):
            raw = await self._r.hget(self._k("comms"), cid)
        return None if raw is None else _community(cid, raw)

    async def replace_communities(
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
        # Generations come from the fencing counter (see _APPLY): reserved here, in one step.
        async with translate_errors("community write"):
            top = int(await self._r.incrby(self._k("fence"), len(changed))) if changed else 0
        gens = {cid: top - i for i, cid in enumerate(sorted(changed))}
        lock_key = self._k("lock:recompute")
        async with translate_errors("community write"), self._r.pipeline(transaction=True) as pipe:
            if lease is not None:
                await pipe.watch(lock_key)
                if _s(await pipe.get(lock_key) or b"") != lease:
                    raise LeaseLost("the recompute lease expired before its result was stored")
                pipe.multi()  # type: ignore[no-untyped-call]
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
            try:
                await pipe.execute()
            except rexc.WatchError as exc:
                raise LeaseLost("the recompute lease changed hands while its result was stored") from exc

    async def stale(self, limit: int = 100) -> tuple[int, list[StaleItem]]:
        """Queue depth and the oldest ``limit`` stale communities, oldest first.

        Ordered by when each was first marked (``stale_first``), not by the work queue's
        score: a failed summary's score is its retry time, and ordering by it would hide the
        oldest communities exactly while summaries fail.
        """
        async with translate_errors("stale read"):
            depth = int(await self._r.zcard(self._k("stale_q")))
            if depth != int(await self._r.zcard(self._k("stale_first"))):
                await self._repair_stale_first()
            cids = [_s(c) for c in await self._r.zrange(self._k("stale_first"), 0, max(limit, 1) - 1)]
            recs = await self._r.hmget(self._k("stale"), cids) if cids else []
            items = []
            for cid, rec in zip(cids, recs, strict=True):
                if rec is None:
                    continue
                d = json.loads(rec)
                docs = sorted(_s(x) for x in await self._r.smembers(self._k(f"stale_docs:{cid}")))
                items.append(
                    StaleItem(cid, int(d["level"]), float(d["first"]), float(d["last"]), int(d["count"]), docs)
                )
        return depth, items

    async def _repair_stale_first(self) -> None:
        """Rebuild the first-marked index from the queue (stores written before it existed)."""
        queued = {_s(c) for c in await self._r.zrange(self._k("stale_q"), 0, -1)}
        listed = {_s(c) for c in await self._r.zrange(self._k("stale_first"), 0, -1)}
        if listed - queued:
            await self._r.zrem(self._k("stale_first"), *sorted(listed - queued))
        missing = sorted(queued - listed)
        if missing:
            recs = await self._r.hmget(self._k("stale"), missing)
            firsts = {
                c: float(json.loads(r)["first"]) if r else time.time() for c, r in zip(missing, recs, strict=True)
            }
            await self._r.zadd(self._k("stale_first"), firsts, nx=True)

    async def is_stale(self, cids: Sequence[str]) -> dict[str, bool]:
        """Whether each community's summary is stale right now."""
        if not cids:
            return {}
        async with translate_errors("stale read"):
            scores = await self._r.zmscore(self._k("stale_q"), list(cids))
        return {c: s is not None for c, s in zip(cids, scores, strict=True)}

    async def generation(self, cid: str) -> str:
        """How many times a community has been marked (a claim remembers it)."""
        async with translate_errors("stale read"):
            return _s(await self._r.hget(self._k("gen"), cid) or b"0")

    async def clear_if_unchanged(self, cid: str, gen: str) -> bool:
        """Clear the stale mark unless the community was marked again since ``gen``."""
        async with translate_errors("stale clear"):
            return bool(await self._clear(keys=[self._k("stale")], args=[self.prefix, cid, gen]))

    async def claim(self, cid: str, owner: str, ttl_s: float, *, now: float | None = None) -> int | None:
        """A short lease on summarizing one community that is due, so daemons never duplicate work.

        Returns:
            The lease's fencing token (larger for every later claim, cluster-wide), or
            ``None`` when another worker holds the community or it is not due any more.
        """
        async with translate_errors("claim"):
            token = await self._claim(
                keys=[self._k(f"claim:{cid}")],
                args=[self.prefix, cid, owner, int(ttl_s * 1000), repr(now if now is not None else time.time())],
            )
        return int(token) or None

    async def release(self, cid: str, owner: str, token: int) -> None:
        """Give a claim back, if it is still this lease (an expired one may be another's now)."""
        async with translate_errors("claim"):
            await self._release(keys=[self._k(f"claim:{cid}")], args=[f"{owner}|{token}"])

    async def fence(self) -> int:
        """A new fencing token (for writes of community chunks outside a claim)."""
        async with translate_errors("claim"):
            return int(await self._r.incr(self._k("fence")))

    async def commit_summary(self, cid: str, token: int, gen: str, summary: dict[str, Any] | None) -> tuple[bool, bool]:
        """Store a summary record (``None``: drop it) and clear the mark, fenced by ``token``.

        Nothing is stored when the community no longer exists or a summary of a later token
        is already stored; the mark is cleared only if the community was not marked again
        since ``gen``.

        Returns:
            (written, cleared).
        """
        fields: list[str] = []
        for k, v in (summary or {}).items():
            fields += [k, json.dumps(v)]
        async with translate_errors("summary write"):
            res = await self._commit(keys=[self._k(f"summary:{cid}")], args=[self.prefix, cid, token, gen, *fields])
        return bool(int(res[0])), bool(int(res[1]))

    async def pending_drops(self) -> list[str]:
        """Removed communities whose summary chunks may still be in the index."""
        async with translate_errors("graph read"):
            return sorted(_s(c) for c in await self._r.smembers(self._k("pending_drop")))

    async def dropped(self, cid: str) -> None:
        """A removed community's summary chunk is gone from the index."""
        async with translate_errors("graph write"):
            await self._r.srem(self._k("pending_drop"), cid)

    async def record_failure(self, cid: str, retry_at: float) -> int:
        """Count a failed summary and defer the community until ``retry_at``; returns attempts.

        Only while the community is still queued: one removed or summarized meanwhile keeps
        no failure count (it would never be cleared).
        """
        async with translate_errors("stale write"):
            attempts = int(await self._fail(keys=[self._k("stale_q")], args=[self.prefix, cid, repr(retry_at)]))
            await self._r.incr(self._k("summary_failures"))
        return attempts

    async def summary(self, cid: str) -> dict[str, Any] | None:
        """A community's summary record, if written."""
        async with translate_errors("summary read"):
            raw = await self._r.hgetall(self._k(f"summary:{cid}"))
        return {_s(k): json.loads(v) for k, v in raw.items()} if raw else None

    async def lock(self, name: str, owner: str, ttl_s: float) -> str | None:
        """A named singleton lease (community recompute): its value, or ``None`` when held.

        The value is unique to this acquisition, so that neither another daemon nor another
        task of this one can release, renew or commit under a lease that expired and was
        taken again.
        """
        lease = f"{owner}|{uuid.uuid4().hex[:12]}"
        async with translate_errors("lock"):
            taken = await self._r.set(self._k(f"lock:{name}"), lease, nx=True, px=int(ttl_s * 1000))
        return lease if taken else None

    async def renew(self, name: str, lease: str, ttl_s: float) -> bool:
        """Extend a lease that is still ours; false when it expired (and may be another's)."""
        async with translate_errors("lock"):
            return bool(await self._renew(keys=[self._k(f"lock:{name}")], args=[lease, int(ttl_s * 1000)]))

    async def unlock(self, name: str, lease: str) -> None:
        """Release a lease that is still ours (one atomic compare-and-delete)."""
        async with translate_errors("lock"):
            await self._release(keys=[self._k(f"lock:{name}")], args=[lease])

    async def counter(self, name: str) -> int:
        """A graph counter (``summary_failures``, ``summaries_written``)."""
        async with translate_errors("graph read"):
            return int(await self._r.get(self._k(name)) or 0)

    async def incr(self, name: str, by: int = 1) -> None:
        """Bump a graph counter."""
        async with translate_errors("graph write"):
            await self._r.incrby(self._k(name), by)

    async def events(self, limit: int = 50) -> list[dict[str, Any]]:
        """Recent merge/split events, newest first."""
        async with translate_errors("graph read"):
            return [json.loads(e) for e in await self._r.lrange(self._k("events"), 0, limit - 1)]


def _community(cid: str, raw: bytes | str) -> Community:
    d = json.loads(raw)
    return Community(id=cid, level=d["level"], members=frozenset(d["members"]), parent=d["parent"])


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
