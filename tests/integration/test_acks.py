"""Write acknowledgements through the real broker, daemon and Redis: a write waited for is
found by the very next query, a stale version is acked ``ignored``, a refused event
``dead_lettered`` with its reason, an ack that cannot go holds nothing up, and a redelivery of
an event already written (a crash between write and ack) is acked ``indexed`` without a
second write."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aredis

from consumers.client import MemoryClient
from consumers.errors import WriteRejected
from consumers.events import DocumentEvent
from daemon.instance import Daemon
from daemon.settings import Settings
from daemon.topics import ensure_topics
from memory.config import ChunkingConfig, IndexConfig, IngestConfig
from memory.filters import BASE_FILTER_KEYS
from memory.index import ChunkIndex
from memory.ingest import Ingestor
from tests.conftest import unique
from tests.helpers import PlainClient, daemon_and_client, isolated_settings, settings_env, start_daemon

pytestmark = pytest.mark.integration

AGENTMEMD = str(Path(sys.executable).parent / "agentmemd")
RUNBOOK = "Runbook: when ledger-service raises ERR_LEDGER_LOCK_9C1, raise lock_timeout on ledger_entries to 30s."


@pytest.fixture(scope="module")
async def env(kafka_bootstrap: str, redis_url: str) -> AsyncIterator[tuple[Daemon, PlainClient, MemoryClient]]:
    settings = isolated_settings(unique(__name__), kafka_bootstrap, redis_url)
    async with daemon_and_client(settings) as (daemon, plain):
        client = MemoryClient(bootstrap=kafka_bootstrap, topics=settings.topics, timeout_s=20)
        await client.start()
        try:
            yield daemon, plain, client
        finally:
            await client.close()


async def test_a_write_waited_for_is_found_by_the_next_query(env: Any) -> None:
    _daemon, _plain, client = env
    doc = f"acks/{uuid.uuid4().hex[:8]}.md"
    receipt = await client.publish_document(doc, RUNBOOK, version=3, wait=True)
    assert receipt.ack is not None
    assert (receipt.ack.status, receipt.ack.doc_id, receipt.ack.version) == ("indexed", doc, 3)
    assert receipt.ack.event_id == receipt.event_id and (receipt.ack.chunks, receipt.ack.embedded) == (1, 1)
    # the same text again, a new version: written anew, its vector reused, and the ack says so
    again_v4 = await client.publish_document(doc, RUNBOOK, version=4, wait=True)
    assert again_v4.ack is not None and (again_v4.ack.chunks, again_v4.ack.embedded) == (1, 0)
    # No sleep, no polling: the ack means searchable.
    reply = await client.query("ERR_LEDGER_LOCK_9C1 lock_timeout", top_k=3)
    assert doc in [r.doc_id for r in reply.results]

    agent = f"agent-{uuid.uuid4().hex[:6]}"
    said = await client.publish_observation(
        agent_id=agent, session_id="s1", turn=0, content="We agreed to ship the beta on Friday.", wait=True
    )
    assert said.ack is not None and said.ack.status == "indexed" and said.ack.doc_id == said.doc_id
    found = await client.query("when do we ship the beta", top_k=3, metadata_filter={"agent_id": agent})
    assert [r.doc_id for r in found.results] == [said.doc_id]

    forgot = await client.forget(agent_id=agent, session_id="s1", wait=True)
    assert forgot.ack is not None and (forgot.ack.status, forgot.ack.forgotten) == ("indexed", 1)
    after = await client.query("when do we ship the beta", top_k=3, metadata_filter={"agent_id": agent})
    assert after.results == []
    # Forgetting again (or a session never written) removes nothing, and did all it had to.
    again = await client.forget(agent_id=agent, session_id="s1", wait=True)
    assert again.ack is not None and (again.ack.status, again.ack.chunks, again.ack.forgotten) == ("indexed", 0, 0)

    gone = await client.delete_document(doc, version=5, wait=True)
    assert gone.ack is not None and (gone.ack.status, gone.ack.chunks, gone.ack.removed) == ("indexed", 0, 1)
    looked = await client.get([doc])
    assert looked.items[0].status == "not_found"
    # A delete of a doc never written (a misspelt id) removes nothing and says so.
    typo = await client.delete_document(doc + ".typo", version=1, wait=True)
    assert typo.ack is not None and (typo.ack.status, typo.ack.removed) == ("indexed", 0)
    # A redelivery of the delete already applied wrote nothing now: no count.
    again_gone = await client.delete_document(doc, version=5, wait=True)
    assert again_gone.ack is not None and (again_gone.ack.status, again_gone.ack.removed) == ("indexed", None)


async def test_a_stale_version_is_acked_ignored_and_changes_nothing(env: Any) -> None:
    _daemon, _plain, client = env
    doc = f"acks/{uuid.uuid4().hex[:8]}.md"
    await client.publish_document(doc, "version ten: lock_timeout is 30s", version=10, wait=True)
    old = await client.publish_document(doc, "version five: lock_timeout is 5s", version=5, wait=True)
    assert old.ack is not None
    assert (old.ack.status, old.ack.stored_version, old.ack.chunks) == ("ignored", 10, None)
    assert old.ack.reason and "older" in old.ack.reason
    looked = await client.get([doc])
    assert (looked.items[0].version, looked.items[0].content) == (10, "version ten: lock_timeout is 30s")


async def test_a_version_reused_for_other_content_is_acked_ignored_with_the_reason(env: Any) -> None:
    """A producer that picks versions by the second can send two edits under one version: the
    second is not the one stored, and its ack says so instead of "indexed". A copy (a retry)
    is still indexed, one at a time or in one batch."""
    _daemon, plain, client = env
    doc = f"acks/{uuid.uuid4().hex[:8]}.md"
    meta = {"service": "ledger-service", "priority": 3, "ratio": 0.25, "paged": True, "note": "é\u00a0x"}
    first = await client.publish_document(doc, RUNBOOK + "\n\n  Indented.\n", version=7, metadata=meta, wait=True)
    assert first.ack is not None and first.ack.status == "indexed"
    retry = await client.publish_document(doc, RUNBOOK + "\n\n  Indented.\n", version=7, metadata=meta, wait=True)
    assert retry.ack is not None and (retry.ack.status, retry.ack.reason) == ("indexed", None)
    for content, metadata, what in (
        ("Runbook: something else entirely.", meta, "content"),
        (RUNBOOK + "\n\n  Indented.\n", {**meta, "priority": 4}, "metadata"),
    ):
        other = await client.publish_document(doc, content, version=7, metadata=metadata, wait=True)
        assert other.ack is not None and other.ack.status == "ignored", other.ack
        assert f"already written with another {what}" in (other.ack.reason or ""), other.ack
        assert other.ack.error_code == "version_conflict", other.ack
    looked = await client.get([doc])
    assert (looked.items[0].content, looked.items[0].metadata["priority"]) == (RUNBOOK + "\n\n  Indented.\n", 3)
    # Two events of one new version in one batch: the first is written, the second refused.
    batch_doc = f"acks/{uuid.uuid4().hex[:8]}.md"
    cids = [uuid.uuid4().hex for _ in range(3)]
    for cid, content in zip(cids, ("content A", "content B", "content A"), strict=True):
        event = {"event_id": cid, "op": "upsert", "doc_id": batch_doc, "version": 5, "content": content}
        headers = [("reply_to", plain.reply_topic.encode()), ("correlation_id", cid.encode())]
        await plain.send(plain.topics.documents, event, key=batch_doc, headers=headers)
    acks = [(await plain.reply(cid))[1] for cid in cids]
    assert [a["status"] for a in acks] == ["indexed", "ignored", "indexed"], acks
    assert "another content" in acks[1]["reason"]
    assert (await client.get([batch_doc])).items[0].content == "content A"


async def test_a_refused_event_is_acked_dead_lettered_with_its_reason(env: Any) -> None:
    _daemon, plain, _client = env
    t = plain.topics
    for payload, why in (
        ({"event_id": "e-bad-1", "op": "upsert", "doc_id": "acks/x.md", "version": "3", "content": "x"}, "version"),
        (b"{not json", "JSON"),
        ({"event_id": "e-bad-2", "op": "upsert", "doc_id": "acks/y.md", "version": 1, "content": "\u200b"}, "token"),
        (
            {"event_id": "e-bad-3", "op": "upsert", "doc_id": "acks/z.md", "version": 1, "content": "z"}
            | {"timestamp": (datetime.now(UTC) + timedelta(days=30)).isoformat()},
            "after its Kafka record's time",
        ),
    ):
        cid = uuid.uuid4().hex
        headers = [("reply_to", plain.reply_topic.encode()), ("correlation_id", cid.encode())]
        await plain.send(t.documents, payload, key="acks/bad", headers=headers)
        _h, ack = await plain.reply(cid)
        assert ack["status"] == "dead_lettered", ack
        assert why.lower() in (ack["reason"] or "").lower(), ack
        assert ack["error_code"]
        if isinstance(payload, dict):  # named as the event named itself, though it never decoded
            assert (ack["event_id"], ack["doc_id"]) == (payload["event_id"], payload["doc_id"])
            valid = payload["version"] if isinstance(payload["version"], int) else None
            assert ack["version"] == valid, ack  # "3", a string, names no version
    # A turn refused is named by where it was said (a turn's event has no doc_id).
    cid = uuid.uuid4().hex
    turn = {"event_id": "e-bad-4", "agent_id": "ops", "session_id": "s-1", "turn": 3, "role": "", "content": "hi"}
    headers = [("reply_to", plain.reply_topic.encode()), ("correlation_id", cid.encode())]
    await plain.send(t.transcripts, turn, key="ops/s-1", headers=headers)
    _h, ack = await plain.reply(cid)
    assert (ack["status"], ack["doc_id"]) == ("dead_lettered", "transcript:ops/s-1/3"), ack


async def test_a_write_that_waits_raises_when_dead_lettered(env: Any) -> None:
    """The client refuses what it knows the daemon would dead-letter before sending; what gets
    through and is dead-lettered all the same raises ``WriteRejected`` with the ack's reason."""
    _daemon, _plain, client = env
    with pytest.raises(WriteRejected) as caught:
        await client._transport.publish(
            client.topics.documents, b'{"op": "upsert"}', "acks/raw", wait=True, timeout_s=20
        )
    assert caught.value.ack.status == "dead_lettered" and caught.value.ack.reason


async def test_an_ack_whose_headers_name_nowhere_goes_where_a_querys_error_would(env: Any) -> None:
    """A reply_to that is no topic, an input or missing: the ack goes to the default reply
    topic, as a query's error reply does; a reply_partition that does not exist: to reply_to
    unpartitioned. Neither holds anything up, and none goes into an input topic."""
    daemon, plain, client = env
    t = plain.topics
    assert plain.reply_topic == t.replies  # this test reads the default reply topic
    doc_a, doc_b = f"acks/{uuid.uuid4().hex[:8]}-a.md", f"acks/{uuid.uuid4().hex[:8]}-b.md"
    routes = [
        [("reply_to", ("no-such-topic-" + uuid.uuid4().hex[:6]).encode())],
        [("reply_to", t.documents.encode())],
        [("reply_to", b"bad topic name!")],
        [("reply_to", t.replies.encode()), ("reply_partition", b"99")],
    ]
    cids = [uuid.uuid4().hex for _ in routes]
    for version, (cid, route) in enumerate(zip(cids, routes, strict=True), start=1):
        event = DocumentEvent(event_id=cid, op="upsert", doc_id=doc_a, version=version, content=RUNBOOK)
        headers = [*route, ("correlation_id", cid.encode())]
        await plain.send(t.documents, event.model_dump(mode="json", exclude_none=True), key=doc_a, headers=headers)
    # The next event on the same partition is applied and acked: nothing waited on the first.
    receipt = await client.publish_document(doc_b, RUNBOOK, version=1, wait=True)
    assert receipt.ack is not None and receipt.ack.status == "indexed"
    for cid in cids:
        _h, ack = await plain.reply(cid, timeout=30)
        assert (ack["event_id"], ack["doc_id"]) == (cid, doc_a), ack
    assert await daemon.index.chunk_ids(doc_a)
    assert not await daemon.index.chunk_ids(t.documents)  # no ack published into an input topic


async def test_a_redelivery_of_a_written_event_is_acked_indexed_and_written_once(
    kafka_bootstrap: str, redis_url: str, embedder: Any
) -> None:
    """As after a kill -9 between the write and the ack: the event is stored, its offset not
    committed. The next daemon acks it ``indexed`` (no chunks written by this delivery), and
    the doc holds its chunks once."""
    settings: Settings = isolated_settings(unique("acks-redelivery"), kafka_bootstrap, redis_url)
    await ensure_topics(kafka_bootstrap, settings.topics.all(), partitions=2, replication=1)
    event = {"event_id": "e-crash", "op": "upsert", "doc_id": "acks/crash.md", "version": 7, "content": RUNBOOK}
    # What the daemon that died did: the write, with neither ack nor offset commit.
    client = aredis.from_url(redis_url)
    index = ChunkIndex(client=client, cfg=settings.index, dims=embedder.dims)
    await index.ensure()
    died = Ingestor(index=index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
    written = await died.apply([DocumentEvent.model_validate(event).to_item(BASE_FILTER_KEYS)])
    assert written.chunks_written == 1
    plain = PlainClient(kafka_bootstrap, settings.topics, settings.topics.replies)
    await plain.start()
    daemon = await start_daemon(settings)
    try:
        cid = uuid.uuid4().hex
        headers = [("reply_to", settings.topics.replies.encode()), ("correlation_id", cid.encode())]
        await plain.send(settings.topics.documents, event, key="acks/crash.md", headers=headers)
        _h, ack = await plain.reply(cid, timeout=30)
        assert (ack["status"], ack["version"], ack["stored_version"], ack["chunks"]) == ("indexed", 7, 7, None)
        assert await daemon.index.chunk_ids("acks/crash.md") == {"acks/crash.md_p0"}
        assert await daemon.index.count() == 1
    finally:
        await daemon.stop()
        await plain.stop()
        await index.drop()
        await client.aclose()


async def test_in_one_batch_each_copy_of_a_written_version_is_judged_against_what_is_stored(
    redis_url: str, embedder: Any
) -> None:
    """Over a stored version 5 ("A"), the batch [v5 "B", v5 "A", v5 "C"] says what each event
    would have heard alone: "B" and "C" another content, "A" indexed (a redelivery), though
    the batch kept "B" to compare first."""
    client = aredis.from_url(redis_url)
    index = ChunkIndex(client=client, cfg=IndexConfig(name=unique("acks-copies")), dims=embedder.dims)
    await index.ensure()
    ingestor = Ingestor(index=index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
    try:

        def v5(content: str) -> Any:
            body = {"event_id": content, "op": "upsert", "doc_id": "acks/copies.md", "version": 5, "content": content}
            return DocumentEvent.model_validate(body).to_item(BASE_FILTER_KEYS)

        await ingestor.apply([v5(RUNBOOK)])
        items = [v5("Runbook B."), v5(RUNBOOK), v5("Runbook C.")]
        report = await ingestor.apply(items)
        said = [report.outcomes[id(i)] for i in items]
        assert [(o.status, o.conflict) for o in said] == [
            ("ignored", "content"),
            ("indexed", None),
            ("ignored", "content"),
        ]
        assert all(o.stored_version == 5 and o.chunks is None for o in said)
        assert (await index.as_written(["acks/copies.md"], "default"))["acks/copies.md"][0].text == RUNBOOK
    finally:
        await index.drop()
        await client.aclose()


async def test_cli_publish_wait_returns_once_searchable(env: Any, tmp_path: Path) -> None:
    """`agentmemd publish doc --wait` prints the ack; the query right after finds the doc."""
    daemon, _plain, client = env
    path = tmp_path / "heron.md"
    path.write_text("The heron-sync job fails with HRN_TIMEOUT_42 when the bucket quota is full.", encoding="utf-8")
    doc = f"acks/cli-{uuid.uuid4().hex[:6]}.md"
    env_vars = {**os.environ, **settings_env(daemon.settings), "COLUMNS": "200"}
    proc = await asyncio.create_subprocess_exec(
        AGENTMEMD, "publish", "doc", str(path), "--doc-id", doc, "--wait",
        env=env_vars, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert "indexed" in out.decode(), out.decode()
    reply = await client.query("HRN_TIMEOUT_42", top_k=3)
    assert reply.results and reply.results[0].doc_id == doc
    # Its version written again with other words: refused, and the command fails, where an
    # older version's retry (nothing lost) does not.
    versioned = f"{doc}.v"
    await client.publish_document(versioned, "The heron-sync runbook.", version=10, wait=True)
    path.write_text("Something else entirely.", encoding="utf-8")
    for version, code, said in (("10", 1, "already written with another content"), ("9", 0, "is older than")):
        proc = await asyncio.create_subprocess_exec(
            AGENTMEMD, "publish", "doc", str(path), "--doc-id", versioned, "--version", version, "--wait",
            env=env_vars, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        assert proc.returncode == code and said in " ".join(out.decode().split()), (out.decode(), err.decode())


async def test_an_observation_without_a_turn_takes_the_next_free_one(env: Any, kafka_bootstrap: str) -> None:
    """Without ``turn``, the client takes the turn after the session's last stored one: found by
    a lookup (another writer's turns count), then counted; a forget starts the session over."""
    daemon, _plain, client = env
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    said = await client.publish_observation(agent_id=agent, session_id="s", turn=4, content="Turn four.", wait=True)
    assert said.turn == 4
    # A new client knows nothing of the session: it looks the turns up.
    async with MemoryClient(bootstrap=kafka_bootstrap, topics=daemon.settings.topics, timeout_s=20) as other:
        first = await other.publish_observation(agent_id=agent, session_id="s", content="Turn five.", wait=True)
        second = await other.publish_observation(agent_id=agent, session_id="s", content="Turn six.")  # not waited
        assert (first.turn, second.turn) == (5, 6)
        await other.forget(agent_id=agent, session_id="s", wait=True)
        again = await other.publish_observation(agent_id=agent, session_id="s", content="From the top.", wait=True)
        assert again.turn == 0 and again.ack is not None and again.ack.status == "indexed"
    looked = await client.get(turns=[(agent, "s", 0)])
    assert looked.items[0].content == "From the top."


async def test_two_writers_numbering_one_session_lose_no_turn(env: Any, kafka_bootstrap: str) -> None:
    """Two clients (as two processes) each take the session's next turn for six turns at once:
    both read the same last turn, so they claim the same numbers. The daemon writes the first
    claim of each number it applies and refuses the other (``turn_taken``), whose writer sends
    it again as the next turn: all twelve are stored, each at its own number (decision 0069).
    Without the claim the later write replaced the earlier, and both writers were told
    ``indexed``."""
    daemon, _plain, _client = env
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    topics = daemon.settings.topics
    async with (
        MemoryClient(bootstrap=kafka_bootstrap, topics=topics, timeout_s=30) as a,
        MemoryClient(bootstrap=kafka_bootstrap, topics=topics, timeout_s=30) as b,
    ):

        async def write(c: MemoryClient, name: str) -> list[int]:
            turns = []
            for i in range(6):
                r = await c.publish_observation(agent_id=agent, session_id="s", content=f"{name} step {i}", wait=True)
                assert r.ack is not None and r.ack.status == "indexed", r.ack
                turns.append(r.turn)
            return turns

        got_a, got_b = await asyncio.gather(write(a, "A"), write(b, "B"))
        stored = (await a.get(turns=[(agent, "s", n) for n in range(14)])).items
    held = {n: item.content for n, item in enumerate(stored) if item.status == "found"}
    assert sorted(held.values()) == sorted([f"A step {i}" for i in range(6)] + [f"B step {i}" for i in range(6)])
    assert sorted(got_a + got_b) == sorted(held), (got_a, got_b, held)
    assert all(held[n] == f"A step {i}" for i, n in enumerate(got_a)), (got_a, held)


async def test_a_claimed_turn_sent_again_is_written_once_and_another_is_refused(env: Any, kafka_bootstrap: str) -> None:
    """A claim of what the turn already holds (a redelivery, a writer's retry, a day later) is
    acked ``indexed`` and leaves the turn as it was, its time too; a claim of a turn holding
    something else is acked ``ignored``, ``turn_taken``, and leaves it as it was; a numbered
    write without the claim replaces it, as ever."""
    _daemon, _plain, client = env
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    first = await client.publish_observation(
        agent_id=agent,
        session_id="s",
        turn=0,
        content="The first word.",
        wait=True,
        if_absent=True,
        timestamp="2026-01-05T10:00:00Z",
    )
    again = await client.publish_observation(
        agent_id=agent, session_id="s", turn=0, content="The first word.", wait=True, if_absent=True
    )
    assert again.ack is not None and again.ack.chunks is None, again.ack  # nothing written
    assert (await client.get(turns=[(agent, "s", 0)])).items[0].timestamp == "2026-01-05T10:00:00Z"
    other = await client.publish_observation(
        agent_id=agent, session_id="s", turn=0, content="Another word.", wait=True, if_absent=True
    )
    for r in (first, again):
        assert r.ack is not None and r.ack.status == "indexed", r.ack
    assert other.ack is not None and (other.ack.status, other.ack.error_code) == ("ignored", "turn_taken"), other.ack
    assert "turn 0 of this session holds another turn" in (other.ack.reason or "")
    assert (await client.get(turns=[(agent, "s", 0)])).items[0].content == "The first word."
    meant = await client.publish_observation(agent_id=agent, session_id="s", turn=0, content="Rewritten.", wait=True)
    assert meant.ack is not None and meant.ack.status == "indexed", meant.ack
    assert (await client.get(turns=[(agent, "s", 0)])).items[0].content == "Rewritten."
