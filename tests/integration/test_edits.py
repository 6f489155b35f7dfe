"""Edits cost what they change, through the real embedder and Redis: an edit's unchanged
chunks keep their stored vectors, a paragraph shared by two docs is embedded once, nothing is
reused across tenants or models, an edit cut short between the lookup and the write redoes
cleanly, and through the daemon an edit waited for is exact (old text gone, new text found)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aredis

from consumers.client import MemoryClient
from memory.config import ChunkingConfig, IndexConfig, IngestConfig
from memory.index import ChunkIndex, vector_key
from memory.ingest import Ingestor
from memory.metrics import CHUNKS_EMBEDDED, CHUNKS_REUSED
from memory.records import MemoryItem
from tests.conftest import unique
from tests.helpers import daemon_and_client, isolated_settings
from tests.helpers.counting import Counting

pytestmark = pytest.mark.integration

WORDS = (
    "ledger lock timeout replica pool billing queue drain shard cache worker page alert rollout canary "
    "budget index vacuum failover quorum"
).split()


def paragraph(rng: random.Random) -> str:
    """A paragraph of 40 to 120 tokens: one chunk of its own under the default chunking."""
    sentences = (" ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 20))) for _ in range(rng.randint(4, 6)))
    return " ".join(s.capitalize() + "." for s in sentences)


def upsert(doc_id: str, version: int, paras: list[str], tenant: str = "default") -> MemoryItem:
    return MemoryItem("upsert", doc_id, version, content="\n\n".join(paras), tenant=tenant)


@pytest.fixture
async def stack(redis_url: str, embedder: Any) -> AsyncIterator[tuple[ChunkIndex, Counting, Ingestor]]:
    client = aredis.from_url(redis_url)
    index = ChunkIndex(client=client, cfg=IndexConfig(name=unique(__name__)), dims=embedder.dims)
    await index.ensure()
    counting = Counting(embedder)
    ingestor = Ingestor(index=index, embedder=counting, chunking=ChunkingConfig(), cfg=IngestConfig())
    yield index, counting, ingestor
    await index.drop()
    await client.aclose()


async def test_an_edit_embeds_only_its_changed_chunk(stack: Any) -> None:
    index, counting, ingestor = stack
    rng = random.Random(1)
    paras = [paragraph(rng) for _ in range(12)]
    first = await ingestor.apply([upsert("wiki/runbook.md", 1, paras)])
    assert first.chunks_embedded == len(counting.sent) == 12 and first.chunks_reused == 0
    before = await index.texts(sorted(await index.chunk_ids("wiki/runbook.md")))

    counting.sent.clear()
    paras[5] = paragraph(rng)
    item = upsert("wiki/runbook.md", 2, paras)
    edit = await ingestor.apply([item])
    assert (edit.chunks_embedded, edit.chunks_reused) == (1, 11)
    # what the writer's ack reports: 12 chunks written, 1 of them embedded
    outcome = edit.outcomes[id(item)]
    assert (outcome.chunks, outcome.embedded) == (12, 1)
    assert counting.sent == [paras[5]]
    after = await index.texts(sorted(await index.chunk_ids("wiki/runbook.md")))
    assert sorted(after.values()) == sorted(paras) and len(set(after.values()) - set(before.values())) == 1

    # The kept vectors are the ones the model gives those texts.
    keys = [vector_key(counting.identity, p) for p in paras]
    stored = await index.stored_vectors(keys)
    fresh = await counting.inner.embed_documents(paras)
    assert len(stored) == 12
    for key, vec in zip(keys, fresh, strict=True):
        assert float(np.dot(stored[key], vec)) > 0.999


async def test_a_paragraph_shared_by_two_docs_is_embedded_once(stack: Any) -> None:
    _index, counting, ingestor = stack
    rng = random.Random(2)
    shared = paragraph(rng)
    await ingestor.apply([upsert("wiki/a.md", 1, [paragraph(rng), shared, paragraph(rng)])])
    counting.sent.clear()
    other = await ingestor.apply([upsert("wiki/b.md", 1, [paragraph(rng), shared])])
    assert (other.chunks_embedded, other.chunks_reused) == (1, 1) and shared not in counting.sent
    # Twice in one batch: embedded once.
    counting.sent.clear()
    twice = paragraph(rng)
    c, d = upsert("wiki/c.md", 1, [twice]), upsert("wiki/d.md", 1, [twice])
    both = await ingestor.apply([c, d])
    assert (both.chunks_embedded, both.chunks_reused) == (1, 1) and counting.sent == [twice]
    assert (both.outcomes[id(c)].embedded, both.outcomes[id(d)].embedded) == (1, 0)  # counted once, for the first


async def test_no_vector_crosses_tenants_or_models(stack: Any, embedder: Any) -> None:
    index, counting, ingestor = stack
    rng = random.Random(3)
    paras = [paragraph(rng) for _ in range(4)]
    await ingestor.apply([upsert("wiki/t.md", 1, paras, tenant="acme")])
    counting.sent.clear()
    theirs = await ingestor.apply([upsert("wiki/t.md", 1, paras, tenant="globex")])
    assert (theirs.chunks_embedded, theirs.chunks_reused) == (4, 0) and counting.sent == paras
    assert await index.stored_vectors([vector_key(counting.identity, paras[0])], "initech") == {}

    other_model = Counting(embedder, identity="another-model|fp32|384")
    other = Ingestor(index=index, embedder=other_model, chunking=ChunkingConfig(), cfg=IngestConfig())
    again = await other.apply([upsert("wiki/t.md", 2, paras, tenant="acme")])
    assert (again.chunks_embedded, again.chunks_reused) == (4, 0) and other_model.sent == paras

    off = Ingestor(index=index, embedder=counting, chunking=ChunkingConfig(), cfg=IngestConfig(reuse_vectors=False))
    counting.sent.clear()
    plain = await off.apply([upsert("wiki/t.md", 3, paras, tenant="acme")])
    assert (plain.chunks_embedded, plain.chunks_reused) == (4, 0)


async def test_an_edit_cut_short_after_its_lookup_is_redone_exactly(stack: Any) -> None:
    """The process dies between the vector lookup and the write (here: its task is cancelled
    there, as a kill would stop it): nothing of the edit is written, and the redelivered edit
    writes exactly its new text, reusing what it can."""
    index, _counting, ingestor = stack
    rng = random.Random(4)
    paras = [paragraph(rng) for _ in range(6)]
    await ingestor.apply([upsert("wiki/k.md", 1, paras)])
    looked, hold = asyncio.Event(), asyncio.Event()
    real = index.stored_vectors

    async def stalls(keys: Sequence[str], tenant: str = "default") -> dict[str, np.ndarray]:
        out = await real(keys, tenant)
        looked.set()
        await hold.wait()  # never set: the "kill" comes here
        return out

    edited = [*paras[:2], paragraph(rng), *paras[3:]]
    index.stored_vectors = stalls
    task = asyncio.ensure_future(ingestor.apply([upsert("wiki/k.md", 2, edited)]))
    await asyncio.wait_for(looked.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    index.stored_vectors = real
    assert await index.versions(["wiki/k.md"]) == {"wiki/k.md": 1}
    assert sorted((await index.texts(sorted(await index.chunk_ids("wiki/k.md")))).values()) == sorted(paras)

    redo = await ingestor.apply([upsert("wiki/k.md", 2, edited)])
    assert (redo.chunks_embedded, redo.chunks_reused) == (1, 5)
    assert await index.versions(["wiki/k.md"]) == {"wiki/k.md": 2}
    assert sorted((await index.texts(sorted(await index.chunk_ids("wiki/k.md")))).values()) == sorted(edited)


async def test_an_edit_through_the_daemon_is_exact_and_counted(kafka_bootstrap: str, redis_url: str) -> None:
    settings = isolated_settings(unique(__name__), kafka_bootstrap, redis_url)
    rng = random.Random(5)
    paras = [paragraph(rng) for _ in range(8)]
    old_fact = "The quorum for cluster zephyr-7 is five voters."
    new_fact = "The quorum for cluster zephyr-7 is now seven voters after the expansion."
    paras[3] = old_fact + " " + paras[3]
    doc = f"wiki/{uuid.uuid4().hex[:8]}.md"
    topic = settings.topics.documents
    async with daemon_and_client(settings) as (_daemon, _plain):
        client = MemoryClient(bootstrap=kafka_bootstrap, topics=settings.topics, timeout_s=20)
        await client.start()
        try:
            await client.publish_document(doc, "\n\n".join(paras), version=1, wait=True)
            embedded, reused = CHUNKS_EMBEDDED.labels(topic)._value.get(), CHUNKS_REUSED.labels(topic)._value.get()
            edited = [*paras[:3], new_fact + " " + paras[3][len(old_fact) + 1 :], *paras[4:]]
            receipt = await client.publish_document(doc, "\n\n".join(edited), version=2, wait=True)
            assert receipt.ack is not None and receipt.ack.status == "indexed"
            assert CHUNKS_EMBEDDED.labels(topic)._value.get() - embedded == 1
            assert CHUNKS_REUSED.labels(topic)._value.get() - reused == 7
            found = await client.query("zephyr-7 quorum voters", top_k=10)
            texts = [r.text for r in found.results if r.doc_id == doc]
            assert any("seven voters" in t for t in texts)
            assert not any("five voters" in t for t in texts)
            looked = await client.get([doc])
            assert looked.items[0].content is not None and "five voters" not in looked.items[0].content
        finally:
            await client.close()
