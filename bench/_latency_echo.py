"""The latency benchmark's baseline (a): an empty FastStream handler that replies at once."""

from __future__ import annotations

import asyncio
from typing import Any

from _servers import Servers
from faststream.kafka import KafkaBroker as FastStreamBroker

# The plain class goes by another name: FastStream resolves the daemon's string annotations
# (``broker: KafkaBroker`` in consumers/routers.py) with the locals of every calling frame, the
# running script's globals included, and a ``KafkaBroker`` bound there would shadow the context
# annotation ("`broker` ... FastStream cannot inject"). Never bind that name in bench/latency.py
# nor in any frame that starts the daemon.
from faststream.kafka.annotations import KafkaBroker as BrokerDep
from faststream.kafka.annotations import KafkaMessage

from consumers.assignment import AssignmentWatcher


async def start_echo(servers: Servers, requests: str, workers: int, fetch_wait_ms: int) -> FastStreamBroker:
    """The baseline: an empty FastStream handler that replies at once to reply_to."""
    broker = FastStreamBroker(servers.kafka_bootstrap, acks="all", logger=None)
    assigned = asyncio.Event()

    def on_assigned(name: str, partitions: int) -> None:
        assigned.set()

    async def no_decode(msg: Any) -> None:
        return None

    @broker.subscriber(  # type: ignore[untyped-decorator]
        requests,
        group_id="bench-echo",
        max_workers=workers,
        fetch_max_wait_ms=fetch_wait_ms,
        auto_offset_reset="latest",
        no_reply=True,
        decoder=no_decode,
        listener=AssignmentWatcher("echo", on_assigned),
    )
    async def echo(body: Any, message: KafkaMessage, broker: BrokerDep) -> None:
        await broker.publish({"ok": True}, topic=message.reply_to, correlation_id=message.correlation_id)

    await broker.start()
    await asyncio.wait_for(assigned.wait(), timeout=120)
    return broker
