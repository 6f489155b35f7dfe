"""Daemons and reindexes started in the test process, lending them one embedding worker and one community computer."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

from consumers.config import ConsumerConfig
from daemon.settings import Settings
from tests.helpers.kafka import PlainClient
from tests.helpers.settings import isolated_settings

if TYPE_CHECKING:
    from daemon.instance import Daemon
    from daemon.reindex import ReindexReport
    from graph.compute import CommunityComputer
    from memory.embedder import SentenceTransformerEmbedder


_shared: dict[str, Any] = {}
_shared_lock = asyncio.Lock()


def _no_crash_marker() -> None:
    from memory.embed_worker import CRASH_MARKER_ENV

    # The worker reads the marker when it is spawned, and again at every restart: a test's
    # fault injection must never reach the session's worker.
    assert CRASH_MARKER_ENV not in os.environ, "start a daemon with own_workers=True under a crash marker"


async def shared_workers() -> tuple[SentenceTransformerEmbedder, CommunityComputer]:
    """One embedding worker and one community-detection worker for the whole session, lent to
    the in-process daemons (each would otherwise start its own: ~6 s of model loading)."""
    from graph.compute import CommunityComputer
    from memory.config import EmbeddingConfig
    from memory.embedder import SentenceTransformerEmbedder

    _no_crash_marker()
    async with _shared_lock:
        if not _shared:
            compute = CommunityComputer()
            try:
                embedder, _ = await asyncio.gather(SentenceTransformerEmbedder.load(EmbeddingConfig()), compute.start())
            except BaseException:
                compute.close()
                raise
            _shared.update(embedder=embedder, compute=compute)
    return _shared["embedder"], _shared["compute"]


def close_shared_workers() -> None:
    workers = list(_shared.values())
    _shared.clear()
    for worker in workers:
        try:
            worker.close()
        except Exception as exc:  # the others are still closed
            print(f"closing a shared worker failed: {exc!r}", file=sys.stderr)


async def _lendable(
    settings: Settings, own_workers: bool
) -> tuple[SentenceTransformerEmbedder, CommunityComputer] | None:
    """The session's workers, unless the test kills or poisons its own (``own_workers``) or
    its embedding settings differ from the defaults."""
    from memory.config import EmbeddingConfig

    if own_workers or settings.embedding != EmbeddingConfig():
        return None
    return await shared_workers()


async def start_daemon(settings: Settings, *, own_workers: bool = False, **kw: Any) -> Daemon:
    """``daemon.app.start_daemon`` with the session's shared workers lent to it (see ``_lendable``)."""
    from daemon.app import start_daemon as start

    if (workers := await _lendable(settings, own_workers)) is None:
        return await start(settings, **kw)
    embedder, compute = workers
    return await start(settings, embedder=embedder, compute=compute, **kw)


async def reindex(settings: Settings, **kw: Any) -> ReindexReport:
    """``daemon.reindex.reindex`` with the session's embedder lent to the build (see ``_lendable``;
    a build whose worker must crash is given its own embedder directly)."""
    from daemon.reindex import reindex as build

    if (workers := await _lendable(settings, False)) is None:
        return await build(settings, **kw)
    return await build(settings, embedder=workers[0], **kw)


@asynccontextmanager
async def daemon_and_client(
    settings: Settings, reply_topic: str | None = None, *, own_workers: bool = False
) -> AsyncIterator[tuple[Daemon, PlainClient]]:
    """An in-process daemon and a ``PlainClient`` reading ``reply_topic`` (default: the daemon's
    reply topic; any other is created first); both are stopped on the way out."""
    from daemon.topics import ensure_topics

    reply_topic = reply_topic or settings.topics.replies
    if reply_topic != settings.topics.replies:
        await ensure_topics(settings.kafka_bootstrap, [reply_topic], partitions=1, replication=1)
    async with AsyncExitStack() as stack:  # the daemon is stopped even if the client's stop fails
        daemon = await start_daemon(settings, own_workers=own_workers)
        stack.push_async_callback(daemon.stop)
        client = PlainClient(settings.kafka_bootstrap, settings.topics, reply_topic)
        stack.push_async_callback(client.stop)
        await client.start()
        yield daemon, client


@asynccontextmanager
async def topic_tenancy_daemon(
    name: str,
    kafka_bootstrap: str,
    redis_url: str,
    tenants: Sequence[str],
    kinds: Sequence[str] = ("documents", "transcripts", "requests", "replies"),
    extra_topics: Sequence[str] = (),
    reply_topic: str | None = None,
) -> AsyncIterator[tuple[Daemon, PlainClient, Settings]]:
    """``daemon_and_client`` for a daemon in topic tenancy: one-partition topics, every
    ``<kind topic>.<tenant>`` (and ``extra_topics``) created first, and topic metadata refreshed
    every 500 ms so the pattern subscriptions find them at once."""
    from daemon.topics import ensure_topics

    settings = isolated_settings(
        name,
        kafka_bootstrap,
        redis_url,
        topic_partitions=1,
        consumer=ConsumerConfig(group_id=name, tenancy="topic", metadata_max_age_ms=500),
    )
    bases = settings.topics.model_dump()
    topics = [f"{bases[kind]}.{tenant}" for tenant in tenants for kind in kinds]
    await ensure_topics(kafka_bootstrap, [*topics, *extra_topics], partitions=1, replication=1)
    async with daemon_and_client(settings, reply_topic) as (daemon, client):
        yield daemon, client, settings
