"""The typed client (`MemoryClient`) and `agentmemd query` against the real broker and daemon.

One daemon in topic tenancy serves the module: every query names its tenant, so each test also
shows the request reached `<requests>.<tenant>` (the bare requests topic is answered with an error there).
Reader faults are injected into the client's real aiokafka consumer, never into a fake broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from structlog.testing import capture_logs

import consumers.reply_reader
from consumers.client import MemoryClient
from consumers.errors import QueryFailed, WriteRejected
from consumers.reply_reader import LONG_WAIT_FETCH_MS
from daemon.connections import memory_client
from daemon.instance import Daemon
from daemon.settings import Settings
from memory.errors import BackendUnavailable, InvalidRequest
from tests.conftest import unique
from tests.helpers import PlainClient, eventually, in_graph, settings_env, topic_tenancy_daemon

pytestmark = pytest.mark.integration

AGENTMEMD = str(Path(sys.executable).parent / "agentmemd")
TENANT, OTHER = "acme", "globex"
WRITER = "initech"  # the tenant the publish tests write to (OTHER must stay empty)
DOCS = ("client/ledger-0.md", "client/ledger-1.md")
TEXT = "The ledger-service writes to ledger_entries; ERR_LEDGER_LOCK_9C1 means lock_timeout is too low."
TEXT2 = "Incident: ledger-service hit ERR_LEDGER_LOCK_9C1 again; we raised lock_timeout on ledger_entries."


@pytest.fixture(scope="module")
async def env(kafka_bootstrap: str, redis_url: str) -> AsyncIterator[tuple[Daemon, PlainClient, Settings]]:
    async with topic_tenancy_daemon(unique(__name__), kafka_bootstrap, redis_url, (TENANT, OTHER, WRITER)) as env:
        yield env


class InjectedConsumer(AIOKafkaConsumer):
    """The client's real reply consumer, recorded, with faults to arm: the next record fetched
    raises instead of being returned; ``stop()`` stops and then raises."""

    created: ClassVar[list[InjectedConsumer]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fail_next_record = False
        self.fail_stop = False
        InjectedConsumer.created.append(self)

    async def getone(self, *partitions: Any) -> Any:
        record = await super().getone(*partitions)
        if self.fail_next_record:
            self.fail_next_record = False
            raise KafkaError("injected reply reader failure")
        return record

    async def stop(self) -> None:
        await super().stop()
        if self.fail_stop:
            raise KafkaError("injected stop failure")

    @property
    def stopped(self) -> bool:
        return self._closed is True


@pytest.fixture
def injected(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[InjectedConsumer]]:
    """Every reply consumer the client creates during the test, in creation order."""
    InjectedConsumer.created = []
    monkeypatch.setattr(consumers.reply_reader, "AIOKafkaConsumer", InjectedConsumer)
    yield InjectedConsumer.created


def client_of(env: Any, **kw: Any) -> MemoryClient:
    _, plain, _ = env
    return MemoryClient(bootstrap=plain.bootstrap, topics=plain.topics, **kw)


def tenant_client(env: Any, **kw: Any) -> MemoryClient:
    """A client whose requests topic is TENANT's own, as a client without ``tenant=`` would
    configure it: the reader tests need nothing else of the client."""
    _, plain, _ = env
    topics = plain.topics.model_copy(update={"requests": f"{plain.topics.requests}.{TENANT}"})
    return MemoryClient(bootstrap=plain.bootstrap, topics=topics, **kw)


async def test_concurrent_first_queries_share_one_reply_reader(env, injected) -> None:
    """Queries racing to start the reply reader start one consumer, and close() stops it."""
    memory = tenant_client(env)
    await memory.start()
    try:
        replies = await asyncio.gather(*(memory.query(f"pool {i}", top_k=1) for i in range(6)))
        assert all(r.total_retrieved == len(r.results) for r in replies)
        assert len(injected) == 1
    finally:
        await memory.close()
    assert all(c.stopped for c in injected)


async def test_reader_failure_fails_the_pending_query_and_the_next_query_restarts_it(env, injected) -> None:
    """A reply reader that raises fails its waiting query at once with BackendUnavailable (not a
    timeout), is logged, and the next query gets a fresh reader that answers."""
    memory = tenant_client(env, timeout_s=5)
    await memory.start()
    producer = memory._transport._producer
    try:
        await memory.query("pool", top_k=1)
        (first,) = injected
        first.fail_next_record = True
        with capture_logs() as logs, pytest.raises(BackendUnavailable, match="reply reader"):
            await memory.query("pool", top_k=1)
        assert "client.reply_reader_failed" in [e["event"] for e in logs]
        reply = await memory.query("pool", top_k=1)
        assert reply.total_retrieved == len(reply.results)
        assert len(injected) == 2 and first.stopped and not injected[1].stopped
    finally:
        await memory.close()
    assert all(c.stopped for c in injected)
    assert producer is not None and producer._closed


async def test_close_fails_a_waiting_query_at_once(env, injected) -> None:
    """A query still waiting for its reply when the client closes fails then, with
    BackendUnavailable naming the close, not after its whole timeout."""
    memory = tenant_client(env, timeout_s=60)
    await memory.start()
    await memory.query("pool", top_k=1)  # the reader runs
    assert memory._transport._producer is not None

    async def lost(*_args: Any, **_kwargs: Any) -> Any:  # the request never reaches the daemon
        return SimpleNamespace(partition=0)  # what the broker's receipt tells of it

    memory._transport._producer.send_and_wait = lost  # type: ignore[method-assign]
    waiting = asyncio.create_task(memory.query("pool", top_k=1))

    async def waits() -> bool:
        return bool(memory._transport._replies._pending)

    await eventually(waits, timeout=10, what="the query waits for its reply")
    started = time.monotonic()
    await memory.close()
    with pytest.raises(BackendUnavailable, match="was closed"):
        await asyncio.wait_for(waiting, 10)
    assert time.monotonic() - started < 10


async def test_close_after_reader_death_stops_consumer_and_producer(env, injected) -> None:
    """close() after the reader died raises nothing and still stops the consumer and the producer."""
    memory = tenant_client(env, timeout_s=5)
    await memory.start()
    producer = memory._transport._producer
    await memory.query("pool", top_k=1)
    injected[0].fail_next_record = True
    with contextlib.suppress(BackendUnavailable, TimeoutError):
        await memory.query("pool", top_k=1)
    await memory.close()
    assert injected[0].stopped
    assert producer is not None and producer._closed


async def test_close_stops_the_producer_when_the_consumer_fails_to_stop(env, injected) -> None:
    """A reply consumer whose stop() raises is logged, and the producer is stopped anyway."""
    memory = tenant_client(env)
    await memory.start()
    producer = memory._transport._producer
    await memory.query("pool", top_k=1)
    injected[0].fail_stop = True
    with capture_logs() as logs:
        await memory.close()
    assert "client.stop_failed" in [e["event"] for e in logs]
    assert producer is not None and producer._closed


async def _ledger_indexed(daemon: Daemon, plain: PlainClient) -> None:
    """The two ledger docs in TENANT's memory, summarized into a community (once per module)."""
    if await daemon.index.chunk_ids(DOCS[-1], TENANT):
        return
    for doc_id, text in zip(DOCS, (TEXT, TEXT2), strict=True):
        event = {"event_id": doc_id, "op": "upsert", "doc_id": doc_id, "version": 1, "content": text}
        await plain.send(f"{plain.topics.documents}.{TENANT}", event, key=doc_id)

    async def indexed() -> bool:
        return all([await daemon.index.chunk_ids(d, TENANT) for d in DOCS]) and await in_graph(daemon, DOCS, TENANT)

    await eventually(indexed, timeout=60, what="the tenant's docs indexed and in its graph")
    assert daemon.graph is not None
    service = daemon.graph.service(TENANT)
    await service.recompute(force=True)

    async def summarized() -> bool:
        return (await service.store.stale())[0] == 0

    await eventually(summarized, timeout=60, what="the tenant's communities summarized")


async def test_a_client_without_its_tenant_is_told_the_bare_topics_name_none(env) -> None:
    """In topic tenancy the bare topics name no tenant: a client that forgot its tenant (and was
    not told the tenancy) gets its question refused and its write dead-lettered, each saying why."""
    _, _, settings = env
    async with MemoryClient(bootstrap=settings.kafka_bootstrap, topics=settings.topics, timeout_s=30) as lost:
        with pytest.raises(QueryFailed, match="names no tenant"):
            await lost.query("vault_token")
        with pytest.raises(WriteRejected, match="names no tenant"):
            await lost.publish_document("lost/doc.md", "this topic names no tenant", wait=True)


async def test_a_call_nobody_answers_times_out_saying_where_it_asked(env) -> None:
    """A TimeoutError names the topic the call wrote to, and a write's says it was sent and on
    which partition it waits (a write waits for what came before it there)."""
    _, _, settings = env
    unread = settings.topics.model_copy(
        update={"requests": f"{settings.topics.requests}-unread", "documents": f"{settings.topics.documents}-unread"}
    )
    async with MemoryClient(bootstrap=settings.kafka_bootstrap, topics=unread, timeout_s=2) as lost:
        with pytest.raises(TimeoutError, match=rf"no reply .* reading {re.escape(unread.requests)}\?"):
            await lost.query("vault_token")
        with pytest.raises(
            TimeoutError, match=rf"may still be applied.* reading {re.escape(unread.documents)}\? .* partition \d"
        ):
            await lost.publish_document("lost/doc.md", "nobody reads this topic", wait=True)


async def test_query_sends_scope_identifier_weight_and_tenant(env) -> None:
    """query() sends scope and hybrid_params.identifier_weight, and asks the named tenant only."""
    daemon, plain, _ = env
    await _ledger_indexed(daemon, plain)
    async with client_of(env) as memory:
        weights = {"dense_weight": 1.0, "sparse_weight": 1.0, "identifier_weight": 2.5}
        reply = await memory.query("ERR_LEDGER_LOCK_9C1", top_k=1, tenant=TENANT, rrf_k=60, **weights)
        (hit,) = reply.results
        assert hit.doc_id in DOCS and set(hit.ranks) == {"dense", "sparse", "identifier"}
        leg_weight = {"dense": 1.0, "sparse": 1.0, "identifier": 2.5}
        assert hit.rrf_score == pytest.approx(sum(leg_weight[k] / (60 + r) for k, r in hit.ranks.items()))
        off = await memory.query("ERR_LEDGER_LOCK_9C1", top_k=3, tenant=TENANT, identifier_weight=0.0)
        assert off.results and all("identifier" not in r.ranks for r in off.results)

        chunks = await memory.query("ledger lock timeouts", top_k=5, tenant=TENANT, scope="chunks")
        assert chunks.results and {r.kind for r in chunks.results} == {"document"}
        comms = await memory.query("ledger lock timeouts", top_k=5, tenant=TENANT, scope="communities")
        assert comms.results and {r.kind for r in comms.results} == {"community"}
        both = await memory.query("ledger lock timeouts", top_k=10, tenant=TENANT, scope="all")
        assert {r.kind for r in both.results} == {"document", "community"}

        other = await memory.query("ERR_LEDGER_LOCK_9C1", top_k=5, tenant=OTHER, scope="all")
        assert other.results == []
        with pytest.raises(InvalidRequest, match="tenant"):
            await memory.query("x", tenant="a.b")


async def test_memory_client_reads_the_settings_the_cli_reads(env, monkeypatch: pytest.MonkeyPatch) -> None:
    """``daemon.connections.memory_client()`` takes its broker and topics from the AGENTMEM_
    variables, as the CLI does: with the module's daemon's, it asks that daemon; with another
    requests topic, nobody answers."""
    daemon, plain, settings = env
    await _ledger_indexed(daemon, plain)
    for name, value in settings_env(settings).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AGENTMEM_CONSUMER__TENANCY", "topic")
    async with memory_client(tenant=TENANT) as memory:
        reply = await memory.query("ERR_LEDGER_LOCK_9C1", top_k=1)
    assert [r.doc_id for r in reply.results][:1] in ([d] for d in DOCS)
    monkeypatch.setenv("AGENTMEM_TOPICS__REQUESTS", f"{settings.topics.requests}-elsewhere")
    async with memory_client(tenant=TENANT, timeout_s=2) as lost:
        with pytest.raises(TimeoutError, match=r"-elsewhere"):
            await lost.query("ERR_LEDGER_LOCK_9C1")


async def test_query_selects_a_time_range_and_replies_say_when(env) -> None:
    """publish_document(timestamp=) sets a memory's time, query(since=, until=) selects on it
    inside the daemon, and every result carries its timestamp."""
    then = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    async with client_of(env, tenant=TENANT) as memory:
        text = "June postmortem: the ledger-service hit ERR_LEDGER_JUNE_7"
        await memory.publish_document("client/june", text, timestamp=then)

        async def found() -> bool:
            return bool((await memory.query("ERR_LEDGER_JUNE_7", top_k=3, until=then)).results)

        await eventually(found, timeout=60, what="the June doc indexed")
        june = await memory.query("ledger-service ERR_LEDGER_JUNE_7", top_k=10, until=then + timedelta(days=1))
        assert [r.doc_id for r in june.results if r.kind == "document"] == ["client/june"]
        assert june.results[0].timestamp == "2026-06-01T12:00:00Z"
        later = await memory.query("ledger-service ERR_LEDGER_JUNE_7", top_k=10, since=then + timedelta(seconds=1))
        assert "client/june" not in {r.doc_id for r in later.results}
        assert all(r.timestamp is not None and r.timestamp > "2026-06-01T12:00:00Z" for r in later.results)
        with pytest.raises(QueryFailed, match="since is after"):
            await memory.query("ledger", since=then, until=then - timedelta(days=1))


async def _agentmemd(settings: Settings, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, **settings_env(settings), "AGENTMEM_CONSUMER__TENANCY": "topic", "COLUMNS": "200"}
    proc = await asyncio.create_subprocess_exec(
        AGENTMEMD, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _end_offset(bootstrap: str, topic: str) -> int:
    tp = TopicPartition(topic, 0)
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await reader.start()
    try:
        return int((await reader.end_offsets([tp]))[tp])
    finally:
        await reader.stop()


async def test_cli_query_takes_scope_identifier_weight_and_tenant(env) -> None:
    """`agentmemd query --tenant --scope --identifier-weight` asks that tenant with those params,
    and reads the reply on the tenant's own reply topic."""
    daemon, plain, settings = env
    await _ledger_indexed(daemon, plain)
    tenant_replies = f"{settings.topics.replies}.{TENANT}"
    before = await _end_offset(plain.bootstrap, tenant_replies)
    rc, out, err = await _agentmemd(
        settings, "query", "ERR_LEDGER_LOCK_9C1", "--tenant", TENANT, "--identifier-weight", "0", "--json"
    )
    assert rc == 0, err
    reply = json.loads(out)
    # Both docs naming it are found (another test's doc may share its words, "err" and "ledger").
    assert set(DOCS) <= {r["doc_id"] for r in reply["results"]}, reply["results"]
    assert all("identifier" not in r["ranks"] for r in reply["results"])
    rc, out, err = await _agentmemd(
        settings, "query", "ledger lock timeouts", "--tenant", TENANT, "--scope", "communities", "--json"
    )
    assert rc == 0, err
    reply = json.loads(out)
    assert reply["results"] and {r["kind"] for r in reply["results"]} == {"community"}
    rc, out, err = await _agentmemd(settings, "query", "ledger lock timeouts", "--tenant", TENANT, "--scope", "all")
    assert rc == 0, err
    assert "community:" in out and "client/ledger-" in out
    assert await _end_offset(plain.bootstrap, tenant_replies) == before + 3


async def test_cli_query_in_topic_tenancy_needs_a_tenant_and_its_reply_topic(env) -> None:
    """Without --tenant, or without the tenant's reply topic, topic tenancy fails at once saying
    why (instead of waiting out the timeout)."""
    _, _, settings = env
    rc, _out, err = await _agentmemd(settings, "query", "pool")
    assert rc == 2 and "--tenant" in err
    rc, _out, err = await _agentmemd(settings, "query", "pool", "--tenant", "nobody")
    assert rc == 1 and f"{settings.topics.replies}.nobody" in err and "does not exist" in err


async def test_a_tenants_client_publishes_deletes_and_asks_in_that_tenants_memory(env) -> None:
    """``MemoryClient(tenant=...)`` publishes docs, deletes and observations on the tenant's
    topics (the bare ones are read by nobody in topic tenancy) and reads its replies on
    ``<replies>.<tenant>``."""
    daemon, plain, settings = env
    doc = "client/writer-runbook.md"
    text = "Rotate the kestrel-gateway certificate with KGW_ROTATE_77 before it expires."
    tenant_replies = f"{settings.topics.replies}.{WRITER}"
    async with MemoryClient(bootstrap=plain.bootstrap, topics=plain.topics, tenant=WRITER) as memory:
        await memory.publish_document(doc, text, version=1)
        await memory.publish_observation(
            agent_id="agent-7", session_id="s-1", turn=1, content="Rotated KGW_ROTATE_77 on the kestrel-gateway."
        )

        async def stored() -> bool:
            return bool(await daemon.index.chunk_ids(doc, WRITER)) and bool(
                await daemon.index.chunk_ids("transcript:agent-7/s-1/1", WRITER)
            )

        await eventually(stored, timeout=60, what="the tenant's doc and observation indexed")
        assert not await daemon.index.chunk_ids(doc, TENANT) and not await daemon.index.chunk_ids(doc, "default")

        before = await _end_offset(plain.bootstrap, tenant_replies)
        reply = await memory.query("KGW_ROTATE_77", top_k=5)
        assert {r.doc_id for r in reply.results} >= {doc}
        assert await _end_offset(plain.bootstrap, tenant_replies) == before + 1

        await memory.delete_document(doc, version=2)

        async def deleted() -> bool:
            return not await daemon.index.chunk_ids(doc, WRITER)

        await eventually(deleted, timeout=60, what="the tenant's doc deleted")
    with pytest.raises(InvalidRequest, match="tenant"):
        MemoryClient(bootstrap=plain.bootstrap, topics=plain.topics, tenant="a.b")


async def test_a_query_gets_the_turns_around_each_transcript_result(env) -> None:
    """With context_turns, a transcript result carries the turns before and after it in its session, in order,
    whole, each with its role; a turn the request's filter excludes is left out."""
    daemon, plain, _ = env
    said = [
        ("user", "production", "Melanie: Did you finish the pottery class?"),
        ("assistant", "production", "Caroline: Almost, one glaze left."),
        ("user", "production", "Melanie: What colour is the kestrel-teapot KTP_42 glaze?"),
        ("assistant", "staging", "Caroline: A staging note nobody filtered in."),
        ("user", "production", "Melanie: Lovely, show me on Sunday."),
    ]
    async with MemoryClient(bootstrap=plain.bootstrap, topics=plain.topics, tenant=WRITER) as memory:
        for n, (role, env_name, text) in enumerate(said, start=1):
            await memory.publish_observation(
                agent_id="ctx-agent",
                session_id="s",
                turn=n,
                role=role,
                content=text,
                metadata={"environment": env_name},
            )

        async def stored() -> bool:
            return bool(await daemon.index.chunk_ids("transcript:ctx-agent/s/5", WRITER))

        await eventually(stored, timeout=60, what="the session's turns indexed")
        reply = await memory.query(
            "KTP_42 glaze colour", top_k=1, metadata_filter={"environment": "production"}, context_turns=2
        )
        [hit] = reply.results
        assert hit.doc_id == "transcript:ctx-agent/s/3" and hit.text == said[2][2]
        assert hit.context is not None
        assert [(c.turn, c.role, c.text) for c in hit.context] == [
            (1, "user", said[0][2]),
            (2, "assistant", said[1][2]),
            (5, "user", said[4][2]),
        ]
        plain_reply = await memory.query("KTP_42 glaze colour", top_k=1)
        assert plain_reply.results[0].context is None


async def test_get_looks_memories_up_by_id_within_the_tenant_and_filter(env) -> None:
    """A get answers each doc or turn asked for, in order: its current version, whole content, metadata and time,
    or not_found for one never stored, deleted, outside the filter or another tenant's."""
    daemon, plain, _ = env
    # Markdown whose chunks end at blank lines and line breaks: read back exactly, not joined by
    # spaces, down to the indent it opens with and the newline it ends with.
    steps = (
        f"## Step {n}\n\nCheck the kestrel-gateway pool and restart it.\n- then  verify\tpool {n}." for n in range(60)
    )
    long_text = "\n\n    " + "\n\n".join(steps) + "\n"
    trace = '  File "x.py", line 3, in rotate\n    keys.rotate()\n'  # a tool's output, indent and all
    async with (
        MemoryClient(bootstrap=plain.bootstrap, topics=plain.topics, tenant=WRITER) as memory,
        MemoryClient(bootstrap=plain.bootstrap, topics=plain.topics, tenant=OTHER) as other,
    ):
        await memory.publish_document("get/runbook.md", "first draft", version=1, metadata={"service": "kestrel"})
        await memory.publish_document("get/runbook.md", long_text, version=2, metadata={"service": "kestrel"})
        await memory.publish_document("get/gone.md", "soon deleted", version=1)
        await memory.delete_document("get/gone.md", version=2)
        await memory.publish_observation(agent_id="getter", session_id="s/1", turn=3, content=trace)
        await other.publish_document("get/theirs.md", "another tenant's", version=1)

        async def stored() -> bool:
            chunks = await daemon.index.chunk_ids("get/runbook.md", WRITER)
            return (
                len(chunks) > 1
                and bool(await daemon.index.chunk_ids("transcript:getter/s%2F1/3", WRITER))
                and not await daemon.index.chunk_ids("get/gone.md", WRITER)
                and bool(await daemon.index.chunk_ids("get/theirs.md", OTHER))
            )

        await eventually(stored, timeout=90, what="the docs and the turn indexed")
        reply = await memory.get(
            ["get/runbook.md", "get/gone.md", "get/never.md", "get/theirs.md"], turns=[("getter", "s/1", 3)]
        )
        by_id = {i.doc_id: i for i in reply.items}
        assert [i.doc_id for i in reply.items] == [
            "get/runbook.md",
            "get/gone.md",
            "get/never.md",
            "get/theirs.md",
            "transcript:getter/s%2F1/3",
        ]
        doc = by_id["get/runbook.md"]
        assert (doc.status, doc.version, doc.kind, doc.content) == ("found", 2, "document", long_text)
        assert doc.metadata == {"service": "kestrel"} and doc.timestamp is not None
        for missing in ("get/gone.md", "get/never.md", "get/theirs.md"):
            assert by_id[missing].status == "not_found" and by_id[missing].content is None
        turn = by_id["transcript:getter/s%2F1/3"]
        assert (turn.status, turn.kind, turn.content, turn.version) == (
            "found",
            "transcript",
            trace,
            None,
        )
        # the wire's shape is taken too (a triple's unpacking of a dict's keys came back as
        # "turns.0.turn: Input should be a valid integer")
        wire = await memory.get(turns=[{"agent_id": "getter", "session_id": "s/1", "turn": 3}])
        assert wire.items[0].status == "found" and wire.items[0].content == trace
        with pytest.raises(InvalidRequest, match=r"turns: .* is not \(agent_id, session_id, turn\)"):
            await memory.get(turns=["getter/s/1/3"])  # type: ignore[list-item]
        filtered = await memory.get(["get/runbook.md"], metadata_filter={"service": "other"})
        assert filtered.items[0].status == "not_found"
        kept = await memory.get(["get/runbook.md"], metadata_filter={"service": {"not": "other"}})
        assert kept.items[0].status == "found"
        with pytest.raises(QueryFailed, match=r"metadata_filter\['service'\]: an object's one key is 'not'"):
            await memory.get(["get/runbook.md"], metadata_filter={"service": {"ne": "other"}})  # type: ignore[dict-item]
        with pytest.raises(QueryFailed, match=r"1\.\.100"):
            await memory.get([])


async def test_cli_publish_in_topic_tenancy_needs_a_tenant_and_writes_to_its_topics(env, tmp_path: Path) -> None:
    """`agentmemd publish doc|delete|observation` fail at once without --tenant in topic tenancy
    (the record would be lost on the bare topic), and with it land in that tenant's memory."""
    daemon, _, settings = env
    path = tmp_path / "cli-writer.md"
    path.write_text("The osprey-batch job retries OSP_RETRY_5 three times.", encoding="utf-8")
    for args in (
        ("publish", "doc", str(path)),
        ("publish", "delete", "x.md"),
        ("publish", "observation", "hi", "--agent-id", "a", "--session-id", "s", "--turn", "1"),
    ):
        rc, _out, err = await _agentmemd(settings, *args)
        assert rc == 2 and "--tenant" in err, (args, err)
    rc, _out, err = await _agentmemd(
        settings, "publish", "doc", str(path), "--doc-id", "cli/osprey.md", "--tenant", WRITER
    )
    assert rc == 0, err

    async def stored() -> bool:
        return bool(await daemon.index.chunk_ids("cli/osprey.md", WRITER))

    await eventually(stored, timeout=60, what="the CLI's doc in the tenant's memory")
    rc, _out, err = await _agentmemd(settings, "publish", "delete", "cli/osprey.md", "--tenant", WRITER)
    assert rc == 0, err

    async def deleted() -> bool:
        return not await daemon.index.chunk_ids("cli/osprey.md", WRITER)

    await eventually(deleted, timeout=60, what="the CLI's delete in the tenant's memory")
    # A misspelt tenant, without --wait: refused before sending (a broker that creates topics
    # on first use would take it, and the daemon would make a tenant of it).
    misspelt = WRITER + "x"
    rc, _out, err = await _agentmemd(
        settings, "publish", "doc", str(path), "--doc-id", "cli/t.md", "--tenant", misspelt
    )
    said = " ".join(err.split())
    assert rc != 0 and f"{settings.topics.documents}.{misspelt}' does not exist" in said, err
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        assert f"{settings.topics.documents}.{misspelt}" not in await admin.list_topics()
    finally:
        await admin.close()


async def test_cli_publishes_a_directorys_text_files_and_says_what_it_skipped(env, tmp_path: Path) -> None:
    """`publish doc DIR --wait` publishes every text file under DIR, each named by its path,
    leaves hidden files and directories out, skips a binary file and says so, and waits for
    every ack (sent together, not one after another)."""
    daemon, _, settings = env
    root = tmp_path / "runbooks"
    (root / "db").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "pager.md").write_text("Page the on-call when PGR_ESC_7 fires twice.", encoding="utf-8")
    (root / "db" / "vacuum.md").write_text("Run VACUUM FULL on ledger_entries monthly.", encoding="utf-8")
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main", encoding="utf-8")
    (root / ".draft.md").write_text("not ready", encoding="utf-8")
    (root / "db" / "empty.md").write_text("\n", encoding="utf-8")
    (root / "diagram.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(128, 256)))
    rc, out, err = await _agentmemd(settings, "publish", "doc", str(root), "--tenant", WRITER, "--wait")
    assert rc == 0, err
    said = " ".join(err.split())
    assert "skipped 2 file(s) holding no text" in said and "diagram.png" in said and "empty.md" in said, err
    assert "published 2 document(s): 2 indexed" in " ".join(out.split()), out
    for doc in (str(root / "pager.md"), str(root / "db" / "vacuum.md")):
        assert await daemon.index.chunk_ids(doc, WRITER), doc  # searchable once acked
    for hidden in (root / ".git" / "HEAD", root / ".draft.md", root / "diagram.png", root / "db" / "empty.md"):
        assert not await daemon.index.chunk_ids(str(hidden), WRITER), hidden


async def test_a_bulk_publish_nobody_acks_fails_after_its_timeout_saying_what_was_sent(env, tmp_path: Path) -> None:
    """Many documents wait for each other's embedding, so --timeout bounds the time without any
    ack, not each ack: with nobody reading (a documents topic no daemon reads), the command fails
    after it, and says how many it sent unacknowledged."""
    _, _, settings = env
    for n in range(3):
        (tmp_path / f"n{n}.md").write_text(f"note {n} about the kestrel rotation", encoding="utf-8")
    cli_env = {
        **os.environ,
        **settings_env(settings),
        "AGENTMEM_CONSUMER__TENANCY": "single",
        "AGENTMEM_TOPICS__DOCUMENTS": f"{settings.topics.documents}-unread",
        "COLUMNS": "200",
    }
    proc = await asyncio.create_subprocess_exec(
        AGENTMEMD, "publish", "doc", str(tmp_path), "--wait", "--timeout", "2",
        env=cli_env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _out, err = await asyncio.wait_for(proc.communicate(), timeout=90)
    said = " ".join(err.decode().split())
    assert proc.returncode == 1, said
    assert "no acknowledgement from the memory daemon for 2 s" in said, said
    assert "0 of 3 document(s) published (3 more sent, and may still be applied) before this failure" in said, said


async def _total_end_offset(plain: PlainClient, topic: str) -> int:
    tps = [TopicPartition(topic, p) for p in await plain.producer.partitions_for(topic)]
    reader = AIOKafkaConsumer(bootstrap_servers=plain.bootstrap)
    await reader.start()
    try:
        return sum((await reader.end_offsets(tps)).values())
    finally:
        await reader.stop()


async def test_cli_publish_refuses_a_binary_or_empty_file_before_sending_any(env, tmp_path: Path) -> None:
    """`publish doc` reads and checks every file before sending any: a non-UTF-8 file or an
    empty one is an error naming the file, not a traceback after the files before it were
    sent, nor a publish reported done and then dead-lettered unseen."""
    _daemon, plain, settings = env
    good, binary, empty = tmp_path / "good.md", tmp_path / "blob.dat", tmp_path / "empty.md"
    good.write_text("The heron-sync job logs HRN_SYNC_42 on retry.", encoding="utf-8")
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(128, 256)))
    empty.write_text("", encoding="utf-8")
    # Valid UTF-8, yet no text: a NUL, or control characters throughout (a PDF's streams).
    nul, pdf = tmp_path / "nul.md", tmp_path / "report.pdf"
    nul.write_bytes(b"\x00\x01binary")
    pdf.write_bytes(b"%PDF-1.4\n" + bytes(range(1, 128)) * 4)
    topic = f"{settings.topics.documents}.{WRITER}"
    before = await _total_end_offset(plain, topic)
    bad_files = (
        (binary, "is not UTF-8 text"),
        (empty, "content is empty"),
        (nul, "looks binary"),
        (pdf, "looks binary"),
    )
    for bad, why in bad_files:
        rc, _out, err = await _agentmemd(settings, "publish", "doc", str(good), str(bad), "--tenant", WRITER)
        assert rc == 1 and why in err and bad.name in err and "Traceback" not in err, (bad, rc, err)
    assert await _total_end_offset(plain, topic) == before, "a file was sent before the bad one was found"


async def test_a_reader_waiting_long_for_an_ack_fetches_less_often(env) -> None:
    """A write's ack awaited past a second: the reply reader's fetches wait longer (a client
    waiting minutes for a large document's ack polled 140 times a second); a new request sets
    the short wait again."""
    _, _, settings = env
    unread = settings.topics.model_copy(
        update={"requests": f"{settings.topics.requests}-slow", "documents": f"{settings.topics.documents}-slow"}
    )
    async with MemoryClient(bootstrap=settings.kafka_bootstrap, topics=unread, timeout_s=8) as lost:
        reader = lost._transport._replies
        write = asyncio.create_task(lost.publish_document("slow/doc.md", "nobody reads this topic", wait=True))
        await asyncio.sleep(0.3)
        assert reader.fetch_wait_ms == 5  # awaited less than a second
        # Polled, not slept: on a loaded machine the first check may come late.

        async def slowed() -> bool:
            return reader.fetch_wait_ms == LONG_WAIT_FETCH_MS

        await eventually(slowed, timeout=5, what="the reader's fetches wait longer")
        assert reader._consumer is not None and reader._consumer._fetcher._fetch_max_wait_ms == LONG_WAIT_FETCH_MS
        ask = asyncio.create_task(lost.query("vault_token"))
        await asyncio.sleep(0.3)
        assert reader.fetch_wait_ms == 5 and reader._consumer._fetcher._fetch_max_wait_ms == 5
        for task in (write, ask):
            with pytest.raises(TimeoutError):
                await task
