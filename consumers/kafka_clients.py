"""What every aiokafka client of the project needs around aiokafka: the cluster's metadata read
fresh, and a stop that never raises in place of the caller's error."""

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
