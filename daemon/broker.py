"""The Kafka broker: built from the settings, its subscribers started together, named by role."""

from __future__ import annotations

import asyncio
from typing import Any

from faststream.kafka import KafkaBroker

from consumers.config import ConsumerConfig
from daemon.settings import Settings
from memory.errors import BackendUnavailable

#: Longest a consumer tries to commit its offsets before it rejoins its group.
LAST_COMMIT_S = 10.0


def bound_last_commit() -> None:
    """Bound the commit aiokafka makes before a consumer rejoins its group (once per process).

    aiokafka retries a retryable commit error there without end, and "unknown topic" is one:
    a tenant's topic deleted under the daemon's pattern subscription held the rejoin of the
    requests consumer, and so every tenant's questions, for as long as the daemon ran (decision
    0059). Past ``LAST_COMMIT_S`` the commit is given up as failed, which aiokafka logs and
    rejoins after; the records read since the last commit are read again (at-least-once).
    """
    from aiokafka.consumer.group_coordinator import GroupCoordinator
    from aiokafka.errors import CommitFailedError

    original = GroupCoordinator._maybe_do_last_autocommit
    if getattr(original, "bounded", False):
        return

    async def within(self: GroupCoordinator, assignment: Any) -> None:
        try:
            await asyncio.wait_for(original(self, assignment), LAST_COMMIT_S)
        except TimeoutError as exc:
            raise CommitFailedError(f"offsets not committed within {LAST_COMMIT_S:g} s before the rejoin") from exc

    within.bounded = True  # type: ignore[attr-defined]
    GroupCoordinator._maybe_do_last_autocommit = within


def build_broker(settings: Settings) -> KafkaBroker:
    """The daemon's broker: its subscribers and the replies' and acks' producer."""
    bound_last_commit()
    return KafkaBroker(
        settings.kafka_bootstrap,
        metadata_max_age_ms=settings.consumer.metadata_max_age_ms,
        security=settings.kafka_security.faststream_security(),
        acks="all",
        graceful_timeout=settings.shutdown_timeout_s,
        logger=None,
    )


def subscriber_role(subscriber: Any) -> str:
    """A subscriber's role (``documents``, ``transcripts``, ``requests``): its group id's last part."""
    return ConsumerConfig.role_of(str(getattr(subscriber, "group_id", "") or "?"))


async def _start_together(broker: KafkaBroker) -> None:
    # FastStream's broker.start() starts subscribers one after another, and aiokafka's
    # consumer start waits for its group join (~5 s on tansu): three subscribers would
    # take 15 s. Starting them together takes one join's time. Same steps otherwise.
    await broker.connect()
    await asyncio.gather(*(sub.start() for sub in broker.subscribers))
    for pub in broker.publishers:
        await pub.start()
    broker.running = True


async def start_broker(broker: KafkaBroker, *, timeout_s: float) -> None:
    """Start the broker's subscribers (joining their groups) and publishers.

    Raises:
        BackendUnavailable: the consumers did not join their groups within ``timeout_s``.
    """
    try:
        await asyncio.wait_for(_start_together(broker), timeout=timeout_s)
    except TimeoutError as exc:
        # A consumer's group join that never ends (seen on tansu, with a group left stuck
        # by killed members) held start-up for ever, before start_daemon's readiness timeout.
        raise BackendUnavailable(
            f"consumers did not join their groups within {timeout_s:.0f}s; if the broker "
            "keeps a group stuck (tansu, after members were killed), restart it or set another "
            "AGENTMEM_CONSUMER__GROUP_ID"
        ) from exc
