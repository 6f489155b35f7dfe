"""In topic tenancy no daemon reads the bare input topics (``memory.documents``, ...): what
waits there belongs to no tenant and is never applied. ``doctor`` counts it; once an operator
has published it again on its tenant's topic (or let it go), :func:`mark_bare_read` marks it
read, so doctor counts only what comes after. The mark is a consumer group's offsets, which
Apache Kafka keeps for a group without members for ``offsets.retention.minutes`` (7 days by
default): after that doctor counts those records again, and they are marked again."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from consumers.kafka_clients import cluster_metadata
from daemon.connections import kafka_options
from daemon.lost_logs import log_ends
from daemon.settings import Settings
from memory.errors import BackendUnavailable

#: How long marking one topic may take: aiokafka retries a commit while the group's
#: coordinator is unavailable, without end.
MARK_TIMEOUT_S = 30.0


async def mark_bare_read(settings: Settings) -> dict[str, int]:
    """Commit each bare input topic's log end for its role's bare-read group (a group no daemon
    joins, so the commit disturbs none); returns each topic's end, summed over its partitions
    (a topic the broker does not have is left out).

    Raises:
        BackendUnavailable: the broker cannot be asked, or refused the commit.
    """
    marked: dict[str, int] = {}
    for role, base in settings.topics.read().items():
        try:
            end = await asyncio.wait_for(_mark(settings, role, base), MARK_TIMEOUT_S)
        except TimeoutError:
            raise BackendUnavailable(
                f"kafka at {settings.kafka_bootstrap}: {base} not marked read within {MARK_TIMEOUT_S:g} s "
                "(its group's coordinator did not answer)"
            ) from None
        if end is not None:
            marked[base] = end
    return marked


async def _mark(settings: Settings, role: str, base: str) -> int | None:
    """Mark ``base`` read for ``role``'s bare-read group; its end over its partitions (None: no
    such topic).

    Raises:
        BackendUnavailable: the broker cannot be asked, or refused the commit.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=settings.consumer.bare_read_group(role),
        enable_auto_commit=False,
        request_timeout_ms=5000,
        fetch_max_wait_ms=5,
        max_partition_fetch_bytes=4096,
        **kafka_options(settings),
    )
    try:
        await consumer.start()
        cluster = await cluster_metadata(consumer)
        tps = [TopicPartition(base, p) for p in sorted(cluster.partitions_for_topic(base) or ())]
        if not tps:
            return None
        ends = await log_ends(consumer, tps)
        await consumer.commit({tp: OffsetAndMetadata(ends[tp], "") for tp in tps})
        return sum(ends.values())
    except KafkaError as exc:
        raise BackendUnavailable(f"kafka at {settings.kafka_bootstrap}: {base} not marked read: {exc}") from exc
    finally:
        await consumer.stop()
