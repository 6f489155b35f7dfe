"""The entity graph in Redis: per-document contributions, applied atomically, the community
map; its ``summaries`` are the community summaries' records (``graph.summary_records``), and
it is the façade over the stale-summary queue (``graph.stale_queue``), the claims and
leases (``graph.leases``); a recompute's result is written by its ``community_writes``
(``graph.community_writes``).

Every document's contribution (its entities, their chunk ids, its co-occurrence edge
weights; ``graph.contribution``) is stored as one JSON value. Applying a change is one Lua
script: subtract the old contribution, add the new one, and mark stale every community of
every touched entity (old and new). Integer weights make the result exact after any
sequence of edits, and a node disappears with the last document that mentions it. All keys
share one hash tag, so the script (``graph/lua/apply.lua``) also runs on Redis Cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aredis
import structlog

from graph import scripts
from graph.communities import Community
from graph.community_writes import CommunityWrites
from graph.contribution import Contribution, ContributionResult
from graph.errors import LeaseLost
from graph.leases import Leases, claim_value
from graph.stale_queue import StaleItem, StaleQueue
from graph.summary_records import SummaryRecords
from memory import keys
from memory.index import translate_errors
from memory.records import DEFAULT_TENANT
from memory.schema import as_str
from memory.tenants import Erasure

__all__ = ["EDGE_SEP", "GraphStore", "LeaseLost", "StaleItem"]

#: Bytes of a contribution read for its version: ``Contribution.to_json`` writes it first, and a
#: delete's tombstone (encoded by the apply script, in any key order) is shorter than this.
_VERSION_HEAD = 256
_HEAD_VERSION = re.compile(r'^\{"v":(?:null|"(\d+)")[,}]')
_UNREAD = object()


def head_version(head: str) -> object:
    """The version (a decimal string, or None) a contribution's first ``_VERSION_HEAD`` bytes
    name; ``_UNREAD`` where they do not (the caller reads it whole)."""
    if (found := _HEAD_VERSION.match(head)) is not None:
        return found.group(1)
    if len(head) < _VERSION_HEAD:  # the whole value: a tombstone, in whatever key order
        with contextlib.suppress(ValueError):
            value = json.loads(head)
            if isinstance(value, dict):
                return value.get("v")
    return _UNREAD


log = structlog.get_logger()


def _parse_graph(
    nodes_raw: dict[Any, Any], edges_raw: dict[Any, Any]
) -> tuple[dict[str, tuple[str, str]], list[tuple[str, str, int]]]:
    nodes = {as_str(k): tuple(json.loads(v)) for k, v in nodes_raw.items()}
    edges = []
    for f, w in edges_raw.items():
        a, b = as_str(f).split(EDGE_SEP)
        edges.append((a, b, int(w)))
    return nodes, sorted(edges)


EDGE_SEP = "\x1f"

# Up to this many entities, chunk ids and edges (Contribution.size), a contribution's JSON is
# encoded on the event loop (~2 ms at 6,500: 500 entities of 8 chunk ids, 2,000 edges; measured);
# larger ones in a thread.
_INLINE_JSON_ITEMS = 6_000


class GraphStore:
    """Redis-backed graph, communities and stale queue of one index."""

    def __init__(self, *, client: aredis.Redis, name: str, tenant: str = DEFAULT_TENANT) -> None:
        self._r = client
        self.tenant = tenant
        # One hash tag per (index, tenant): a tenant's graph never shares a key with another's.
        self.prefix = keys.graph_prefix(name, tenant)
        self._erased_key = keys.erased_key(name)
        self._apply = client.register_script(scripts.APPLY)
        self.summaries = SummaryRecords(client=client, prefix=self.prefix)
        self.community_writes = CommunityWrites(client=client, prefix=self.prefix)
        self._stale = StaleQueue(client=client, prefix=self.prefix)
        self._leases = Leases(client=client, prefix=self.prefix)

    def _k(self, suffix: str) -> str:
        return keys.graph_key(self.prefix, suffix)

    async def erased(self) -> bool:
        """Whether this graph's tenant is erased now (``memory.tenants``): nothing of it may be written."""
        async with translate_errors("tenant read"):
            raw = await self._r.hget(self._erased_key, self.tenant)
        return raw is not None and not Erasure.from_json(raw).restored

    async def apply(
        self,
        doc_id: str,
        version: int | None,
        contrib: Contribution | None,
        *,
        now: float | None = None,
        refresh: bool = False,
    ) -> ContributionResult:
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
        applied, touched, marked, withdraw = (int(res[0]), *(json.loads(r) for r in res[1:4]))
        # cjson encodes an empty Lua table as {}: normalize to lists.
        return ContributionResult(bool(applied), list(touched or []), sorted(marked or []), sorted(withdraw or []))

    async def doc_ids(self) -> list[str]:
        """Every doc with a contribution in this graph."""
        head = len(self._k("contrib:"))
        async with translate_errors("graph doc listing"):
            return sorted(
                {as_str(k)[head:] async for k in self._r.scan_iter(match=f"{self._k('contrib:')}*", count=1000)}
            )

    async def doc_ids_under(self, prefix: str) -> set[str]:
        """Every doc with a contribution in this graph whose id starts with ``prefix``."""
        await self._fill_doc_list()
        low = b"[" + prefix.encode()
        async with translate_errors("graph doc listing"):
            # Past every id under the prefix: 0xff starts no UTF-8 sequence.
            found = {as_str(d) for d in await self._r.zrangebylex(self._k("docs"), low, low + b"\xff")}
        return found - {_LISTED}

    async def _fill_doc_list(self) -> None:
        """Fill the id list from the contributions if it does not say it holds them all: graphs
        written before it existed (the apply script keeps it since). The mark is a member of the
        list itself, so a list lost or restored without it is filled again. A tombstone listed
        too is harmless: its forget deletes nothing."""
        async with translate_errors("graph doc listing"):
            if await self._r.zscore(self._k("docs"), _LISTED) is not None:
                return
        ids = await self.doc_ids()
        async with translate_errors("graph doc listing"):
            for i in range(0, len(ids), 1000):
                await self._r.zadd(self._k("docs"), dict.fromkeys(ids[i : i + 1000], 0))
            await self._r.zadd(self._k("docs"), {_LISTED: 0})

    async def contribution_versions(self, doc_ids: Sequence[str]) -> dict[str, int | None]:
        """The version of each doc's stored contribution (None: unversioned); docs without one are left out.

        Only the head of each is read where it names the version (``head_version``): a large
        document's contribution is megabytes of entities, too much to parse on the event loop
        for each summary of its communities."""
        async with translate_errors("graph read"), self._r.pipeline(transaction=False) as pipe:
            for d in doc_ids:
                pipe.getrange(self._k(f"contrib:{d}"), 0, _VERSION_HEAD - 1)
            heads = await pipe.execute()
        out: dict[str, int | None] = {}
        for d, head in zip(doc_ids, heads, strict=True):
            if not head:
                continue  # no contribution (GETRANGE of a missing key is empty)
            found = head_version(as_str(head))
            if found is _UNREAD:
                async with translate_errors("graph read"):
                    whole = await self._r.get(self._k(f"contrib:{d}"))
                if whole is None:
                    continue
                found = json.loads(whole).get("v")
            out[d] = None if found is None else int(str(found))
        return out

    async def contribution(self, doc_id: str) -> dict[str, Any] | None:
        """The stored contribution of one doc (its JSON form, see ``Contribution.to_json``), if any."""
        async with translate_errors("graph read"):
            raw = await self._r.get(self._k(f"contrib:{doc_id}"))
        return None if raw is None else dict(json.loads(raw))

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

    async def named(self, communities: Sequence[Community]) -> list[Community]:
        """The communities with a member some document still names, in order: one whose every
        member was deleted or forgotten lasts until the next recompute, and is shown nowhere."""
        keys = sorted({m for c in communities for m in c.members})
        live: set[str] = set()
        for start in range(0, len(keys), 10_000):
            live |= set(await self.nodes(keys[start : start + 10_000]))
        return [c for c in communities if not live.isdisjoint(c.members)]

    async def chunks_of_each(self, keys: Sequence[str]) -> dict[str, list[str]]:
        """Each entity's chunk ids (sorted), in one round trip."""
        async with translate_errors("graph read"), self._r.pipeline(transaction=False) as pipe:
            for k in keys:
                pipe.smembers(self._k(f"ent_chunks:{k}"))
            found = await pipe.execute()
        return {k: sorted(as_str(c) for c in ids) for k, ids in zip(keys, found, strict=True)}

    async def entity_docs(self, key: str) -> set[str]:
        """Doc ids mentioning an entity."""
        async with translate_errors("graph read"):
            return {as_str(d) for d in await self._r.smembers(self._k(f"ent_docs:{key}"))}

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
        return sorted((_community(as_str(cid), v) for cid, v in raw.items()), key=lambda c: (c.level, c.id))

    async def community(self, cid: str) -> Community | None:
        """One current community, or None when it does not exist (any more).

        Why not ``communities()``: a summary needs one, and reading and parsing all of them
        for each summary cost ~19 ms of event-loop time per summary at 3,000 communities
        (measured here), through a whole post-recompute backlog of summaries.
        """
        async with translate_errors("graph read"):
            raw = await self._r.hget(self._k("comms"), cid)
        return None if raw is None else _community(cid, raw)

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

    # The stale queue and the leases, each in its own module; the store is their one façade.

    async def due(self, now: float, limit: int) -> list[str]:
        """Stale community ids whose score (first mark, or retry time) is at or before ``now``."""
        return await self._stale.due(now, limit)

    async def failures(self, cid: str) -> int:
        """Failed summary attempts of a community since its last success."""
        return await self._stale.failures(cid)

    async def stale(self, limit: int = 100) -> tuple[int, list[StaleItem]]:
        """Queue depth and the oldest ``limit`` stale communities, oldest first (see StaleQueue.stale)."""
        return await self._stale.stale(limit)

    async def failing(self) -> list[tuple[str, int, str]]:
        """Communities whose summaries failed since the last success (see StaleQueue.failing)."""
        return await self._stale.failing()

    async def is_stale(self, cids: Sequence[str]) -> dict[str, bool]:
        """Whether each community's summary is stale right now."""
        return await self._stale.is_stale(cids)

    async def mark_count(self, cid: str) -> str:
        """How many times a community has been marked (a claim remembers it)."""
        return await self._stale.mark_count(cid)

    async def mark(self, cids: Sequence[str], *, now: float | None = None) -> tuple[int, int]:
        """Mark communities stale at an operator's request; returns how many, and how many of
        them were queued already (see StaleQueue.mark)."""
        return await self._stale.mark(cids, time.time() if now is None else now)

    async def clear_if_unchanged(self, cid: str, gen: str) -> bool:
        """Clear the stale mark unless the community was marked again since ``gen``."""
        return await self._stale.clear_if_unchanged(cid, gen)

    async def record_failure(self, cid: str, retry_at: float, owner: str, token: int, error: str = "") -> int:
        """Count a failed summary (``error``: why, kept until a summary succeeds) and defer the
        community until ``retry_at``; returns attempts.

        Only while the community is still queued and no other claim than ``owner``/``token``
        holds it (see StaleQueue.record_failure).
        """
        return await self._stale.record_failure(cid, retry_at, claim_value(owner, token), error)

    async def claim(self, cid: str, owner: str, ttl_s: float, *, now: float | None = None) -> int | None:
        """A short lease on summarizing one community that is due, so daemons never duplicate work.

        Returns:
            The lease's fencing token (larger for every later claim, cluster-wide), or
            ``None`` when another worker holds the community or it is not due any more.
        """
        return await self._leases.claim(cid, owner, ttl_s, now=now)

    async def release(self, cid: str, owner: str, token: int) -> None:
        """Give a claim back, if it is still this lease (an expired one may be another's now)."""
        await self._leases.release(cid, owner, token)

    async def fence(self) -> int:
        """A new fencing token (for writes of community chunks outside a claim)."""
        return await self._leases.fence()

    async def lock(self, name: str, owner: str, ttl_s: float) -> str | None:
        """A named singleton lease (community recompute): its value, or ``None`` when held."""
        return await self._leases.lock(name, owner, ttl_s)

    async def renew(self, name: str, lease: str, ttl_s: float) -> bool:
        """Extend a lease that is still ours; false when it expired (and may be another's)."""
        return await self._leases.renew(name, lease, ttl_s)

    async def unlock(self, name: str, lease: str) -> None:
        """Release a lease that is still ours (one atomic compare-and-delete)."""
        await self._leases.unlock(name, lease)


def _community(cid: str, raw: bytes | str) -> Community:
    d = json.loads(raw)
    return Community(id=cid, level=d["level"], members=frozenset(d["members"]), parent=d["parent"])


#: The member of the doc id list that says it holds every doc (doc ids hold no NUL).
_LISTED = "\x00listed"
