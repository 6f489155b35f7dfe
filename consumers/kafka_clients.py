"""What every aiokafka client of the project needs around aiokafka: the cluster's metadata read
fresh, a stop that never raises in place of the caller's error, and the partitions a consumer
reads past the end of a log the broker lost (``daemon.lost_logs`` says why both measures)."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

log = structlog.get_logger()


async def cluster_metadata(consumer: AIOKafkaConsumer) -> Any:
    """The whole cluster's topics and partitions, read fresh (``.topics()``,
    ``.partitions_for_topic(t)``). A consumer's own metadata lists only the topics it tracks:
    none without a subscription (on Apache Kafka a bootstrap's empty topic list is answered
    with none), only its own after ``assign``, none created since. aiokafka has no public
    call returning partitions."""
    return await consumer._client.fetch_all_metadata()


async def stop_quietly(client: AIOKafkaConsumer | AIOKafkaProducer, what: str) -> None:
    """Stop an aiokafka client; a failure is logged, so the caller goes on to stop the rest."""
    try:
        await client.stop()
    except Exception as exc:
        log.warning("client.stop_failed", client=what, error=f"{type(exc).__name__}: {exc}")
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # this close is being cancelled
        # With the broker gone, aiokafka's stop can end in its own task's cancellation: a failed
        # stop like any other, not a traceback in place of the caller's error.
        log.warning("client.stop_failed", client=what, error="CancelledError inside the client library")


def past_log_end(position: int, highwater: int | None, end: int | None) -> bool:
    """Whether a consumer at ``position`` stands past the end of a lost log.

    ``highwater`` is the high watermark of the consumer's last fetch at its position (None
    before any): a fetch that delivered records up to the position had a watermark at or
    past it, so a watermark below the position comes from a log shorter than what was read.
    ``end`` is the broker's end offset; both must say so.
    """
    if highwater is None or end is None:
        return False
    return position > highwater and position > end


async def lost_partitions(consumer: Any) -> list[tuple[Any, int, int]]:
    """The assigned partitions of ``consumer`` past the end of their log, each with its
    position and the log's end (the higher of the watermark and the end offset)."""
    tps = sorted(consumer.assignment())
    if not tps:
        return []
    # Positions first: a watermark read after a position is at least the one of the fetch
    # that took the consumer there, on a healthy log.
    positions = {tp: await asyncio.wait_for(consumer.position(tp), 1.0) for tp in tps}
    highwaters = {tp: consumer.highwater(tp) for tp in tps}
    if not any(past_log_end(positions[tp], highwaters[tp], positions[tp] - 1) for tp in tps):
        return []  # no fetch's watermark below its position: healthy, and no request sent
    ends = await asyncio.wait_for(consumer.end_offsets(tps), 5.0)
    return [
        (tp, positions[tp], max(highwaters[tp] or 0, ends.get(tp) or 0))
        for tp in tps
        if past_log_end(positions[tp], highwaters[tp], ends.get(tp))
    ]


def set_fetch_wait(consumer: Any, wait_ms: int) -> bool:
    """Set how long the broker may hold ``consumer``'s fetches from its next one; False when
    this aiokafka has no such attribute (its fetcher's, set only at construction otherwise)."""
    fetcher: Any = getattr(consumer, "_fetcher", None)
    if not isinstance(getattr(fetcher, "_fetch_max_wait_ms", None), int):
        return False
    fetcher._fetch_max_wait_ms = wait_ms
    return True
