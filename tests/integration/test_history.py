"""A document's earlier versions, on the real embedder and Redis: an upsert keeps the version it
replaces (exact, with its time and until when it held), trimmed to the setting; a delete drops
them; a redelivery, a late older version or an unchanged rewrite adds none; a document written
in slices keeps them too; turns and other tenants keep none of another's; a reindex's copy
carries them; and through the daemon a ``get`` with history returns them over Kafka."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from consumers.client import MemoryClient
from consumers.config import ConsumerConfig
from consumers.errors import QueryFailed, VersionGone
from memory.config import ChunkingConfig, IngestConfig
from memory.index import ChunkIndex
from memory.ingest import Ingestor
from memory.keys import history_key
from memory.records import ChunkRecord, MemoryItem
from memory.search_results import Lookup
from tests.conftest import unique
from tests.helpers import daemon_and_client, isolated_settings
from tests.helpers.stacks import Stack, memory_stack

pytestmark = pytest.mark.integration

DOC = "notes/alice.md"
#: Opening indent and final newline: a version reads back as written.
V1 = "  Alice lives in Paris and works on the billing service.\n"
V2 = "Alice moved to Berlin in March.\n\nShe still works on the billing service.\n"
V3 = "Alice lives in Berlin and leads the ledger team.\n"


def upsert(version: int, content: str, ts: float, tenant: str = "default", **meta: Any) -> MemoryItem:
    tags = {k: str(v) for k, v in meta.items()}  # as DocumentEvent.to_item tags filterable metadata
    return MemoryItem(
        "upsert", DOC, version, content=content, source=DOC, tags=tags, metadata=meta, timestamp=ts, tenant=tenant
    )


async def looked(stack: Stack, doc_id: str = DOC, tenant: str = "default") -> Lookup:
    (found,) = await stack.retriever.lookups.lookup([doc_id], tenant=tenant, history=True)
    return found


async def test_an_upsert_keeps_what_it_replaces_and_a_delete_drops_it(redis_url: str, embedder: Any) -> None:
    async with memory_stack(redis_url, embedder, unique(__name__)) as stack:
        await stack.ingestor.apply([upsert(1, V1, 1000.0, team="billing")])
        assert (await looked(stack)).history == ()
        await stack.ingestor.apply([upsert(2, V2, 2000.0, team="billing")])
        await stack.ingestor.apply([upsert(3, V3, 3000.0, team="ledger")])
        now = await looked(stack)
        assert (now.version, now.content) == (3, V3)
        assert [(v.version, v.content, v.metadata, v.timestamp, v.until) for v in now.history] == [
            (2, V2, {"team": "billing"}, 2000.0, 3000.0),
            (1, V1, {"team": "billing"}, 1000.0, 2000.0),
        ]
        # A redelivery and a late older version are not applied; a new version of the same
        # content, source and metadata changes nothing worth keeping.
        await stack.ingestor.apply([upsert(3, V3, 3000.0, team="ledger")])
        await stack.ingestor.apply([upsert(2, V2, 2000.0, team="billing")])
        await stack.ingestor.apply([upsert(4, V3, 4000.0, team="ledger")])
        assert [v.version for v in (await looked(stack)).history] == [2, 1]
        # A metadata change alone is a change.
        await stack.ingestor.apply([upsert(5, V3, 5000.0, team="platform")])
        assert [v.version for v in (await looked(stack)).history] == [4, 2, 1]
        # A delete leaves nothing readable, and a later upsert starts a new history.
        await stack.ingestor.apply([MemoryItem("delete", DOC, 6)])
        assert (await looked(stack)).status == "not_found"
        gen = (await stack.index.state()).active
        assert not await stack.client.exists(history_key(stack.index.cfg.name, gen, "default", DOC))
        await stack.ingestor.apply([upsert(7, V1, 7000.0)])
        assert (await looked(stack)).history == ()
        # Without history asked for, none is read.
        (plain,) = await stack.retriever.lookups.lookup([DOC])
        assert plain.history == ()


async def test_the_history_is_trimmed_to_the_setting_and_off_at_zero(redis_url: str, embedder: Any) -> None:
    async with memory_stack(redis_url, embedder, unique(__name__), history_versions=2) as stack:
        for v in range(1, 6):
            await stack.ingestor.apply([upsert(v, f"Revision {v} of the runbook.", 1000.0 * v)])
        assert [(v.version, v.content) for v in (await looked(stack)).history] == [
            (4, "Revision 4 of the runbook."),
            (3, "Revision 3 of the runbook."),
        ]
    async with memory_stack(redis_url, embedder, unique(__name__), history_versions=0) as stack:
        for v in range(1, 4):
            await stack.ingestor.apply([upsert(v, f"Revision {v} of the runbook.", 1000.0 * v)])
        assert (await looked(stack)).history == ()
        gen = (await stack.index.state()).active
        assert not await stack.client.exists(history_key(stack.index.cfg.name, gen, "default", DOC))


async def test_a_document_written_in_slices_keeps_its_history(redis_url: str, embedder: Any) -> None:
    paragraphs = [f"Section {i}: the ledger service {'retries ' * 60}the write." for i in range(8)]
    old, new = "\n\n".join(paragraphs), "\n\n".join(p.replace("ledger", "billing") for p in paragraphs)
    async with memory_stack(redis_url, embedder, unique(__name__), write_slice_chunks=2) as stack:
        await stack.ingestor.apply([upsert(1, old, 1000.0)])
        assert len(await stack.index.chunk_ids(DOC)) > 4  # more than two slices
        await stack.ingestor.apply([upsert(2, new, 2000.0)])
        now = await looked(stack)
        assert now.content == new
        assert [(v.version, v.content, v.until) for v in now.history] == [(1, old, 2000.0)]
        await stack.ingestor.apply([MemoryItem("delete", DOC, 3)])
        gen = (await stack.index.state()).active
        assert not await stack.client.exists(history_key(stack.index.cfg.name, gen, "default", DOC))


async def test_turns_keep_none_and_tenants_keep_their_own(redis_url: str, embedder: Any) -> None:
    async with memory_stack(redis_url, embedder, unique(__name__)) as stack:
        turn = "transcript:planner/s1/0"
        for text in ("We ship on Friday.", "We ship on Monday."):
            await stack.ingestor.apply(
                [MemoryItem("upsert", turn, None, kind="transcript", content=text, source="planner/s1")]
            )
        (said,) = await stack.retriever.lookups.lookup([turn], history=True)
        assert (said.content, said.history) == ("We ship on Monday.", ())
        await stack.ingestor.apply([upsert(1, V1, 1000.0, tenant="acme"), upsert(1, V3, 1000.0)])
        await stack.ingestor.apply([upsert(2, V2, 2000.0, tenant="acme")])
        assert [v.content for v in (await looked(stack, tenant="acme")).history] == [V1]
        assert (await looked(stack)).history == ()
        # Outside the filter, a doc shows no history either.
        (hidden,) = await stack.retriever.lookups.lookup(
            [DOC], tenant="acme", metadata_filter={"source": "elsewhere"}, history=True
        )
        assert (hidden.status, hidden.history) == ("not_found", ())


async def test_a_reindex_copy_carries_the_history(redis_url: str, embedder: Any) -> None:
    async with memory_stack(redis_url, embedder, unique(__name__)) as stack:
        await stack.ingestor.apply([upsert(1, V1, 1000.0)])
        await stack.ingestor.apply([upsert(2, V2, 2000.0)])
        gen, _ = await stack.index.registry.reserve("test-history-copy")
        index = stack.index
        target = ChunkIndex(client=stack.client, cfg=index.cfg, dims=embedder.dims, spec=index.spec, generation=gen)
        try:
            await target.ensure()
            assert await target.copy_doc(1, "default", DOC)
            assert await target.history([DOC]) == await index.history([DOC])
            assert [v.content for v in (await target.history([DOC]))[DOC]] == [V1]
        finally:
            await index.registry.release("test-history-copy")
            await target.drop()


async def test_get_with_history_over_kafka(kafka_bootstrap: str, redis_url: str) -> None:
    settings = isolated_settings(unique(__name__), kafka_bootstrap, redis_url)
    doc = f"notes/{uuid.uuid4().hex[:8]}.md"
    async with (
        daemon_and_client(settings) as (_daemon, _plain),
        MemoryClient(bootstrap=kafka_bootstrap, topics=settings.topics, timeout_s=30) as client,
    ):
        await client.publish_document(doc, V1, version=1, timestamp="2026-03-01T09:00:00Z", wait=True)
        await client.publish_document(doc, V2, version=2, timestamp="2026-04-01T09:00:00Z", wait=True)
        (item,) = (await client.get([doc], history=True)).items
        assert (item.version, item.content) == (2, V2)
        assert item.history is not None and not item.history_truncated
        (earlier,) = item.history
        assert (earlier.version, earlier.content) == (1, V1)
        assert earlier.timestamp is not None and earlier.timestamp.startswith("2026-03-01T09:00:00")
        assert earlier.until is not None and earlier.until.startswith("2026-04-01T09:00:00")
        # Not asked for: not sent.
        assert (await client.get([doc])).items[0].history is None


async def test_long_contents_are_read_on_over_kafka(kafka_bootstrap: str, redis_url: str) -> None:
    """With a reply of 4 KiB: a get of a long and a short document answers both, the long one
    cut; ``MemoryClient.read`` reads either version of it, or a long turn, whole, a reply at a time."""
    name = unique(__name__)
    consumer = ConsumerConfig(group_id=name, reply_max_bytes=4096)
    settings = isolated_settings(name, kafka_bootstrap, redis_url, consumer=consumer)
    doc, small = f"notes/{uuid.uuid4().hex[:8]}.md", f"notes/{uuid.uuid4().hex[:8]}-small.md"
    v1 = "\n\n".join(f"Version one, part {i}: the ledger's replica lag on shard {i} — café." for i in range(200))
    v2 = v1.replace("Version one", "Version two") + "\n"
    said = " ".join(f"step {i}: checked the Ω-meter on rack {i}." for i in range(300))
    async with (
        daemon_and_client(settings) as (_daemon, _plain),
        MemoryClient(bootstrap=kafka_bootstrap, topics=settings.topics, timeout_s=30) as client,
    ):
        await client.publish_document(doc, v1, version=1, wait=True)
        await client.publish_document(doc, v2, version=2, wait=True)
        await client.publish_document(small, "A short note.", version=1, wait=True)
        turn = await client.publish_observation(agent_id="a", session_id="s", content=said, wait=True)
        reply = await client.get([doc, small])
        cut, whole = reply.items
        assert not reply.truncated and cut.content_truncated and v2.startswith(cut.content or "-")
        assert (whole.content, whole.content_truncated) == ("A short note.", False)
        assert await client.read(doc) == cut.model_copy(update={"content": v2, "content_truncated": False})
        old = await client.read(doc, version=1)
        assert (old.content, old.version, old.content_truncated) == (v1, 1, False) and old.until is not None
        assert (await client.read(turn.doc_id)).content == said
        assert (await client.read("notes/missing.md")).status == "not_found"
        with pytest.raises(QueryFailed, match="content_offset and version read one item"):
            await client.get([doc, small], content_offset=10)
        # The same content published again under a new number replaces the version being
        # read on (no history keeps a version that said what the next says): reading that
        # version on says so, and a read of the current version starts again and reads it.
        (first,) = (await client.get(doc)).items
        await client.publish_document(doc, v2, version=3, wait=True)
        with pytest.raises(VersionGone, match=r"version 2 of .* is no longer kept as it was"):
            await client.read_on(first)
        again = await client.read(doc)
        assert (again.content, again.version) == (v2, 3)
        with_history = await client.read(doc, history=True)
        assert with_history.content == v2 and [v.version for v in with_history.history or []] == [1]


async def test_a_batch_keeps_the_versions_it_passed_over_and_a_delete_in_it_drops_the_rest(
    redis_url: str, embedder: Any
) -> None:
    async with memory_stack(redis_url, embedder, unique(__name__)) as stack:
        await stack.ingestor.apply([upsert(1, V1, 1000.0)])
        # One batch: v2 and v3 are never written (coalesced into v4), yet were said.
        await stack.ingestor.apply([upsert(2, V2, 2000.0), upsert(3, V3, 3000.0), upsert(4, "Alice left.", 4000.0)])
        assert [(v.version, v.until) for v in (await looked(stack)).history] == [
            (3, 4000.0),
            (2, 3000.0),
            (1, 2000.0),
        ]
        # Versions out of order: v6 after v7 would have been ignored, had each come alone, and
        # the history is what it would then be, however the events were batched.
        await stack.ingestor.apply([upsert(5, V1, 5000.0), upsert(7, V3, 7000.0), upsert(6, V2, 6000.0)])
        await stack.ingestor.apply([upsert(8, "Alice is back.", 8000.0)])
        assert [(v.version, v.until) for v in (await looked(stack)).history][:3] == [
            (7, 8000.0),
            (5, 7000.0),
            (4, 5000.0),
        ]
        # A delete in a batch with a later upsert: what came before it is gone, as if applied.
        await stack.ingestor.apply([MemoryItem("delete", DOC, 9), upsert(10, V2, 10_000.0)])
        assert (await looked(stack)).history == ()
        await stack.ingestor.apply([upsert(11, "SECRET", 11_000.0)])
        await stack.ingestor.apply([upsert(12, V1, 12_000.0), MemoryItem("delete", DOC, 13), upsert(14, V3, 14_000.0)])
        assert (await looked(stack)).history == ()


async def test_an_earlier_version_outside_the_filter_is_not_shown(redis_url: str, embedder: Any) -> None:
    async with memory_stack(redis_url, embedder, unique(__name__), extra_filter_keys=["team"]) as stack:
        await stack.ingestor.apply([upsert(1, V1, 1000.0, team="secret")])
        await stack.ingestor.apply([upsert(2, V2, 2000.0, team="billing")])
        await stack.ingestor.apply([upsert(3, V3, 3000.0, team="billing")])
        (seen,) = await stack.retriever.lookups.lookup([DOC], metadata_filter={"team": "billing"}, history=True)
        assert [v.version for v in seen.history] == [2]
        (seen,) = await stack.retriever.lookups.lookup([DOC], metadata_filter={"team": {"not": "secret"}}, history=True)
        assert [v.version for v in seen.history] == [2]
        assert [v.version for v in (await looked(stack)).history] == [2, 1]


async def test_a_lowered_setting_trims_at_the_next_write_and_zero_drops(redis_url: str, embedder: Any) -> None:
    async with memory_stack(redis_url, embedder, unique(__name__)) as stack:
        for v in range(1, 6):
            await stack.ingestor.apply([upsert(v, f"Revision {v}.", 1000.0 * v)])
        assert len((await looked(stack)).history) == 4
        gen = (await stack.index.state()).active
        key = history_key(stack.index.cfg.name, gen, "default", DOC)
        for keep, want in ((2, 2), (0, 0)):
            cfg = stack.index.cfg.model_copy(update={"history_versions": keep})
            index = ChunkIndex(client=stack.client, cfg=cfg, dims=embedder.dims, spec=stack.index.spec)
            assert len((await index.history([DOC])).get(DOC, [])) == want  # read: capped at once
            ingestor = Ingestor(index=index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
            await ingestor.apply([upsert(13 - keep // 2, "Revision 13.", 9000.0 + keep)])
            assert await stack.client.llen(key) == want  # stored: trimmed by the write


async def test_a_community_summary_keeps_none(redis_url: str, embedder: Any) -> None:
    async with memory_stack(redis_url, embedder, unique(__name__)) as stack:
        cid = "community:0:7"
        for version, text in ((1, "Ledger team: Alice, Bob."), (2, "Ledger team: Alice, Bob, Carol.")):
            record = ChunkRecord(cid + "_p0", cid, 0, text, "community", cid, {}, {}, version, 1000.0 * version)
            vectors = await embedder.embed_documents([text])
            assert (await stack.index.apply(cid, version, [record], vectors)).applied
        gen = (await stack.index.state()).active
        assert not await stack.client.exists(history_key(stack.index.cfg.name, gen, "default", cid))
