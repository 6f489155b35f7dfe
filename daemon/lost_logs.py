"""Consumers left past the end of a log the broker lost, moved back to its start.

A broker that comes back empty (tansu keeps its log in memory) starts every partition at
offset 0 again, but a consumer that lived through it keeps its old position, and the request
consumer's auto-commit even writes that position into the new broker's group. Apache Kafka
answers a fetch past the end with OFFSET_OUT_OF_RANGE and the consumer resets itself; tansu
answers with nothing, so the consumer would wait for ever and no query after such a restart
would be answered.

The end of a log is judged by the high watermark of the consumer's own last fetch, not by
the broker's end offsets alone: tansu's ListOffsets answers the base offset of the last
record batch plus one (100 records produced in one batch: end offset 1), so on a healthy log
whose producer batches, a consumer that had read everything stood "past the end" by that
measure, and every check (each ``topic_check_s``) rewound and replayed its partitions from
the start, for ever. Replaying in order is idempotent, but a replay in progress shows an old
state of what it rewrites (a corrected turn, for a moment, its first text again).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import structlog
from aiokafka.errors import IllegalStateError, KafkaError
from faststream.kafka import KafkaBroker

from consumers.kafka_clients import lost_partitions

log = structlog.get_logger()


async def log_ends(consumer: Any, tps: Sequence[Any], *, wait_s: float = 2.0) -> dict[Any, int]:
    """The end of each partition's log: the higher of the broker's end offset and the high
    watermark of a fetch there. ``consumer`` must have no subscription (it is assigned ``tps``).

    On Apache Kafka both agree; on tansu the end offset is the last batch's base + 1, so lag
    and "committed past the end" measured by it alone were wrong whenever producers batched.
    A partition whose fetch did not answer within ``wait_s`` keeps its end offset.
    """
    ends: dict[Any, int] = dict(await consumer.end_offsets(list(tps)))
    if not tps:
        return ends
    consumer.assign(list(tps))
    for tp in tps:
        consumer.seek(tp, ends[tp])
    deadline = asyncio.get_running_loop().time() + wait_s
    while any(consumer.highwater(tp) is None for tp in tps):
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            break
        await consumer.getmany(timeout_ms=max(1, int(min(left, 0.2) * 1000)))
    return {tp: max(ends[tp], consumer.highwater(tp) or 0) for tp in tps}


async def rewind_lost_logs(broker: KafkaBroker, interval_s: float, halt: asyncio.Event) -> None:
    """Every ``interval_s``, move each of this daemon's consumers that stands past the end of
    its partition's log back to the log's start (and commit that)."""
    while not halt.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(halt.wait(), timeout=interval_s)
        for sub in broker.subscribers:
            consumer = getattr(sub, "consumer", None)
            if consumer is None:
                continue
            try:
                lost = await lost_partitions(consumer)
                for tp, position, end in lost:
                    log.warning(
                        "consumer.rewound_past_log_end",
                        topic=tp.topic,
                        partition=tp.partition,
                        position=position,
                        log_end=end,
                    )
                if lost:
                    # Committed too: the group's offset may already stand past the end (the
                    # request consumer's auto-commit, or a batch's commit that crossed the
                    # restart), and /readyz and doctor report that until a new commit.
                    tps = [tp for tp, _, _ in lost]
                    starts = await consumer.beginning_offsets(tps)
                    for tp in tps:
                        consumer.seek(tp, starts[tp])
                    await consumer.commit({tp: starts[tp] for tp in tps})
            except (TimeoutError, KafkaError, IllegalStateError, AssertionError, OSError) as exc:
                # A rebalance or the broker away: the next round looks again.
                log.debug("consumer.rewind_check_failed", error=f"{type(exc).__name__}: {exc}")
