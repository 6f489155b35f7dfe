"""Scale-out: two daemons share one consumer group; kill one and the other takes its partitions."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import redis.asyncio as aredis
from aiokafka import AIOKafkaProducer

from daemon.topics import ensure_topics
from memory.config import IndexConfig
from memory.index import ChunkIndex
from tests.conftest import unique
from tests.helpers import DaemonProcess, eventually, isolated_settings, settings_env, wait_for_chunks

pytestmark = pytest.mark.integration


def assigned_partitions(log_path: Path, subscriber: str) -> int:
    """The last partition count a daemon logged for one subscriber."""
    count = 0
    for line in log_path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "consumer.partitions_assigned" and event.get("subscriber") == subscriber:
            count = int(event["partitions"])
    return count


@pytest.mark.timeout(360)  # above the 240 s wait for the chunks, so a loss fails its assertion
async def test_two_daemons_share_partitions_and_survive_a_kill(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    """Both daemons get partitions; after one is killed, the other finishes everything, once."""
    name = unique("scale-out")
    settings = isolated_settings(name, kafka_bootstrap, redis_url, topic_partitions=4)
    env = settings_env(settings) | {"AGENTMEM_GRAPH__SUMMARIZER_CONCURRENCY": "0"}
    await ensure_topics(kafka_bootstrap, settings.topics.all(), partitions=4, replication=1)
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    # Started side by side: each start is mostly its own model load, one per core.
    a, b = await asyncio.gather(*(asyncio.to_thread(DaemonProcess(env, str(log)).start) for log in logs))
    client = aredis.from_url(redis_url)
    index = ChunkIndex(client=client, cfg=IndexConfig(name=name), dims=384)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        deadline = time.monotonic() + 60
        while not (assigned_partitions(logs[0], "documents") and assigned_partitions(logs[1], "documents")):
            assert time.monotonic() < deadline, "the two daemons never shared the partitions"
            await asyncio.sleep(0.2)
        assert assigned_partitions(logs[0], "documents") + assigned_partitions(logs[1], "documents") == 4

        want: dict[str, str] = {}

        async def publish(start: int, n: int) -> None:
            futures = []
            for i in range(start, start + n):
                doc_id = f"so/{i:04d}"
                text = f"scale-out document {i} about billing-service and ERR_SO_{i}"
                want[f"{doc_id}_p0"] = text
                payload = {"event_id": doc_id, "op": "upsert", "doc_id": doc_id, "version": 1, "content": text}
                futures.append(
                    await producer.send(settings.topics.documents, json.dumps(payload).encode(), key=doc_id.encode())
                )
            await asyncio.gather(*futures)

        await publish(0, 300)
        await eventually(lambda: _indexed(index, 60), what="ingestion under way")
        a.kill()
        await publish(300, 300)
        got = await wait_for_chunks(client, name, want, timeout=240)
        assert got == want, f"{len(got)} of {len(want)} chunks"
        assert await index.count() == len(want)  # no duplicates
        assert assigned_partitions(logs[1], "documents") == 4  # the survivor owns them all
    finally:
        await producer.stop()
        a.kill()
        b.stop()
        await client.aclose()


async def _indexed(index: ChunkIndex, n: int) -> bool:
    return await index.count() >= n
