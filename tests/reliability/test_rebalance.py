"""A rebalance in the middle of a batch: a daemon that loses a partition to a new member must
not go on writing its batch while the new owner replays the partition and applies what came
next (a turn forgotten after it would come back for good). The revocation waits for the
batch in hand."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from aiokafka import AIOKafkaProducer

from consumers.config import ConsumerConfig
from daemon.topics import ensure_topics
from graph.config import GraphConfig
from memory.ingest import Ingestor
from tests.conftest import unique
from tests.helpers import eventually, isolated_settings, start_daemon

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("where", ["batch", "lanes"])
async def test_a_forget_applied_by_the_new_owner_is_never_undone_by_the_old_one(
    kafka_bootstrap: str, redis_url: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Daemon A is inside a batch holding one turn per partition when daemon B joins the
    group; each session is then forgotten. Whatever partition B takes, both turns end up
    forgotten: A finishes its batch before giving the partition up, and B applies the
    forget after it. The same when each turn is large enough to be applied in a lane
    (consumers.lanes): the revocation waits for the lanes of the partitions it takes."""
    name = unique("rebalance-" + uuid.uuid4().hex[:6])
    consumer = ConsumerConfig(group_id=name, ingest_lane_min_bytes=1024 if where == "lanes" else 1 << 30)
    settings = isolated_settings(
        name, kafka_bootstrap, redis_url, topic_partitions=2, graph=GraphConfig(enabled=False), consumer=consumer
    )
    secret = "secret" if where == "batch" else " ".join(f"secret number {i}." for i in range(120))
    topic = settings.topics.transcripts
    await ensure_topics(kafka_bootstrap, settings.topics.all(), partitions=2, replication=1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    turn_ids = [f"transcript:agent/s{p}/1" for p in (0, 1)]
    for p in (0, 1):  # before any daemon runs: both turns come in one batch
        ev = {"event_id": uuid.uuid4().hex, "agent_id": "agent", "session_id": f"s{p}", "turn": 1, "content": secret}
        await producer.send_and_wait(topic, json.dumps(ev).encode(), key=f"agent/s{p}".encode(), partition=p)

    gate, held = asyncio.Event(), asyncio.Event()
    original = Ingestor.apply
    holder: list[Ingestor] = []

    async def slow(self: Ingestor, items):  # A's batch is slow (a big batch, a slow model): held here
        # Set before A starts, whose first batch may come as soon as it is ready; only the
        # first ingestor to take the turns (A's: B starts once it holds them) is held.
        if any(i.doc_id in turn_ids for i in items) and not gate.is_set() and holder in ([], [self]):
            holder[:] = [self]
            held.set()
            await gate.wait()
        return await original(self, items)

    monkeypatch.setattr(Ingestor, "apply", slow)
    a = await start_daemon(settings)
    joining: asyncio.Task | None = None
    b = None
    try:
        await asyncio.wait_for(held.wait(), 60)
        assert holder == [a.ingestor]
        assert a.lanes["transcripts"].running == (2 if where == "lanes" else 0)
        joining = asyncio.ensure_future(start_daemon(settings))  # scale out: the group rebalances
        await asyncio.sleep(6)  # B joins, with the session's model (on the old code: takes a partition)
        for p in (0, 1):
            ev = {"event_id": uuid.uuid4().hex, "op": "forget", "agent_id": "agent", "session_id": f"s{p}"}
            await producer.send_and_wait(topic, json.dumps(ev).encode(), key=f"agent/s{p}".encode(), partition=p)
        await asyncio.sleep(4)  # on the old code, B applies its partition's forget here
        gate.set()  # A's batch goes on
        b = await asyncio.wait_for(joining, 120)
        joining = None

        async def both_forgotten() -> bool:
            return not any([await a.index.chunk_ids(d) for d in turn_ids])

        await eventually(both_forgotten, timeout=60, what="both sessions' turns forgotten")
        await asyncio.sleep(2)  # and they stay forgotten
        assert not any([await a.index.chunk_ids(d) for d in turn_ids])
    finally:
        gate.set()
        await producer.stop()
        if joining is not None:
            b = await joining
        if b is not None:
            await b.stop()
        await a.stop()
