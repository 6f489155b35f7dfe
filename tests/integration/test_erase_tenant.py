"""Erasing a tenant through the real broker, daemon and Redis: its topics and every key of it
go, the other tenant keeps everything, an event sent to it afterwards is acked ``ignored``
and applies nothing, and creating its topics again starts it anew."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from consumers.client import MemoryClient
from consumers.config import ROLES, ConsumerConfig
from consumers.errors import QueryFailed
from daemon.dlq_marks import mark_replayed, read_marks
from daemon.explore.dlq import DeadLetter
from daemon.status import group_members
from daemon.topics import ensure_tenant_topics, tenant_topics
from graph.summary_records import recorded_summarizer
from memory import keys
from tests.conftest import unique
from tests.helpers import agentmemd, isolated_settings, settings_env, start_daemon

pytestmark = pytest.mark.integration

AGENTMEMD = str(Path(sys.executable).parent / "agentmemd")


async def keys_of(client: aredis.Redis, name: str, tenant: str) -> list[str]:
    """Every Redis key that names ``tenant`` under index ``name``, whatever its kind."""
    found = [k.decode() async for k in client.scan_iter(match=f"{name}:*:{tenant}:*", count=1000)]
    found += [k.decode() async for k in client.scan_iter(match=f"{name}:*:{tenant}", count=1000)]
    found += [k.decode() async for k in client.scan_iter(match=keys.graph_prefix(name, tenant) + ":*", count=1000)]
    return sorted(found)


async def _ack(bootstrap: str, topic: str, cid: str) -> dict[str, Any]:
    """The ack with correlation id ``cid`` on ``topic``, read from its start."""
    reader = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=5)
    await reader.start()
    try:
        for _ in range(300):
            for records in (await reader.getmany(timeout_ms=100)).values():
                for r in records:
                    if dict(r.headers).get("correlation_id") == cid.encode():
                        return dict(json.loads(r.value))
        raise AssertionError(f"no ack {cid} on {topic}")
    finally:
        await reader.stop()


async def test_an_erased_tenant_leaves_nothing_and_the_other_keeps_everything(
    kafka_bootstrap: str, redis_url: str
) -> None:
    name = unique("erase-tenant")
    consumer = ConsumerConfig(group_id=name, tenancy="topic", metadata_max_age_ms=500)
    settings = isolated_settings(
        name, kafka_bootstrap, redis_url, topic_partitions=1, topic_check_s=0.5, consumer=consumer
    )
    for tenant in ("acme", "globex"):
        await ensure_tenant_topics(settings, tenant, timeout_s=30)
    env = {**settings_env(settings), "AGENTMEM_CONSUMER__TENANCY": "topic"}
    redis = aredis.from_url(redis_url)
    daemon = await start_daemon(settings)
    clients = {
        t: MemoryClient(bootstrap=kafka_bootstrap, topics=settings.topics, tenant=t, timeout_s=30)
        for t in ("acme", "globex")
    }
    try:
        for c in clients.values():
            await c.start()
        acme, globex = clients["acme"], clients["globex"]
        await acme.publish_document(
            "runbooks/ledger.md", "ledger-service raises ERR_LEDGER_LOCK_9C1 under load.", version=1, wait=True
        )
        await acme.publish_observation(
            agent_id="ops", session_id="s1", turn=1, content="Acme's ledger-service paged twice tonight.", wait=True
        )
        await globex.publish_document(
            "runbooks/ledger.md", "globex keeps its ledger in ledger-db-02.", version=1, wait=True
        )
        # One bad event each, dead-lettered: the DLQ keeps acme's bytes after the erase, unshown.
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for tenant in ("acme", "globex"):
                cid = uuid.uuid4().hex
                asks = [("reply_to", f"{settings.topics.replies}.{tenant}".encode()), ("correlation_id", cid.encode())]
                await producer.send_and_wait(
                    f"{settings.topics.documents}.{tenant}", b"{not json of " + tenant.encode(), key=b"x", headers=asks
                )
                dead = await _ack(kafka_bootstrap, f"{settings.topics.replies}.{tenant}", cid)
                assert dead["status"] == "dead_lettered", dead
        finally:
            await producer.stop()
        letters = [json.loads(line) for line in (await agentmemd(["dlq", "list", "--json"], env)).stdout.splitlines()]
        assert sorted(d["tenant"] for d in letters) == ["acme", "globex"], letters
        (acme_letter,) = [f"{d['partition']}:{d['offset']}" for d in letters if d["tenant"] == "acme"]
        # Both marked as sent again (as `dlq replay` marks them): the erase takes acme's mark only.
        for d in letters:
            letter = DeadLetter(**{k: v for k, v in d.items() if k != "replayed"})
            await mark_replayed(redis, settings.index.name, settings.topics.dlq, letter, to=d["topic"], said="sent")
        assert (await recorded_summarizer(redis, settings.index.name) or ("",))[0] == "extractive"  # what it runs
        before = await keys_of(redis, settings.index.name, "acme")
        assert any(":chunk:acme:" in k for k in before) and any(k.startswith("{") for k in before), before
        globex_keys = await keys_of(redis, settings.index.name, "globex")

        marks = f"{settings.index.name}:dead:{settings.topics.documents}.acme:*"
        assert [k async for k in redis.scan_iter(match=marks)], "acme's dead letter left no mark"

        # Without --yes it only says what it would do; deleting topics under a running daemon is refused.
        said = await agentmemd(["erase-tenant", "acme"], env)
        assert said.returncode == 2 and "--yes" in said.stdout, said.stdout + said.stderr
        counted = re.search(r"\((\d+) key\(s\) now\)", " ".join(said.stdout.split()))
        assert counted and int(counted.group(1)) > len(before), said.stdout  # its keys and its dead letter's mark
        # A misspelt tenant is refused, not reported erased with nothing deleted.
        typo = await agentmemd(["erase-tenant", "acmee", "--yes", "--sweep", "5"], env)
        typo_said = " ".join(typo.stderr.split())
        assert typo.returncode == 1 and "no tenant 'acmee' is known here" in typo_said, typo.stdout + typo.stderr
        assert "did you mean 'acme'?" in typo_said, typo_said
        assert (await agentmemd(["erase-tenant", "acmee"], env)).returncode == 1  # its preview too
        busy = await agentmemd(["erase-tenant", "acme", "--yes", "--delete-topics"], env)
        assert busy.returncode == 1 and "daemons consume" in " ".join(busy.stderr.split()), busy.stdout + busy.stderr
        assert await keys_of(redis, settings.index.name, "acme") == before

        done = await agentmemd(["erase-tenant", "acme", "--yes", "--sweep", "6"], env)
        assert done.returncode == 0, done.stdout + done.stderr
        text = " ".join(done.stdout.split())
        assert "tenant acme erased" in text and "its events stay in" in text, text
        assert await keys_of(redis, settings.index.name, "acme") == []
        assert [k async for k in redis.scan_iter(match=marks)] == []  # its records' delivery marks too
        assert await keys_of(redis, settings.index.name, "globex") == globex_keys
        left_marks = await read_marks(redis, settings.index.name)
        assert [m.letter[0] for m in left_marks.values()] == [f"{settings.topics.documents}.globex"], left_marks
        listed = await agentmemd(["tenants", "--json"], env)
        assert listed.stdout.strip() == '["globex"]', listed.stdout
        reply = await globex.query("where does globex keep its ledger?", top_k=3)
        assert reply.results and reply.results[0].doc_id == "runbooks/ledger.md" and "globex" in reply.results[0].text

        # A producer that still writes for acme: acked ignored with the reason, nothing applied.
        late = await acme.publish_document("late.md", "a late acme note", version=1, wait=True)
        assert late.ack is not None and late.ack.status == "ignored" and "erased" in (late.ack.reason or ""), late.ack
        assert late.ack.error_code == "tenant_erased", late.ack
        assert await keys_of(redis, settings.index.name, "acme") == []
        # Its questions are refused with the reason, not answered with nothing; globex's are answered.
        for ask in (acme.query("late acme note", top_k=5), acme.get(doc_ids=["late.md"])):
            with pytest.raises(QueryFailed) as refused:
                await ask
            assert refused.value.error_code == "tenant_erased", refused.value
            assert "tenant 'acme' was erased" in str(refused.value), refused.value
        assert (await globex.query("where does globex keep its ledger?", top_k=1)).results
        # Its dead letters are neither listed nor sent again.
        shown = await agentmemd(["dlq", "list", "--json"], env)
        assert [json.loads(line)["tenant"] for line in shown.stdout.splitlines()] == ["globex"], shown.stdout
        assert "1 dead letters of erased tenants not shown" in shown.stderr, shown.stderr
        again = await agentmemd(["dlq", "replay", acme_letter], env)
        assert again.returncode == 1 and "tenant acme was erased since" in " ".join(again.stdout.split()), again.stdout

        # With the daemon stopped, its topics go too, and the next daemon does not bring them back.
        await daemon.stop()
        # tansu keeps a stopped consumer's membership until it restarts (Apache Kafka drops it at
        # once): the command is run as a deployment whose group no daemon has joined.
        quiet_env = {**env, "AGENTMEM_CONSUMER__GROUP_ID": unique("no-daemon")}
        quiet = settings.model_copy(
            update={
                "consumer": settings.consumer.model_copy(update={"group_id": quiet_env["AGENTMEM_CONSUMER__GROUP_ID"]})
            }
        )
        groups = [quiet.consumer.group(role) for role in ROLES]
        assert not any((await group_members(quiet, groups)).values())
        gone = await agentmemd(["erase-tenant", "acme", "--yes", "--delete-topics", "--sweep", "5"], quiet_env)
        assert gone.returncode == 0 and "4 topic(s) deleted" in " ".join(gone.stdout.split()), gone.stdout + gone.stderr
        daemon = await start_daemon(settings)
        await asyncio.sleep(2 * settings.topic_check_s)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            left = set(await admin.list_topics())
        finally:
            await admin.close()
        assert not left & set(tenant_topics(settings, "acme")) and set(tenant_topics(settings, "globex")) <= left

        # Its topics created again: it starts anew.
        anew = await agentmemd(["topics", "--tenant", "acme"], env)
        assert anew.returncode == 0 and "tenant acme was erased at" in " ".join(anew.stdout.split()), anew.stdout
        fresh = MemoryClient(bootstrap=kafka_bootstrap, topics=settings.topics, tenant="acme", timeout_s=60)
        await fresh.start()
        try:
            # An event recorded before the erase (a producer's late retry, a lagging consumer) never
            # comes back; nor one written while it was erased, before its topics came back: its
            # writer was told it was refused (a reindex, or a daemon behind, applied it after).
            erasure = json.loads(await redis.hget(keys.erased_key(settings.index.name), "acme"))
            for doc_id, stamp_s in (
                ("runbooks/ledger.md", erasure["at"] - 60),
                ("runbooks/between.md", (erasure["at"] + erasure["restored_at"]) / 2),
            ):
                cid = uuid.uuid4().hex
                asks = [("reply_to", f"{settings.topics.replies}.acme".encode()), ("correlation_id", cid.encode())]
                producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
                await producer.start()
                try:
                    await producer.send_and_wait(
                        f"{settings.topics.documents}.acme",
                        fresh.document_event(doc_id, f"{doc_id} says ERR_LEDGER_LOCK_9C1 again.")[1],
                        key=doc_id.encode(),
                        timestamp_ms=int(stamp_s * 1000),
                        headers=asks,
                    )
                finally:
                    await producer.stop()
                old = await _ack(kafka_bootstrap, f"{settings.topics.replies}.acme", cid)
                assert old["status"] == "ignored" and old["error_code"] == "tenant_erased", (doc_id, old)
            receipt = await fresh.publish_document("runbooks/new.md", "A new start for acme.", version=1, wait=True)
            assert receipt.ack is not None and receipt.ack.status == "indexed", receipt.ack
            assert [r.doc_id for r in (await fresh.query("new start", top_k=5)).results] == ["runbooks/new.md"]
        finally:
            await fresh.close()
    finally:
        for c in clients.values():
            await c.close()
        await daemon.stop()
        await redis.aclose()


async def test_erase_tenant_is_refused_in_single_tenancy(kafka_bootstrap: str, redis_url: str) -> None:
    settings = isolated_settings(unique("erase-single"), kafka_bootstrap, redis_url)
    said = await agentmemd(["erase-tenant", "default", "--yes"], settings_env(settings))
    assert said.returncode == 1 and "AGENTMEM_CONSUMER__TENANCY=topic" in " ".join(said.stderr.split()), said.stderr
