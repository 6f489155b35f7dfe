"""The stale-summary queue of one graph: which communities wait for a new summary.

A community is marked stale when a document change touches one of its entities (the apply
script), a recompute creates or changes it (``CommunityWrites.replace``), or an
operator asks for new summaries (``StaleQueue.mark``, after switching the summarizer). Its keys,
all under the graph's hash tag:

- ``stale_q``: the work queue, scored by first mark or, after a failure, the retry time; a
  community with a summary that a document change marked goes before the others
  (``lua/queue_fn.lua``): its summary may now be wrong, while a community a recompute created
  has none yet (one it regrouped keeps its summary and waits its turn);
- ``stale_first``: the same ids scored by first mark (what ``stale`` lists, oldest first);
- ``stale``: per community, its level, first and last mark, change count and whether an
  operator asked;
- ``stale_docs:<cid>``: the docs whose changes marked it;
- ``gen``: per community, the fencing counter's value at its last mark (a summary clears the
  mark only if it read the same);
- ``failures``: failed summary attempts since the last success, and ``last_error`` the last one's why.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis

from graph import scripts
from memory import keys
from memory.index import translate_errors
from memory.schema import as_str


@dataclass(frozen=True, slots=True)
class StaleItem:
    """One community waiting for a new summary."""

    community_id: str
    level: int
    first_marked_at: float
    last_marked_at: float
    change_count: int
    doc_ids: list[str]
    attempts: int = 0  # failed summaries since it was marked
    last_error: str = ""  # why the last one failed
    retry_at: float | None = None  # after a failure: when it is due again
    claimed: bool = False  # a worker holds it now (or one that died, until its claim expires)
    asked: bool = False  # an operator asked for a new summary (``agentmemd graph resummarize``)
    ahead: bool = False  # a document change touched it while it had a summary: it goes first

    def cause(self, limit: int = 5) -> str:
        """What marked it, for a person: the docs whose changes did, else an operator's
        request, else the recompute that made it (a new or regrouped community, never
        summarized as it is)."""
        return ", ".join(self.doc_ids[:limit]) or (ASKED_CAUSE if self.asked else RECOMPUTE_CAUSE)

    def state(self, now: float) -> str:
        """Where its summary stands, for a person: being written, failing (how often, why, when
        it is tried again) or waiting its turn."""
        if self.attempts:
            again = f", again in {max(0.0, self.retry_at - now):.0f}s" if self.retry_at is not None else ""
            failed = f"failed {self.attempts}x{again}: {self.last_error or '?'}"
            return ("being written; " if self.claimed else "") + failed
        if self.claimed:
            return "being written (or held by a worker that died, until its claim expires)"
        if self.ahead:
            return "waiting, ahead of unsummarized communities (an edit may have made its summary wrong)"
        return "waiting"


#: The longest reason of a failed summary kept (a provider's error can quote a whole prompt).
MAX_ERROR_CHARS = 500

#: A stale community no document change marked: a recompute made it.
RECOMPUTE_CAUSE = "a recompute (new or regrouped)"

#: A stale community an operator marked.
ASKED_CAUSE = "asked (graph resummarize)"


class StaleQueue:
    """Reads and clears the stale marks of one graph (keys under ``prefix``)."""

    def __init__(self, *, client: aredis.Redis, prefix: str) -> None:
        self._r = client
        self._prefix = prefix
        self._clear = client.register_script(scripts.CLEAR_IF_GEN)
        self._fail = client.register_script(scripts.RECORD_FAILURE)
        self._mark = client.register_script(scripts.MARK)

    def _k(self, suffix: str) -> str:
        return keys.graph_key(self._prefix, suffix)

    async def due(self, now: float, limit: int) -> list[str]:
        """Stale community ids due at ``now``, in the queue's order: those an edit marked while
        they had a summary first, then by first mark (or, after a failure, retry time)."""
        async with translate_errors("stale read"):
            ids = await self._r.zrangebyscore(self._k("stale_q"), "-inf", now, start=0, num=limit)
        return [as_str(c) for c in ids]

    async def failures(self, cid: str) -> int:
        """Failed summary attempts of a community since its last success."""
        async with translate_errors("stale read"):
            return int(await self._r.hget(self._k("failures"), cid) or 0)

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
            cids = [as_str(c) for c in await self._r.zrange(self._k("stale_first"), 0, max(limit, 1) - 1)]
            read: list[Any] = []
            if cids:
                # One round trip for all the items, their documents included: the explorer lists
                # hundreds, and the status page samples every tenant's.
                async with self._r.pipeline(transaction=False) as pipe:
                    pipe.hmget(self._k("stale"), cids)
                    pipe.hmget(self._k("failures"), cids)
                    pipe.hmget(self._k("last_error"), cids)
                    pipe.zmscore(self._k("stale_q"), cids)
                    for cid in cids:
                        pipe.exists(self._k(f"claim:{cid}"))
                    for cid in cids:
                        pipe.smembers(self._k(f"stale_docs:{cid}"))
                    read = await pipe.execute()
            n = len(cids)
            recs, failures, errors, scores = read[:4] if read else ([], [], [], [])
            claims, doc_sets = read[4 : 4 + n], read[4 + n :]
            items = []
            for i, (cid, rec) in enumerate(zip(cids, recs, strict=True)):
                if rec is None:
                    continue
                d = json.loads(rec)
                docs = sorted(as_str(x) for x in doc_sets[i])
                attempts = int(failures[i] or 0)
                items.append(
                    StaleItem(
                        cid,
                        int(d["level"]),
                        float(d["first"]),
                        float(d["last"]),
                        int(d["count"]),
                        docs,
                        attempts=attempts,
                        last_error=as_str(errors[i]) if errors[i] is not None else "",
                        retry_at=float(scores[i]) if attempts and scores[i] is not None else None,
                        claimed=bool(claims[i]),
                        asked=bool(d.get("asked", False)),
                        ahead=bool(d.get("ahead", False)),
                    )
                )
        return depth, items

    async def failing(self) -> list[tuple[str, int, str]]:
        """Every community whose summaries failed since the last success: (id, attempts, the
        last one's why), most attempts first. Read whole (two reads), however deep the queue."""
        async with translate_errors("stale read"):
            counts = {as_str(c): int(n) for c, n in (await self._r.hgetall(self._k("failures"))).items()}
            cids = sorted(counts)
            errors = await self._r.hmget(self._k("last_error"), cids) if cids else []
        found = [(c, counts[c], as_str(e) if e is not None else "") for c, e in zip(cids, errors, strict=True)]
        return sorted(found, key=lambda f: (-f[1], f[0]))

    async def _repair_stale_first(self) -> None:
        """Rebuild the first-marked index from the queue (stores written before it existed)."""
        queued = {as_str(c) for c in await self._r.zrange(self._k("stale_q"), 0, -1)}
        listed = {as_str(c) for c in await self._r.zrange(self._k("stale_first"), 0, -1)}
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
        """Whether each community's summary is stale right now: marked, or of a community a
        recompute removed (its summary chunk outlives the record until a worker drops it, and
        longer if that drop fails)."""
        if not cids:
            return {}
        async with translate_errors("stale read"), self._r.pipeline(transaction=True) as pipe:
            pipe.zmscore(self._k("stale_q"), list(cids))
            for c in cids:
                pipe.hexists(self._k("comms"), c)
            scores, *exists = await pipe.execute()
        return {c: s is not None or not e for c, s, e in zip(cids, scores, exists, strict=True)}

    async def mark_count(self, cid: str) -> str:
        """How many times a community has been marked (a claim remembers it)."""
        async with translate_errors("stale read"):
            return as_str(await self._r.hget(self._k("gen"), cid) or b"0")

    async def mark(self, cids: Sequence[str], now: float) -> tuple[int, int]:
        """Mark communities stale at an operator's request, each with a new generation, so a
        summary being written from the old settings does not clear it; returns how many (a
        community no longer in the map is passed over) and how many of them were queued
        already. One script per 1,000 communities."""
        marked = queued = 0
        async with translate_errors("stale write"):
            for i in range(0, len(cids), 1000):
                part = list(cids[i : i + 1000])
                n, q = await self._mark(keys=[self._k("stale")], args=[self._prefix, repr(now), *part])
                marked, queued = marked + int(n), queued + int(q)
        return marked, queued

    async def clear_if_unchanged(self, cid: str, gen: str) -> bool:
        """Clear the stale mark unless the community was marked again since ``gen`` (its mark_count then)."""
        async with translate_errors("stale clear"):
            return bool(await self._clear(keys=[self._k("stale")], args=[self._prefix, cid, gen]))

    async def record_failure(self, cid: str, retry_at: float, lease: str, error: str = "") -> int:
        """Count a failed summary and defer the community until ``retry_at``; returns attempts
        (0 when nothing was recorded).

        Only while the community is still queued (one removed or summarized meanwhile keeps
        no failure count: it would never be cleared) and no claim but the worker's own
        ``lease`` (``leases.claim_value``) holds it: a claim that expired mid-summary may be
        another worker's now, whose mark this failure must not push back. One that expired
        with nobody claiming since still counts, so a summary that outruns its claim backs off.
        """
        async with translate_errors("stale write"):
            args = [self._prefix, cid, repr(retry_at), lease, error[:MAX_ERROR_CHARS]]
            attempts = int(await self._fail(keys=[self._k("stale_q")], args=args))
            await self._r.incr(self._k("summary_failures"))
        return attempts
