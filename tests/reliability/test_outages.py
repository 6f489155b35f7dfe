"""Outages: Redis stopped mid-stream, then back; the broker restarted. Nothing is lost, nothing
is committed past unindexed data, and askers hear `unavailable` instead of silence.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from consumers.client import MemoryClient
from consumers.errors import QueryFailed
from daemon.launcher import free_port, start_redis, start_tansu
from daemon.status import measure_lag
from memory.config import IngestConfig
from memory.embed_worker import CRASH_MARKER_ENV
from memory.errors import BackendUnavailable
from tests.conftest import unique
from tests.helpers import PlainClient, daemon_and_client, eventually, isolated_settings, read_dlq, start_daemon

# The worker tests restart the model (a load each): with the suite in 3 processes on 2 cores,
# and other load, that can take minutes, so the hang guard is 360 s, not 180.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(360)]


def doc(doc_id: str, text: str, version: int = 1) -> dict[str, Any]:
    return {"event_id": doc_id, "op": "upsert", "doc_id": doc_id, "version": version, "content": text}


async def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        out = {}
        for p in range(partitions):
            out[p] = await consumer.committed(TopicPartition(topic, p)) or 0
        return out
    finally:
        await consumer.stop()


async def test_redis_outage_retries_commits_nothing_early_and_catches_up(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Redis down: ingestion waits (offsets stay behind), queries get `unavailable`; Redis back: all caught up."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    data = tmp_path / "redis"
    redis = start_redis(url, data_dir=data)
    name = unique("redis-outage")
    settings = isolated_settings(name, kafka_bootstrap, url, topic_partitions=1)
    try:
        async with daemon_and_client(settings, f"{name}.my-replies") as (daemon, client):
            for i in range(5):
                await client.send(
                    settings.topics.documents, doc(f"before/{i}", f"before outage {i} walrus"), key=f"b{i}"
                )
            await eventually(lambda: _has(daemon, "before/4"), what="docs before the outage")

            # A batch's offsets are committed after its writes show: wait for them, or a commit
            # of these docs landing during the outage would read as one committed too early.
            async def committed_before() -> bool:
                got = await committed(kafka_bootstrap, f"{name}.documents", settings.topics.documents, 1)
                return got[0] == 5

            await eventually(committed_before, what="offsets of the docs before the outage")
            offset_before = 5

            redis.stop()  # SIGTERM: Redis flushes its AOF and exits
            for i in range(20):
                await client.send(
                    settings.topics.documents, doc(f"during/{i}", f"during outage {i} narwhal"), key=f"d{i}"
                )
            _, reply = await client.ask({"query_id": "down", "search_text": "walrus", "top_k": 3})
            assert reply.get("error", {}).get("code") == "unavailable", reply
            await asyncio.sleep(2)  # several retry rounds happen while Redis is down
            assert (await committed(kafka_bootstrap, f"{name}.documents", settings.topics.documents, 1))[
                0
            ] == offset_before

            redis = start_redis(url, data_dir=data)  # same AOF: the index and the older docs come back

            # The docs of one batch are written a few at a time, each retrying on its own, so they
            # land in any order: wait for all of them.
            async def all_during() -> bool:
                return all([await _has(daemon, f"during/{i}") for i in range(20)])

            await eventually(all_during, timeout=60, what="catch-up after Redis returned")
            for i in range(20):
                assert await daemon.index.chunk_ids(f"during/{i}") == {f"during/{i}_p0"}
            assert await daemon.index.chunk_ids("before/0") == {"before/0_p0"}

            async def committed_all() -> bool:
                got = await committed(kafka_bootstrap, f"{name}.documents", settings.topics.documents, 1)
                return got[0] == offset_before + 20

            await eventually(committed_all, what="offsets committed after the writes")
            _, reply = await client.ask({"query_id": "up", "search_text": "narwhal", "top_k": 3})
            assert reply["results"], reply
    finally:
        redis.stop()


async def _has(daemon: Any, doc_id: str) -> bool:
    try:
        return bool(await daemon.index.chunk_ids(doc_id))
    except Exception:  # Redis may still be coming back
        return False


async def _dead_with(client: PlainClient, text: bytes) -> bool:
    """Whether the DLQ holds a record whose original bytes contain ``text``."""
    return any(text.decode() in (d.get("original_text") or "") for d in await read_dlq(client, 10**6, timeout=2))


async def test_broker_restart_daemon_reconnects_by_itself(
    redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker goes away and comes back (empty: tansu keeps its log in memory); the daemon
    recreates its topics, rejoins its groups and serves again without a restart. A bad event
    at an offset an earlier one held before the restart is dead-lettered too: attempts and
    dead-letter marks are per record (position and Kafka timestamp), not per position."""
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    broker = start_tansu(bootstrap, log_dir=tmp_path)
    name = unique("broker-restart")
    settings = isolated_settings(name, bootstrap, redis_url, topic_partitions=1, topic_check_s=1.0)
    daemon = await start_daemon(settings)
    lasting: MemoryClient | None = None
    outage_clients: list[MemoryClient] = []
    try:
        # Requests answered before the restart: the request consumer's position, and the
        # offset it auto-commits, are then past the end of the empty broker's new log, where
        # no query would be answered again unless the daemon moves it back.
        before = PlainClient(bootstrap, settings.topics, settings.topics.replies)
        await before.start()
        # A client that lives through the restart, its reply reader never paused (as a busy
        # agent's): its position stands past the new log's end afterwards. (60 s: on a loaded
        # machine its reader's move back to the new log can take longer than 20 s.)
        lasting = MemoryClient(bootstrap=bootstrap, topics=settings.topics, reply_idle_pause_s=0, timeout_s=60)
        await lasting.start()
        for pause in (0.2, 0):
            outage_clients.append(
                MemoryClient(bootstrap=bootstrap, topics=settings.topics, reply_idle_pause_s=pause, timeout_s=15)
            )
            await outage_clients[-1].start()
        try:
            for i in range(6):
                await before.ask({"query_id": f"pre{i}", "search_text": "anything at all", "top_k": 1})
            for c in (lasting, lasting, lasting, *outage_clients):
                await c.query("anything at all", top_k=1)
            # A good event at offset 0 of the documents log, then a bad one at offset 1,
            # dead-lettered (and marked so).
            await before.send(settings.topics.documents, doc("before/broker.md", "written before the restart"))
            await eventually(lambda: _has(daemon, "before/broker.md"), timeout=60, what="consumed before")
            await before.producer.send_and_wait(settings.topics.documents, b"{not json: before the restart")
            await eventually(lambda: _dead_with(before, b"before the restart"), timeout=60, what="dead letter before")
        finally:
            await before.stop()
        broker.stop()
        # Asked while the broker is down, by a client whose reply reader had paused (it moves
        # to the end of its log as it wakes) and by one whose reader never pauses (only its
        # send waits): each is told the broker is unavailable within its timeout, and
        # aiokafka's errors at every retry (~70 a second) reach the log once in a while only.
        await asyncio.sleep(0.5)  # the first one's reader pauses
        assert outage_clients[0]._transport._replies._paused is not None
        caplog.clear()
        asked_at = asyncio.get_running_loop().time()
        down = await asyncio.wait_for(
            asyncio.gather(*(c.query("anything at all", top_k=1) for c in outage_clients), return_exceptions=True),
            60,
        )
        took = asyncio.get_running_loop().time() - asked_at
        assert all(isinstance(e, BackendUnavailable) and "took no record" in str(e) for e in down), down
        # Within their 15 s timeout (a loop turn late at most, on a loaded machine); before, the
        # paused one waited as long as the broker stayed down, the other 40 s.
        assert took < 25, took
        kafka_errors = [r for r in caplog.records if r.name.startswith("aiokafka")]
        assert len(kafka_errors) < 30, [r.getMessage() for r in kafka_errors[:40]]
        broker = start_tansu(bootstrap, log_dir=tmp_path)
        client = PlainClient(bootstrap, settings.topics, settings.topics.replies)

        async def topics_back() -> bool:
            from aiokafka.admin import AIOKafkaAdminClient

            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            try:
                await admin.start()
                return set(settings.topics.all()) <= set(await admin.list_topics())
            except Exception:
                return False
            finally:
                await admin.close()

        await eventually(topics_back, timeout=60, what="the daemon recreated its topics")
        await client.start()
        try:
            await client.send(
                settings.topics.documents, doc("after/broker.md", "written after the broker restart okapi")
            )
            await eventually(lambda: _has(daemon, "after/broker.md"), timeout=90, what="consumed after the restart")
            # Offset 1 of the new log: another bad event where the first one was.
            await client.producer.send_and_wait(settings.topics.documents, b"{not json: after the restart")
            await eventually(lambda: _dead_with(client, b"after the restart"), timeout=60, what="dead letter after")
            # One request, waited for (the request consumer may still be rejoining): asked
            # again and again, later requests filled the new log up to the stale position and
            # were answered, which hid that the first ones after the restart never were. Asked
            # by a MemoryClient: the outage clients' records, held by their producers, reach
            # the new log now, and tansu can refuse one of two first writes racing for offset 0
            # with UnknownError, which the MemoryClient sends again.
            async with MemoryClient(bootstrap=bootstrap, topics=settings.topics, timeout_s=90) as fresh:
                reply = await fresh.query("okapi", top_k=1)
            assert [r.doc_id for r in reply.results] == ["after/broker.md"], reply
            # The client open since before the restart hears its reply too, though the new log
            # holds two replies where its reader stood at the ninth.
            heard = await lasting.query("okapi", top_k=1)
            assert [r.doc_id for r in heard.results] == ["after/broker.md"], heard
            # So do the clients that were told the broker was down: their held records sent
            # late are no failure of the next call.
            for c in outage_clients:
                heard = await c.query("okapi", top_k=1)
                assert [r.doc_id for r in heard.results] == ["after/broker.md"], heard

            async def nothing_past_the_end() -> bool:
                return not (await measure_lag(settings)).past_end

            # What /readyz and doctor read: no group left committed past the new log's end.
            await eventually(nothing_past_the_end, timeout=60, what="every group's offsets back inside the log")
        finally:
            await client.stop()
    finally:
        for c in outage_clients:
            await c.close()
        if lasting is not None:
            await lasting.close()
        await daemon.stop()
        broker.stop()


async def test_a_tenants_topics_come_back_after_the_broker_lost_them(redis_url: str, tmp_path: Path) -> None:
    """Topic tenancy: a tenant wrote through its own topics, then the broker restarts empty
    (tansu keeps its log in memory). The daemon recreates that tenant's topics with its own,
    so the tenant's client, which reads its own reply topic, is answered again."""
    from consumers.client import MemoryClient
    from consumers.config import ConsumerConfig
    from daemon.topics import ensure_tenant_topics, tenant_topics
    from graph.config import GraphConfig

    bootstrap = f"127.0.0.1:{free_port()}"
    broker = start_tansu(bootstrap, log_dir=tmp_path)
    name = unique("tenant-topics-back")
    consumer = ConsumerConfig(group_id=name, tenancy="topic", metadata_max_age_ms=500)
    # The graph off: it records the tenants it sees too, and here ingestion alone must.
    settings = isolated_settings(
        name,
        bootstrap,
        redis_url,
        topic_partitions=1,
        topic_check_s=1.0,
        consumer=consumer,
        graph=GraphConfig(enabled=False),
    )
    await ensure_tenant_topics(settings, "acme", timeout_s=30)  # as `agentmemd topics --tenant acme` does
    daemon = await start_daemon(settings)
    try:
        async with MemoryClient(bootstrap=bootstrap, topics=settings.topics, tenant="acme", timeout_s=60) as memory:
            text = "Refunds over 500 euros need a second approver from finance."
            receipt = await memory.publish_document("kb/refunds.md", text, wait=True)
            assert receipt.ack is not None and receipt.ack.status == "indexed"
        broker.stop()
        await asyncio.sleep(2)
        broker = start_tansu(bootstrap, log_dir=tmp_path)

        async def tenant_topics_back() -> bool:
            from aiokafka.admin import AIOKafkaAdminClient

            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            try:
                await admin.start()
                return set(tenant_topics(settings, "acme")) <= set(await admin.list_topics())
            except Exception:
                return False
            finally:
                await admin.close()

        await eventually(tenant_topics_back, timeout=60, what="the daemon recreated the tenant's topics")
        async with MemoryClient(bootstrap=bootstrap, topics=settings.topics, tenant="acme", timeout_s=20) as memory:

            async def answered() -> bool:
                try:
                    reply = await memory.query("who approves large refunds?", top_k=3)
                except (TimeoutError, QueryFailed):  # the request consumer may still be rejoining
                    return False
                return [r.doc_id for r in reply.results][:1] == ["kb/refunds.md"]

            await eventually(answered, timeout=120, what="the tenant answered again")
    finally:
        await daemon.stop()
        broker.stop()


async def test_embedding_worker_killed_under_ingestion_is_an_outage_not_a_dead_letter(
    kafka_bootstrap: str, redis_url: str
) -> None:
    """The model's process dies mid-batch: the batch waits for a new worker; nothing is dead-lettered."""
    name = unique("embed-kill")
    settings = isolated_settings(name, kafka_bootstrap, redis_url, topic_partitions=1)
    # Its own workers: this test kills the model's process.
    async with daemon_and_client(settings, f"{name}.my-replies", own_workers=True) as (daemon, client):
        for i in range(48):  # ~190 chunks, each its own text (a repeated one is embedded once): seconds of work
            body = " ".join(f"Sentence {s} of walrus migration runbook {i}, step {s} of many." for s in range(60))
            await client.send(settings.topics.documents, doc(f"kill/{i}", body), key=f"k{i}")
        await asyncio.sleep(1.5)
        old_pid = daemon.embedder.worker_pid
        assert old_pid is not None
        os.kill(old_pid, signal.SIGKILL)

        async def all_in() -> bool:
            return all([await _has(daemon, f"kill/{i}") for i in range(48)])

        await eventually(all_in, timeout=180, what="every doc indexed by the restarted worker")
        assert daemon.embedder.worker_pid not in (None, old_pid)
        probe = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap)
        await probe.start()
        try:
            dlq = settings.topics.dlq
            tps = [TopicPartition(dlq, p) for p in sorted(probe.partitions_for_topic(dlq) or [])]
            assert tps, "the DLQ topic exists"
            probe.assign(tps)
            assert sum((await probe.end_offsets(tps)).values()) == 0, "nothing was dead-lettered"
        finally:
            await probe.stop()


async def test_input_that_crashes_the_worker_is_dead_lettered_and_the_rest_flows(
    kafka_bootstrap: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A text that kills the model's process every time (as a native crash would) is not an
    outage to wait out forever: after embed_crash_limit deaths its group is split, only that
    doc is dead-lettered, and its neighbours in the batch and later events are indexed."""
    marker = f"crash-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(CRASH_MARKER_ENV, marker)  # read by the worker process it spawns
    name = unique("embed-poison")
    settings = isolated_settings(
        name, kafka_bootstrap, redis_url, topic_partitions=1, ingest=IngestConfig(embed_crash_limit=2)
    )
    async with daemon_and_client(settings, f"{name}.my-replies", own_workers=True) as (daemon, client):
        first_pid = daemon.embedder.worker_pid
        # One produce batch, so one poll and one embedding group: the group must be split.
        for i, text in enumerate(["walrus ledger one", f"walrus ledger {marker}", "walrus ledger three"]):
            body = json.dumps(doc(f"poison/{i}", text)).encode()
            await client.producer.send(settings.topics.documents, body, key=f"p{i}".encode())
        await client.producer.flush()
        # Four worker starts come before the dead letter: each took 30-40 s on a loaded machine.
        dead = await read_dlq(client, want=1, timeout=300)
        assert [json.loads(d["original_text"])["doc_id"] for d in dead] == ["poison/1"]
        assert dead[0]["error_code"] == "embedding_failed", dead[0]
        assert "crashed on this input 2 time(s)" in dead[0]["reason"], dead[0]

        async def neighbours_in() -> bool:
            return await _has(daemon, "poison/0") and await _has(daemon, "poison/2")

        await eventually(neighbours_in, timeout=60, what="the crashing doc's neighbours indexed")
        assert not await _has(daemon, "poison/1")
        await client.send(settings.topics.documents, doc("poison/after", "walrus ledger after"), key="p9")
        await eventually(lambda: _has(daemon, "poison/after"), timeout=60, what="the partition flows on")
        assert daemon.embedder.worker_pid not in (None, first_pid)
        assert len(await read_dlq(client, want=2, timeout=3)) == 1, "only the crashing doc was dead-lettered"


async def test_a_client_started_against_a_hung_broker_fails_within_its_timeout() -> None:
    """A broker that takes connections and never answers (stopped with SIGSTOP, hung): starting
    a client fails with ``BackendUnavailable`` within its ``timeout_s``, where aiokafka alone
    waited its 40 s request timeout (`agentmemd query --timeout 5` took 41.5 s)."""
    held: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(BackendUnavailable, match=r"unreachable: no answer within 2 s"):
            async with MemoryClient(bootstrap=f"127.0.0.1:{port}", timeout_s=2):
                pass
        assert asyncio.get_running_loop().time() - started < 10
        assert held, "the client never connected: the test proved nothing"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
