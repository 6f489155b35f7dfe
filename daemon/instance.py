"""The running daemon: its parts, its background loops, and its shutdown in reverse order."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aredis
import structlog
from aiohttp import web
from faststream.kafka import KafkaBroker

from consumers.idle import FetchBackoff
from consumers.lanes import Lanes
from consumers.replies import PartitionCounts
from daemon.dlq_marks import read_marks
from daemon.explore import Access, Explorer, MemoryReads
from daemon.presence import Presence
from daemon.settings import Settings
from daemon.status import StatusState
from daemon.teardown import CLOSE_TIMEOUT_S, await_chain, bounded, cancel_and_wait
from graph import CommunityComputer, ScopedSearch, TenantGraphs
from memory.embedder import SentenceTransformerEmbedder
from memory.index import ChunkIndex
from memory.ingest import Ingestor
from memory.retrieval import Retriever
from memory.tenants import TenantRegistry

log = structlog.get_logger()


@dataclass
class Daemon:
    """A running daemon's parts, for shutdown and for tests."""

    settings: Settings
    redis: aredis.Redis
    embedder: SentenceTransformerEmbedder
    index: ChunkIndex
    ingestor: Ingestor
    retriever: Retriever
    broker: KafkaBroker
    graph: TenantGraphs | None = None
    search: ScopedSearch | None = None  # what the query subscriber asks (and the explorer)
    status: StatusState = field(default_factory=StatusState)
    http: web.AppRunner | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    assigned: dict[str, int] = field(default_factory=dict)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    # Set at shutdown: the background loops check it as well as being cancelled, because a
    # cancellation can be lost (on Python 3.11, asyncio.wait_for inside redis-py's command
    # send returns normally when the send completes as the cancellation arrives).
    halt: asyncio.Event = field(default_factory=asyncio.Event)
    stopped: bool = False
    partition_counts: PartitionCounts | None = None
    compute: CommunityComputer | None = None  # the graph's detection process (graph.compute)
    fetch_backoff: FetchBackoff | None = None  # idle subscribers' longer fetch waits (consumers.idle)
    lanes: dict[str, Lanes] = field(default_factory=dict)  # large batches applied beside the poll, by role
    # Set to stop without waiting for the lanes (``up``'s second Ctrl-C).
    hurry: asyncio.Event = field(default_factory=asyncio.Event)
    # False for workers lent by start_daemon's caller: closing them is the caller's job.
    owns_embedder: bool = True
    owns_compute: bool = True
    presence: Presence | None = None  # its word on itself among the index's daemons (daemon.presence)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str, *, ends: bool = False) -> None:
        """Run a background loop for the daemon's lifetime; its death is logged, never silent.
        ``ends``: a task that returns once its work is done (only an error is then a death)."""
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(functools.partial(self._task_ended, ends=ends))
        self.tasks.append(task)

    def _task_ended(self, task: asyncio.Task[None], *, ends: bool = False) -> None:
        if self.stopped or task.cancelled():
            return
        exc = task.exception()
        if exc is None and ends:
            return
        # The loops catch what they expect; reaching here is a bug worth an operator's eyes.
        log.error("daemon.task_died", task=task.get_name(), error=f"{type(exc).__name__}: {exc}" if exc else "returned")

    async def stop(self) -> None:
        """Stop consuming (draining in-flight messages), then close clients in reverse order.

        A second call does nothing.
        """
        if self.stopped:
            return
        self.stopped = True
        self.status.ready = False  # /readyz fails from the start of a drain, not after it
        log.info("daemon.shutdown_started")
        self.ingestor.stopping.set()
        # Lanes are no handlers of FastStream's: given the same time here, before their consumers close.
        lanes = [lane.close(self.settings.shutdown_timeout_s, self.hurry) for lane in self.lanes.values()]
        await bounded(
            "ingest lanes", asyncio.gather(*lanes), seconds=self.settings.shutdown_timeout_s + CLOSE_TIMEOUT_S
        )
        # FastStream gives in-flight handlers shutdown_timeout_s; the consumers' and the
        # producer's own closes (a final commit, a leave-group) get CLOSE_TIMEOUT_S beyond
        # that, so a broker gone silent cannot hold the shutdown.
        await bounded("kafka broker", self.broker.stop(), seconds=self.settings.shutdown_timeout_s + CLOSE_TIMEOUT_S)
        if self.partition_counts is not None:
            await bounded("partition counts", self.partition_counts.close())
        self.halt.set()
        if self.graph is not None:
            self.graph.stop.set()
        for task in await cancel_and_wait(self.tasks, seconds=15):
            log.warning("daemon.task_stuck", task=task.get_name(), awaiting=await_chain(task))
        await asyncio.gather(*(t for t in self.tasks if t.done()), return_exceptions=True)
        if self.http is not None:
            await bounded("http server", self.http.cleanup())
        await bounded("redis", self.redis.aclose())
        if self.owns_embedder:
            self.embedder.close()
        if self.compute is not None and self.owns_compute:
            self.compute.close()
        log.info("daemon.shutdown_finished")


def explorer(daemon: Daemon, *, access: Access | None = None) -> Explorer:
    """The explorer over a daemon's index, search, graph and status, behind ``access`` (by
    default the daemon's own tokens)."""
    stores = daemon.graph.store if daemon.graph is not None else None
    reads = MemoryReads(
        index=daemon.index,
        retriever=daemon.retriever,
        search=daemon.search or ScopedSearch(retriever=daemon.retriever, stores=stores),
        graph=daemon.graph,
        status=daemon.status,
        settings=daemon.settings,
        erased=TenantRegistry(client=daemon.redis, name=daemon.settings.index.name).erased
        if daemon.settings.consumer.tenancy == "topic"
        else None,
        replay_marks=functools.partial(read_marks, daemon.redis, daemon.settings.index.name),
    )
    return Explorer(reads=reads, access=access or daemon.settings.http_access())
