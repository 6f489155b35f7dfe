"""Lanes through the real broker, daemon and Redis: small writes on another partition and on
the large document's own partition are applied and acked while the large document is still
being embedded, a later version of the large document waits for it, the partition is not
committed past the large document until it is written, and past everything after."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from typing import Any

import pytest

from consumers.config import ConsumerConfig
from daemon.status import measure_lag
from memory.search_spec import SearchSpec
from tests.conftest import unique
from tests.helpers import daemon_and_client, isolated_settings

pytestmark = pytest.mark.integration

WORDS = (
    "ledger lock timeout replica shard quorum backlog cursor vacuum index snapshot rollback latency "
    "throughput partition consumer offset retention compaction heartbeat lease fencing token"
).split()


def long_text(kib: int, seed: int) -> str:
    """About ``kib`` KiB of sentences, none repeated (each chunk embedded anew)."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    n = 0
    while size < kib * 1024:
        words = rng.choices(WORDS, k=14)
        s = f"Step {n}: the {' '.join(words)}."
        out.append(s + ("\n\n" if n % 6 == 5 else " "))
        size += len(s) + 1
        n += 1
    return "".join(out)


async def send(plain: Any, partition: int, doc_id: str, content: str, version: int = 1) -> str:
    cid = uuid.uuid4().hex
    event = {"event_id": cid, "op": "upsert", "doc_id": doc_id, "version": version, "content": content}
    headers = [("reply_to", plain.reply_topic.encode()), ("correlation_id", cid.encode())]
    await plain.producer.send_and_wait(
        plain.topics.documents, json.dumps(event).encode(), key=doc_id.encode(), partition=partition, headers=headers
    )
    return cid


async def documents_lag(settings: Any) -> dict[str, int]:
    report = await measure_lag(settings)
    return report.lag.get(settings.consumer.group("documents"), {})


async def test_small_writes_are_not_held_behind_a_large_document(kafka_bootstrap: str, redis_url: str) -> None:
    name = unique(__name__)
    consumer = ConsumerConfig(group_id=name, ingest_lane_min_bytes=16_384)
    settings = isolated_settings(name, kafka_bootstrap, redis_url, consumer=consumer)  # 2 partitions
    docs = settings.topics.documents
    async with daemon_and_client(settings) as (daemon, plain):
        lanes = daemon.lanes["documents"]
        big_id, small_id = "lanes/big.md", "lanes/small.md"
        big_cid = await send(plain, 0, big_id, long_text(96, seed=1))
        deadline = time.monotonic() + 60
        while lanes.running == 0:  # the large document is in hand, in a lane
            assert time.monotonic() < deadline, "no lane started for the large document"
            await asyncio.sleep(0.02)
        small_cid = await send(plain, 1, small_id, "The vacuum of ledger_entries runs nightly at 02:00.")
        _h, small_ack = await plain.reply(small_cid, timeout=120)
        assert small_ack["status"] == "indexed"
        # Applied while the large document is still being embedded: before, it waited for it.
        assert big_cid not in plain.seen and lanes.running == 1
        # So is one on the large document's own partition, of another key.
        beside_cid = await send(plain, 0, "lanes/beside.md", "Replica lag alerts page the storage rota.")
        _h, beside_ack = await plain.reply(beside_cid, timeout=120)
        assert beside_ack["status"] == "indexed" and big_cid not in plain.seen
        # A later version of the large document waits for it (the order of a key is kept).
        newer_cid = await send(plain, 0, big_id, "The ledger runbook moved to the wiki.", version=2)
        # Its partition is committed up to the large document, not past it: a crash now
        # delivers it again, and the write applied beside it.
        assert (await documents_lag(settings)).get(f"{docs}/0") == 3

        _h, big_ack = await plain.reply(big_cid, timeout=170)
        assert big_ack["status"] == "indexed" and big_ack["chunks"] > 50, big_ack
        _h, newer_ack = await plain.reply(newer_cid, timeout=60)
        # Applied after version 1, not before it (version 1 would then have been ignored).
        assert newer_ack["status"] == "indexed" and newer_ack["version"] == 2, newer_ack
        # Committed by the lane itself, with no later batch on the partition to carry it.
        deadline = time.monotonic() + 30
        while (await documents_lag(settings)).get(f"{docs}/0", 0) != 0:
            assert time.monotonic() < deadline, "the lane's partition was never committed"
            await asyncio.sleep(0.2)
        # The partition was resumed: a write behind it is applied.
        after_cid = await send(plain, 0, "lanes/after.md", "Compaction of the ledger topic is off.")
        _h, after_ack = await plain.reply(after_cid, timeout=60)
        assert after_ack["status"] == "indexed"
        found = await daemon.retriever.search(SearchSpec(text="when does the vacuum of ledger_entries run", top_k=3))
        assert small_id in [h.chunk.doc_id for h in found.hits]
