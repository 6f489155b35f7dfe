"""One GraphService per tenant, created on first sight, and the loops that serve them all."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

import redis.asyncio as aredis
import structlog

from graph.compute import Offload, in_thread
from graph.config import GraphConfig
from graph.contribution import Contribution, ContributionResult
from graph.extractor import ExtractionCache
from graph.ner import SpacyNer
from graph.service import GraphService
from graph.store import GraphStore
from graph.summarizer import SummaryPause
from memory.activity import IngestActivity
from memory.embedder import Embedder
from memory.errors import MemdError
from memory.index import ChunkIndex
from memory.records import DEFAULT_TENANT, ChunkRecord, MemoryItem
from memory.retrying import pause
from memory.tenants import TenantRegistry

log = structlog.get_logger()

# Pause of a background loop after an error, so a persistent one logs every few seconds
# instead of spinning.
_ERROR_PAUSE_S = 5.0


class TenantGraphs:
    """Every tenant has its own graph, communities and stale queue; daemons share the list in Redis."""

    def __init__(
        self,
        *,
        client: aredis.Redis,
        name: str,
        index: ChunkIndex,
        embedder: Embedder | None,
        ner: SpacyNer | None,
        cfg: GraphConfig,
        activity: IngestActivity | None = None,
        mock_llm_response: str | None = None,
        offload: Offload = in_thread,
    ) -> None:
        self._r = client
        self._offload = offload
        self._activity = activity
        self._name = name
        self._index = index
        self._embedder = embedder
        self._ner = ner
        self._cfg = cfg
        self._mock = mock_llm_response
        self._services: dict[str, GraphService] = {}
        self._extraction_cache: ExtractionCache = OrderedDict()  # shared: its bound is the process's
        self._summary_pause = SummaryPause()  # shared: every tenant's summaries call one model
        self._tenants = TenantRegistry(client=client, name=name)
        self.stop = asyncio.Event()

    def service(self, tenant: str = DEFAULT_TENANT) -> GraphService:
        """The tenant's graph service (created on first use)."""
        svc = self._services.get(tenant)
        if svc is None:
            svc = GraphService(
                store=GraphStore(client=self._r, name=self._name, tenant=tenant),
                index=self._index,
                embedder=self._embedder,
                ner=self._ner,
                cfg=self._cfg,
                activity=self._activity,
                mock_llm_response=self._mock,
                offload=self._offload,
                extraction_cache=self._extraction_cache,
                summary_pause=self._summary_pause,
            )
            svc.stop = self.stop
            self._services[tenant] = svc
        return svc

    def store(self, tenant: str = DEFAULT_TENANT) -> GraphStore:
        """The tenant's graph store."""
        return self.service(tenant).store

    async def tenants(self) -> list[str]:
        """Every tenant any daemon has seen."""
        return await self._tenants.all()

    async def prepare(self, changes: Sequence[tuple[MemoryItem, Sequence[ChunkRecord]]]) -> list[Contribution | None]:
        """Each change's contribution, extracted per tenant in one call each; writes nothing."""
        out: list[Contribution | None] = [None] * len(changes)
        by_tenant: dict[str, list[int]] = {}
        for i, (item, _) in enumerate(changes):
            by_tenant.setdefault(item.tenant, []).append(i)
        for tenant, idx in by_tenant.items():
            found = await self.service(tenant).prepare([changes[i] for i in idx])
            for i, contrib in zip(idx, found, strict=True):
                out[i] = contrib
        return out

    async def apply(self, item: MemoryItem, contrib: Contribution | None) -> ContributionResult:
        """Route a prepared change to its tenant's graph."""
        await self._tenants.saw(item.tenant)
        return await self.service(item.tenant).apply(item, contrib)

    async def docs_under(self, tenant: str, prefix: str) -> set[str]:
        """The docs under ``prefix`` with a contribution in ``tenant``'s graph."""
        return await self.store(tenant).doc_ids_under(prefix)

    async def on_change(self, item: MemoryItem, chunks: Sequence[ChunkRecord]) -> ContributionResult:
        """Route a document change to its tenant's graph (``prepare`` and ``apply`` in one call)."""
        (contrib,) = await self.prepare([(item, chunks)])
        return await self.apply(item, contrib)

    async def _sleep(self, seconds: float) -> None:
        await pause(self.stop, seconds)

    async def _each(self, what: str, fn: Callable[[GraphService], Awaitable[object]]) -> int:
        # Each tenant on its own: one whose graph keeps failing (a bug its data triggers)
        # must not stop the work of the tenants after it.
        done = 0
        crashed = paused = False
        try:
            tenants = await self.tenants()
        except MemdError as exc:
            log.warning("graph.loop_paused", loop=what, error=str(exc))
            await self._sleep(_ERROR_PAUSE_S)
            return 0
        for tenant in tenants:
            if self.stop.is_set():
                break
            try:
                result = await fn(self.service(tenant))
            except MemdError as exc:
                log.warning("graph.loop_paused", loop=what, tenant=tenant, error=str(exc))
                paused = True
                continue
            except Exception as exc:
                # A bug or a broken install (cdlib failing to import) must not end the loop
                # silently: the task would be gone and communities never recomputed again.
                # Logged with its traceback; the loop carries on after a pause.
                log.exception("graph.loop_failed", loop=what, tenant=tenant, error=f"{type(exc).__name__}: {exc}")
                crashed = True
                continue
            done += result if isinstance(result, int) else 0
        if crashed or paused:
            # An outage or an index this daemon may not use goes on for a while: said every
            # few seconds, not at each turn of the loop (twice a second, with the whole reason).
            await self._sleep(_ERROR_PAUSE_S)
        return done

    async def run_worker(self) -> None:
        """Summarize stale communities of every tenant until stopped."""
        while not self.stop.is_set():
            if not await self._each("summarizer", lambda s: s.work_once()):
                await self._sleep(0.5)

    async def run_recompute(self) -> None:
        """Recompute drifted communities of every tenant, periodically."""
        while not self.stop.is_set():
            await self._each("recompute", lambda s: s.recompute())
            await self._sleep(self._cfg.recompute_check_s)

    async def run_queue_log(self) -> None:
        """Log each tenant's stale-queue depth and oldest age periodically."""
        import time

        while not self.stop.is_set():
            await self._sleep(self._cfg.queue_log_interval_s)

            async def measure(s: GraphService) -> None:
                depth, items = await s.store.stale(limit=1)
                oldest = time.time() - items[0].first_marked_at if items else 0.0
                # The gauges belong to daemon.status's sampler; this is the log line operators grep.
                log.info(
                    "graph.stale_queue_measured", tenant=s.store.tenant, depth=depth, oldest_age_s=round(oldest, 1)
                )

            await self._each("queue-log", measure)
