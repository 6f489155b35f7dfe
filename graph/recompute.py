"""The community recompute: detection and id matching (``graph.communities``, run through an
``Offload``) under a cluster-wide lease renewed while they run, then the deletion of removed
communities' summary chunks from the index."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from graph.communities import assign_ids, detect
from graph.compute import Offload
from graph.config import GraphConfig
from graph.errors import LeaseLost
from graph.leases import RECOMPUTE_LOCK
from graph.store import GraphStore
from memory.errors import MemdError
from memory.index import ChunkIndex
from memory.records import COMMUNITY_PREFIX

log = structlog.get_logger()

#: The recompute lease's time to live; renewed every third of it while the work runs, so a
#: daemon that dies mid-recompute holds it at most this long.
LEASE_S = 60.0
#: How long a removed community's summary tombstone (its drop's version) is kept: a day,
#: far beyond any summary writer's claim.
COMMUNITY_TOMBSTONE_S = 86_400


@dataclass
class RecomputeReport:
    """What one community recompute did."""

    communities: int
    levels: int
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    took_ms: float = 0.0


class Recomputer:
    """Recomputes one graph's communities, once cluster-wide, and drops removed ones' summaries."""

    def __init__(self, *, store: GraphStore, index: ChunkIndex, cfg: GraphConfig, owner: str, offload: Offload) -> None:
        self._store = store
        self._index = index
        self._cfg = cfg
        self._owner = owner
        # Where detection and id matching run: the daemon's CommunityComputer (a process
        # of its own, see graph.compute), a thread elsewhere.
        self._offload = offload

    async def recompute(self, *, force: bool = False) -> RecomputeReport | None:
        """Recompute communities when drift passed the threshold (or ``force``), once cluster-wide.

        Returns:
            The report, or ``None`` when not needed or another daemon holds the lock.
        """
        if not force and not await self._recompute_due():
            return None
        async with self._lease(RECOMPUTE_LOCK) as lease:
            if lease is None:
                return None
            return await self._recompute_under(lease, force=force)

    @contextlib.asynccontextmanager
    async def _lease(self, name: str) -> AsyncIterator[str | None]:
        """Hold the named singleton lease (``None``: another holds it), renewed every third
        of its time while the work runs, so a long recompute (Leiden on a big graph) is never
        left without it while another daemon starts a second one."""
        lease = await self._store.lock(name, self._owner, ttl_s=LEASE_S)
        if lease is None:
            yield None
            return
        done = asyncio.Event()

        async def renew() -> None:
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), timeout=LEASE_S / 3)
                if done.is_set():
                    return
                try:
                    if not await self._store.renew(name, lease, LEASE_S):
                        log.warning("graph.lease_lost", lease=name)  # the commit will refuse
                        return
                except MemdError as exc:  # Redis away: the lease may lapse; the commit checks it
                    log.warning("graph.lease_renew_failed", lease=name, error=str(exc))

        renewer = asyncio.create_task(renew(), name=f"graph-{name}-lease")
        try:
            yield lease
        finally:
            done.set()
            await asyncio.wait({renewer}, timeout=5)
            await self._store.unlock(name, lease)

    async def _recompute_under(self, lease: str, *, force: bool) -> RecomputeReport | None:
        t0 = time.monotonic()
        # Read again under the lock: another daemon may have recomputed (and subtracted
        # the drift it saw) since the check above; subtracting it twice would take the
        # drift below zero and delay every later recompute.
        if not force and not await self._recompute_due():
            return None
        drift = await self._store.drift()
        nodes, edges = await self._store.graph()
        old = await self._store.communities()
        raw = await self._offload(
            detect,
            sorted(nodes),
            [(a, b, float(w)) for a, b, w in edges],
            seed=self._cfg.seed,
            resolution=self._cfg.resolution,
            max_size=self._cfg.max_community_size,
            max_levels=self._cfg.max_levels,
            # Started from the communities as they are: a small change moves few of them, and
            # so few summaries are written again (decision 0058).
            previous=[(c.level, c.members) for c in old],
        )
        # Off the event loop as well: on a graph of thousands of communities, matching
        # takes long enough to stall queries and consumers' heartbeats.
        result = await self._offload(assign_ids, raw, old, threshold=self._cfg.match_threshold)
        now = time.time()
        try:
            await self._store.community_writes.replace(
                result.communities,
                changed=result.changed,
                removed=result.removed,
                events=result.events,
                drift_seen=drift,
                now=now,
                lease=lease,
            )
        except LeaseLost as exc:
            # Another daemon's recompute holds it now: its result stands, ours is dropped.
            log.warning("graph.recompute_superseded", error=str(exc), took_ms=round((time.monotonic() - t0) * 1000))
            return None
        await self.drop_removed(locked=True)
        report = RecomputeReport(
            communities=len(result.communities),
            levels=len({c.level for c in result.communities}),
            changed=sorted(result.changed),
            removed=sorted(result.removed),
            events=result.events,
            took_ms=(time.monotonic() - t0) * 1000,
        )
        log.info(
            "graph.communities_recomputed",
            communities=report.communities,
            levels=report.levels,
            changed=len(report.changed),
            removed=len(report.removed),
            merges=sum(e["type"] == "merge" for e in report.events),
            splits=sum(e["type"] == "split" for e in report.events),
            nodes=len(nodes),
            edges=len(edges),
            took_ms=round(report.took_ms, 1),
        )
        return report

    async def _recompute_due(self) -> bool:
        if await self._store.drift() < self._cfg.drift_threshold:
            return False
        # During a bulk load drift passes the threshold every few seconds; recomputing that
        # often would spend the cores on Leiden and re-summaries instead of ingestion.
        return time.time() - await self._store.last_recompute() >= self._cfg.recompute_min_interval_s

    async def drop_removed(self, *, locked: bool = False) -> int:
        """Delete the summary chunks of removed communities from the index; returns how many.

        A recompute records removed ids in the same transaction that forgets them, so a
        failure here (or a crash) leaves them for the next pass instead of in the index for
        good. Each delete is versioned with a fresh fencing token: a summary of the old
        community still being written (an earlier token) can no longer land after it.
        """
        pending = await self._store.summaries.pending_drops()
        if not pending:
            return 0
        # Under the recompute lock (``locked``: the caller holds it), so that no recompute can
        # bring an id back between the check below and its delete.
        if locked:
            return await self._drop_pending()
        async with self._lease(RECOMPUTE_LOCK) as lease:
            return 0 if lease is None else await self._drop_pending()  # None: a recompute drops them

    async def _drop_pending(self) -> int:
        done = 0
        live = {c.id for c in await self._store.communities()}
        for cid in await self._store.summaries.pending_drops():
            if cid not in live:  # else the id came back in a later recompute: its summary is live
                await self.delete_summary_chunk(cid, await self._store.fence())
            await self._store.summaries.dropped(cid)
            done += 1
        return done

    async def delete_summary_chunk(self, cid: str, token: int) -> bool:
        """Delete a community's summary chunk, versioned by ``token``; false when a later token won."""
        empty = np.zeros((0, 1), np.float32)
        # The tombstone only has to outlast a summary writer of the removed community still
        # running (claims last minutes); kept for good, community churn grew them unbounded.
        result = await self._index.apply(
            COMMUNITY_PREFIX + cid, token, [], empty, self._store.tenant, version_ttl_s=COMMUNITY_TOMBSTONE_S
        )
        return result.applied
