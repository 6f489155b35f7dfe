"""The askers of the latency benchmark: plain aiokafka request/reply, and the closed loop that times it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from _stats import cpu_delta, cpu_snapshot, summary_ms
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition


class Asker:
    """Plain aiokafka request/reply: JSON in, reply_to + correlation_id headers, replies read by id."""

    def __init__(self, bootstrap: str, requests: str, replies: str, reply_wait_ms: int) -> None:
        self.bootstrap, self.requests, self.replies = bootstrap, requests, replies
        self.producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
        # 5 ms by default: with a handler running, tansu holds even a one-partition reply fetch
        # for its whole wait (--reply-wait-ms 500 measured ~252 ms per round trip).
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, fetch_max_wait_ms=reply_wait_ms, enable_auto_commit=False
        )
        self.pending: dict[str, asyncio.Future[bytes]] = {}
        self.reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.producer.start()
        await self.consumer.start()
        tps = [TopicPartition(self.replies, p) for p in sorted(self.consumer.partitions_for_topic(self.replies) or [])]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:
            await self.consumer.position(tp)
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.consumer:
            cid = dict(msg.headers or ()).get("correlation_id", b"").decode()
            fut = self.pending.pop(cid, None)
            if fut is not None and not fut.done():
                fut.set_result(msg.value or b"")

    async def stop(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.reader
        await self.consumer.stop()
        await self.producer.stop()

    async def ask(self, body: bytes, timeout_s: float) -> tuple[float, bytes | None]:
        """One round trip: (seconds, reply body or None on timeout)."""
        cid = uuid.uuid4().hex
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.pending[cid] = fut
        headers = [("reply_to", self.replies.encode()), ("correlation_id", cid.encode())]
        t0 = time.perf_counter()
        try:
            await self.producer.send_and_wait(self.requests, body, key=cid.encode(), headers=headers)
            reply = await asyncio.wait_for(fut, timeout=timeout_s)
        except TimeoutError:
            return time.perf_counter() - t0, None
        finally:
            self.pending.pop(cid, None)
        return time.perf_counter() - t0, reply


async def closed_loop(
    asker: Asker,
    make_body: Callable[[], bytes],
    concurrency: int,
    total: int,
    warmup: int,
    timeout_s: float,
    sink: list[float] | None = None,
) -> dict[str, Any]:
    """``concurrency`` askers, each sending its next request when its reply arrives (each
    round trip's seconds also go to ``sink``)."""
    for _ in range(warmup):
        await asyncio.gather(*(asker.ask(make_body(), timeout_s) for _ in range(concurrency)))
    latencies: list[float] = []
    errors = timeouts = 0
    issued = 0

    async def worker() -> None:
        nonlocal issued, errors, timeouts
        while issued < total:
            issued += 1
            seconds, reply = await asker.ask(make_body(), timeout_s)
            if reply is None:
                timeouts += 1
                continue
            if b'"error"' in reply[:200] and "error" in json.loads(reply):
                errors += 1
            latencies.append(seconds)

    cpu0 = cpu_snapshot()
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    cpu = cpu_delta(cpu0, cpu_snapshot(), len(latencies))
    if sink is not None:
        sink.extend(latencies)
    return {
        "concurrency": concurrency,
        "requests": total,
        **summary_ms(latencies),
        "errors": errors,
        "timeouts": timeouts,
        "wall_s": round(wall, 3),
        "qps": round(len(latencies) / wall, 2),
        "cpu": cpu,
    }
