"""Large documents are written in slices, and queries never see half of two versions."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aredis
from structlog.testing import capture_logs

from daemon.doctor_index import check_unfinished_writes
from daemon.settings import Settings
from memory.config import IndexConfig, RetrievalConfig
from memory.errors import BackendUnavailable
from memory.index import ChunkIndex, DocState, WriteInProgress
from memory.index.marker_list import MAX_READ
from memory.keys import chunk_prefix
from memory.keys import marker_key as doc_marker_key
from memory.metrics import REGISTRY
from memory.records import ApplyResult, ChunkRecord
from memory.retrieval import Retriever
from memory.search_spec import SearchSpec
from memory.text import bm25_query, query_terms
from memory.visibility import FINISHED_MARKER_TTL_S, TAKEOVER_AFTER_S, WriteMarker
from tests.conftest import unique

pytestmark = pytest.mark.integration

SLICE = 4
DOC = "specs/big.md"


def chunks(version: int, n: int, word: str, doc_id: str = DOC) -> list[ChunkRecord]:
    return [
        ChunkRecord(
            chunk_id=f"{doc_id}_p{i}",
            doc_id=doc_id,
            position=i,
            text=f"{word} section {i} of the large specification",
            kind="document",
            source=doc_id,
            tags={},
            metadata={},
            version=version,
            timestamp=1_700_000_000.0 + version,
        )
        for i in range(n)
    ]


async def earlier(index: ChunkIndex) -> list[int]:
    """The versions the doc's history keeps (memory.index.history), newest first."""
    return [v.version for v in (await index.history([DOC])).get(DOC, [])]


def vectors(n: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, 384)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _count(outcome: str) -> float:
    return REGISTRY.get_sample_value("agentmemd_sliced_writes_total", {"outcome": outcome}) or 0.0


class PausedAfter:
    """Stands in for ChunkIndex._guarded: holds the write after its ``n``-th slice (the
    transaction that takes the marker is not one)."""

    def __init__(self, index: ChunkIndex, n: int) -> None:
        self._index = index
        self._guarded = index._guarded
        self._n = n
        self.calls = 0
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    @classmethod
    async def hold(
        cls, index: ChunkIndex, n: int, write: Coroutine[Any, Any, ApplyResult]
    ) -> tuple[PausedAfter, asyncio.Task[ApplyResult]]:
        """Start ``write`` (a call on ``index``) and return once it is held after slice ``n``."""
        pause = cls(index, n)
        index._guarded = pause  # type: ignore[method-assign]
        task = asyncio.create_task(write)
        await asyncio.wait_for(pause.reached.wait(), 10)
        return pause, task

    def restore(self) -> None:
        """Writes on the index run unheld again."""
        self._index._guarded = self._guarded  # type: ignore[method-assign]

    async def __call__(self, *args: Any, **kw: Any) -> None:
        await self._guarded(*args, **kw)
        self.calls += 1
        if self.calls == self._n:
            self.reached.set()
            await self.release.wait()


@pytest.fixture
async def stack(redis_url: str, embedder: Any) -> AsyncIterator[tuple[ChunkIndex, Retriever, aredis.Redis]]:
    client = aredis.from_url(redis_url)
    # A name of its own per test: the reindex tests leave other generations behind.
    name = unique(f"sliced-{uuid.uuid4().hex}")
    index = ChunkIndex(client=client, cfg=IndexConfig(name=name, write_slice_chunks=SLICE), dims=384)
    await index.ensure()
    yield index, Retriever(index=index, embedder=embedder, cfg=RetrievalConfig()), client
    await index.drop()
    await client.aclose()


def whole(index: ChunkIndex) -> ChunkIndex:
    """The same index as another process sees it, one that writes every doc in one transaction."""
    cfg = index.cfg.model_copy(update={"write_slice_chunks": 100_000})
    return ChunkIndex(client=index._r, cfg=cfg, dims=384, spec=index.spec)


async def shown(retriever: Retriever, word: str, *, dense: bool = False) -> list[tuple[str, int | None]]:
    """(chunk id, version) of every hit for ``word`` (the BM25 leg, or the vector leg alone)."""
    weights = {"dense_weight": 1.0, "sparse_weight": 0.0} if dense else {"dense_weight": 0.0, "sparse_weight": 1.0}
    out = await retriever.search(SearchSpec(text=word, top_k=50, identifier_weight=0.0, **weights))
    return sorted((h.chunk.chunk_id, h.chunk.version) for h in out.hits)


async def raw_versions(index: ChunkIndex, word: str) -> set[int | None]:
    """Versions of what the BM25 leg alone returns for ``word``, before any marker filter."""
    return {h.version for h in await index.search_text(bm25_query(query_terms(word)), k=50)}


async def test_a_large_doc_is_written_in_slices_and_ends_exact(stack) -> None:
    """10 new chunks over 6 old ones at 4 per transaction: begin, 3 slices, flip (nothing to delete)."""
    index, retriever, client = stack
    await index.apply(DOC, 1, chunks(1, 6, "alpha"), vectors(6, 1))
    finished = _count("finished")
    with capture_logs() as logs:
        result = await index.apply(DOC, 2, chunks(2, 10, "bravo"), vectors(10, 2))
    assert result.applied and result.chunks == 10
    assert _count("finished") == finished + 1
    [event] = [e for e in logs if e["event"] == "index.sliced_write_finished"]
    assert event["transactions"] == 5 and event["deleted"] == 0
    assert await index.chunk_ids(DOC) == {f"{DOC}_p{i}" for i in range(10)}
    assert await index.versions([DOC]) == {DOC: 2}
    assert await shown(retriever, "bravo") == [(f"{DOC}_p{i}", 2) for i in range(10)]
    assert await shown(retriever, "alpha") == []
    marker_key = doc_marker_key(index.cfg.name, 1, "default", DOC)
    assert WriteMarker.decode(await client.get(marker_key)) == WriteMarker(shown=2, writing=None)
    assert 0 < await client.ttl(marker_key) <= FINISHED_MARKER_TTL_S
    # A later version written in one transaction moves the marker on (else queries, which
    # filter the doc by its marker, would hide the new version).
    with capture_logs() as logs:
        assert (await whole(index).apply(DOC, 3, chunks(3, 2, "charlie"), vectors(2, 3))).applied
    assert not [e for e in logs if e["event"] == "index.sliced_write_finished"]
    assert WriteMarker.decode(await client.get(marker_key)) == WriteMarker(shown=3, writing=None)
    assert await shown(retriever, "charlie") == [(f"{DOC}_p0", 3), (f"{DOC}_p1", 3)]
    assert await index.count() == 2
    # An unversioned delete (a forgotten turn's path) removes the marker with the chunks.
    assert (await whole(index).apply(DOC, None, [], np.zeros((0, 384), np.float32))).applied
    assert await client.get(marker_key) is None and await index.count() == 0


async def test_queries_see_only_the_old_version_while_slices_are_written(stack) -> None:
    """Mid-write, the index holds both versions' chunks; answers show only old ones, in every leg."""
    index, retriever, _ = stack
    await index.apply(DOC, 1, chunks(1, 10, "alpha"), vectors(10, 1))
    # Held after the first slice of 4.
    pause, write = await PausedAfter.hold(index, 1, index.apply(DOC, 2, chunks(2, 12, "bravo"), vectors(12, 2)))
    # What the engine holds now: both versions (the test could not fail without this).
    assert await raw_versions(index, "bravo") == {2}
    assert await raw_versions(index, "alpha") == {1}
    assert await shown(retriever, "bravo") == []
    assert await shown(retriever, "alpha") == [(f"{DOC}_p{i}", 1) for i in range(4, 10)]
    dense = await shown(retriever, "section of the specification", dense=True)
    assert dense and {v for _, v in dense} == {1}
    pause.release.set()
    assert (await asyncio.wait_for(write, 10)).applied
    assert await shown(retriever, "bravo") == sorted((f"{DOC}_p{i}", 2) for i in range(12))
    assert await shown(retriever, "alpha") == []
    assert {v for _, v in await shown(retriever, "section of the specification", dense=True)} == {2}


async def test_a_new_large_doc_and_a_large_delete_stay_hidden_until_whole(stack) -> None:
    index, retriever, _ = stack
    pause, write = await PausedAfter.hold(index, 2, index.apply(DOC, 1, chunks(1, 9, "alpha"), vectors(9, 1)))
    assert await raw_versions(index, "alpha") == {1}
    assert await shown(retriever, "alpha") == []
    pause.release.set()
    await asyncio.wait_for(write, 10)
    assert len(await shown(retriever, "alpha")) == 9

    pause.restore()
    pause, delete = await PausedAfter.hold(index, 1, index.apply(DOC, 2, [], np.zeros((0, 384), np.float32)))
    assert await raw_versions(index, "alpha") == {1}  # 5 of 9 chunks are still there
    assert await shown(retriever, "alpha") == []  # but the doc is gone for queries at once
    pause.release.set()
    assert (await asyncio.wait_for(delete, 10)).applied
    assert await index.count() == 0
    assert await index.chunk_ids(DOC) == set()
    assert await index.versions([DOC]) == {DOC: 2}


async def test_a_newer_version_takes_a_paused_write_over(stack) -> None:
    """v3 is half-written when v4 (one transaction, another daemon) lands: v3 stops, v4 stands
    whole. v2, arriving late meanwhile, is skipped: a later version is being written."""
    index, retriever, _ = stack
    other = whole(index)
    await index.apply(DOC, 1, chunks(1, 10, "alpha"), vectors(10, 1))
    pause, v3 = await PausedAfter.hold(index, 1, index.apply(DOC, 3, chunks(3, 12, "bravo"), vectors(12, 3)))
    late = await other.apply(DOC, 2, chunks(2, 2, "delta"), vectors(2, 2))
    assert not late.applied and late.stored_version == 1  # above the stored version, yet skipped
    assert (await other.apply(DOC, 4, chunks(4, 3, "charlie"), vectors(3, 4))).applied
    pause.release.set()
    result = await asyncio.wait_for(v3, 10)
    assert not result.applied and result.stored_version == 4
    assert await index.chunk_ids(DOC) == {f"{DOC}_p{i}" for i in range(3)}
    assert await index.count() == 3  # nothing of v1 or the half of v3 is left
    assert await shown(retriever, "charlie") == [(f"{DOC}_p{i}", 4) for i in range(3)]
    assert await shown(retriever, "bravo") == [] and await shown(retriever, "alpha") == []
    assert await shown(retriever, "delta") == []
    # Kept once, by v3's start: v4 replaced a mix of v1 and v3, which no version ever said.
    assert await earlier(index) == [1]


async def test_a_large_delete_taken_over_half_way_keeps_no_part_of_the_deleted_version(stack) -> None:
    """A delete of v2 stops after its first slice and v3 lands in one transaction: what is
    left of v2 is no version anyone wrote, and v2 was being deleted, so no history keeps it."""
    index, retriever, _ = stack
    await index.apply(DOC, 1, chunks(1, 10, "alpha"), vectors(10, 1))
    await whole(index).apply(DOC, 2, chunks(2, 10, "bravo"), vectors(10, 2))
    assert await earlier(index) == [1]
    pause, delete = await PausedAfter.hold(index, 1, index.apply(DOC, 3, [], vectors(0, 3)))
    assert (await whole(index).apply(DOC, 4, chunks(4, 3, "charlie"), vectors(3, 4))).applied
    pause.release.set()
    assert not (await asyncio.wait_for(delete, 10)).applied
    assert await earlier(index) == []
    assert await shown(retriever, "charlie") == [(f"{DOC}_p{i}", 4) for i in range(3)]


async def test_the_same_version_waits_for_a_live_writer_and_takes_over_a_dead_one(stack) -> None:
    """A rebalance hands v2's event to another daemon while the first still writes it: the
    second waits (a retryable error) while the write progresses, and takes over once it stops."""
    index, retriever, client = stack
    other = ChunkIndex(client=client, cfg=index.cfg, dims=384, spec=index.spec)  # another process
    await index.apply(DOC, 1, chunks(1, 10, "alpha"), vectors(10, 1))
    pause, first = await PausedAfter.hold(index, 1, index.apply(DOC, 2, chunks(2, 12, "bravo"), vectors(12, 2)))
    waited = _count("waited")
    with pytest.raises(WriteInProgress, match="being written in slices by another process"):
        await other.apply(DOC, 2, chunks(2, 12, "bravo"), vectors(12, 2))
    assert _count("waited") == waited + 1
    marker_key = doc_marker_key(index.cfg.name, 1, "default", DOC)
    marker = WriteMarker.decode(await client.get(marker_key))
    assert marker is not None
    stalled = dataclasses.replace(marker, beat=marker.beat - TAKEOVER_AFTER_S - 1)
    await client.set(marker_key, stalled.encode())
    other_pause, second = await PausedAfter.hold(other, 1, other.apply(DOC, 2, chunks(2, 12, "bravo"), vectors(12, 2)))
    # The first writer wakes up, finds the write taken over, and now waits in its turn.
    pause.release.set()
    with pytest.raises(WriteInProgress):
        await asyncio.wait_for(first, 10)
    other_pause.release.set()
    assert (await asyncio.wait_for(second, 10)).applied
    result = await index.apply(DOC, 2, chunks(2, 12, "bravo"), vectors(12, 2))  # its retry
    assert not result.applied and result.stored_version == 2  # the ingestor treats it as done
    assert await index.count() == 12
    assert await shown(retriever, "bravo") == sorted((f"{DOC}_p{i}", 2) for i in range(12))
    assert await earlier(index) == [1]  # once, through three starts of the write


async def test_a_live_writer_renews_its_marker_with_every_slice(stack) -> None:
    """Each slice records the write's progress in its marker: a write that has run longer
    than ``TAKEOVER_AFTER_S`` but still progresses is never taken for dead."""
    index, _, client = stack
    await index.apply(DOC, 1, chunks(1, 10, "alpha"), vectors(10, 1))
    first, write = await PausedAfter.hold(index, 1, index.apply(DOC, 2, chunks(2, 12, "bravo"), vectors(12, 2)))
    marker_key = doc_marker_key(index.cfg.name, 1, "default", DOC)
    marker = WriteMarker.decode(await client.get(marker_key))
    assert marker is not None and marker.in_progress
    # As if the write had made its last progress long ago, then the next slice goes in.
    old = dataclasses.replace(marker, since=marker.since - 3600, beat=marker.beat - 3600)
    await client.set(marker_key, old.encode())
    second = PausedAfter(index, 1)  # around the first: counts the slices after it
    index._guarded = second  # type: ignore[method-assign]
    first.release.set()
    await asyncio.wait_for(second.reached.wait(), 10)
    renewed = WriteMarker.decode(await client.get(marker_key))
    assert renewed is not None and renewed.in_progress and renewed.beat >= marker.beat
    # Another process's redelivery of the same version waits for it rather than taking over.
    other = ChunkIndex(client=client, cfg=index.cfg, dims=384, spec=index.spec)
    with pytest.raises(WriteInProgress):
        await other.apply(DOC, 2, chunks(2, 12, "bravo"), vectors(12, 2))
    second.release.set()
    second.restore()
    first.restore()
    assert (await asyncio.wait_for(write, 10)).applied


async def test_a_copy_does_not_undo_a_newer_write_under_way(stack) -> None:
    """A reindex's catch-up copies v2 from another generation while v3 is half-written here:
    the copy is refused and counts as covered, and v3 ends whole, with no chunk orphaned."""
    index, retriever, client = stack
    gen, _ = await index.registry.reserve("test-copy")
    source = ChunkIndex(client=client, cfg=index.cfg, dims=384, spec=index.spec, generation=gen)
    try:
        await source.ensure()
        await source.apply(DOC, 2, chunks(2, 20, "delta"), vectors(20, 2))
        await index.apply(DOC, 1, chunks(1, 6, "alpha"), vectors(6, 1))
        pause, v3 = await PausedAfter.hold(index, 1, index.apply(DOC, 3, chunks(3, 10, "bravo"), vectors(10, 3)))
        assert not await index.copy_doc(gen, "default", DOC)
        assert await index.behind({("default", DOC): DocState(version=2, has_chunks=True)}) == []
        pause.release.set()
        assert (await asyncio.wait_for(v3, 10)).applied
        assert await index.chunk_ids(DOC) == {f"{DOC}_p{i}" for i in range(10)}
        keys = [k async for k in client.scan_iter(match=f"{chunk_prefix(index.cfg.name, 1)}*")]
        assert len(keys) == 10
        assert await shown(retriever, "bravo") == sorted((f"{DOC}_p{i}", 3) for i in range(10))
        assert await shown(retriever, "delta") == []
    finally:
        await index.registry.release("test-copy")
        await source.drop()


async def test_a_write_that_died_half_way_is_taken_over_by_its_redelivery(stack) -> None:
    """The writer is cancelled after the two slices of v2 (12 old chunks, 6 new): the doc shows
    what is left of v1 meanwhile; the redelivered v2 deletes every chunk it lacks."""
    index, retriever, client = stack
    await index.apply(DOC, 1, chunks(1, 12, "alpha"), vectors(12, 1))
    pause, dead = await PausedAfter.hold(index, 2, index.apply(DOC, 2, chunks(2, 6, "bravo"), vectors(6, 2)))
    dead.cancel()
    with pytest.raises(asyncio.CancelledError):
        await dead
    pause.restore()
    assert await shown(retriever, "alpha") == sorted((f"{DOC}_p{i}", 1) for i in range(6, 12))
    assert await shown(retriever, "bravo") == []
    assert await index.versions([DOC]) == {DOC: 1}
    # doctor: a write under way is fine; one begun long ago was left by a writer that died.
    settings = Settings(index=index.cfg)
    assert [f.ok for f in await check_unfinished_writes(client, settings, 384)] == [True]
    marker_key = doc_marker_key(index.cfg.name, 1, "default", DOC)
    marker = WriteMarker.decode(await client.get(marker_key))
    assert marker is not None and marker.in_progress
    stopped = dataclasses.replace(marker, since=marker.since - 3600, beat=marker.beat - 3600)
    await client.set(marker_key, stopped.encode())
    (finding,) = await check_unfinished_writes(client, settings, 384)
    assert not finding.ok and f"default/{DOC} (version 2, showing version 1" in finding.detail, finding
    await client.set(marker_key, marker.encode())  # as it was: progress a moment ago
    # Another process waits for it; this one's own failed attempt is taken over at once.
    other = ChunkIndex(client=client, cfg=index.cfg, dims=384, spec=index.spec)
    with pytest.raises(WriteInProgress):
        await other.apply(DOC, 2, chunks(2, 6, "bravo"), vectors(6, 2))
    again = await index.apply(DOC, 2, chunks(2, 6, "bravo"), vectors(6, 2))
    assert again.applied
    assert await index.chunk_ids(DOC) == {f"{DOC}_p{i}" for i in range(6)}
    assert await index.count() == 6
    assert await shown(retriever, "bravo") == [(f"{DOC}_p{i}", 2) for i in range(6)]
    assert await earlier(index) == [1]
    (finding,) = await check_unfinished_writes(client, settings, 384)
    assert finding.ok and "no document is being written" in finding.detail, finding


async def test_a_reindex_copy_and_switch_mid_write(stack) -> None:
    """A reindex copies a half-written doc (its marker too, so the copy hides what the source
    hides) and switches; the write starts again in the new generation and ends there whole."""
    index, retriever, client = stack
    await index.apply(DOC, 1, chunks(1, 10, "alpha"), vectors(10, 1))
    pause, write = await PausedAfter.hold(index, 1, index.apply(DOC, 2, chunks(2, 12, "bravo"), vectors(12, 2)))
    gen, _ = await index.registry.reserve("test-reindex")
    target = ChunkIndex(client=client, cfg=index.cfg, dims=384, spec=index.spec, generation=gen)
    await target.ensure()
    assert await target.copy_doc(1, "default", DOC)
    copied = WriteMarker.decode(await client.get(doc_marker_key(index.cfg.name, gen, "default", DOC)))
    assert copied is not None and copied.in_progress and copied.shown == 1
    # A query-side reader whose view of the registry predates the switch (it trusts a read
    # for STATE_TTL_S): the alias it searches moves at once, so markers must come from the
    # generation of each hit, not from its cached one.
    reader = ChunkIndex(client=client, cfg=index.cfg, dims=384, spec=index.spec)
    reader.STATE_TTL_S = 3600.0
    assert (await reader.state()).active == 1
    stale_view = Retriever(index=reader, embedder=retriever._embedder, cfg=RetrievalConfig())
    await index.registry.switch("test-reindex", gen, index.spec)
    await index.registry.release("test-reindex")
    assert (await reader.state()).active == 1
    assert await shown(stale_view, "bravo") == []
    # Served from the copy now: still the old version only.
    assert await shown(retriever, "bravo") == []
    assert await shown(retriever, "alpha") == [(f"{DOC}_p{i}", 1) for i in range(4, 10)]
    with capture_logs() as logs:
        pause.release.set()
        assert (await asyncio.wait_for(write, 10)).applied
    assert any(e["event"] == "index.sliced_write_restarted" for e in logs)
    assert await target.versions([DOC]) == {DOC: 2}
    assert await target.chunk_ids(DOC) == {f"{DOC}_p{i}" for i in range(12)}
    assert await shown(retriever, "bravo") == sorted((f"{DOC}_p{i}", 2) for i in range(12))
    assert await earlier(target) == [1]  # copied over, not kept again by the restarted write
    assert await shown(retriever, "alpha") == []
    # A doc with no marker in the old generation, half-written in the new one.
    other_doc = "specs/other.md"
    await target.apply(other_doc, 1, chunks(1, 8, "echo", other_doc), vectors(8, 5))
    pause, write = await PausedAfter.hold(
        target, 1, target.apply(other_doc, 2, chunks(2, 8, "foxtrot", other_doc), vectors(8, 6))
    )
    assert (await reader.state()).active == 1
    assert await raw_versions(target, "foxtrot") == {2}
    assert await shown(stale_view, "foxtrot") == []
    assert await shown(stale_view, "echo") == sorted((f"{other_doc}_p{i}", 1) for i in range(4, 8))
    pause.release.set()
    assert (await asyncio.wait_for(write, 10)).applied
    await target.drop()


async def test_a_copy_of_a_half_written_doc_is_replaced_once_the_source_is_whole(stack) -> None:
    """A reindex copies v2 half-written (its marker, with no owner), v2 then finishes in the
    source: the target is behind, and the catch-up copy brings v2 whole."""
    index, _, client = stack
    await index.apply(DOC, 1, chunks(1, 10, "alpha"), vectors(10, 1))
    gen, _ = await index.registry.reserve("test-recopy")
    target = ChunkIndex(client=client, cfg=index.cfg, dims=384, spec=index.spec, generation=gen)
    try:
        await target.ensure()
        pause, write = await PausedAfter.hold(index, 1, index.apply(DOC, 2, chunks(2, 12, "bravo"), vectors(12, 2)))
        assert await target.copy_doc(1, "default", DOC)
        pause.release.set()
        assert (await asyncio.wait_for(write, 10)).applied
        held = await index.doc_versions()
        assert await target.behind(held) == [("default", DOC)]
        assert await target.copy_doc(1, "default", DOC)
        assert await target.behind(held) == []
        assert await client.get(doc_marker_key(index.cfg.name, gen, "default", DOC)) is None
        assert await target.chunk_ids(DOC) == {f"{DOC}_p{i}" for i in range(12)}
        assert await target.versions([DOC]) == {DOC: 2}
    finally:
        await index.registry.release("test-recopy")
        await target.drop()


async def test_a_new_doc_copied_half_written_is_listed_once_whole(stack) -> None:
    """A reindex copies a new doc mid-write (nothing of it shows): the target's directory does
    not list it; the catch-up copy of the finished write does, with all its chunks."""
    index, _, client = stack
    gen, _ = await index.registry.reserve("test-list-copy")
    target = ChunkIndex(client=client, cfg=index.cfg, dims=384, spec=index.spec, generation=gen)
    try:
        await target.ensure()
        pause, write = await PausedAfter.hold(index, 1, index.apply(DOC, 1, chunks(1, 12, "alpha"), vectors(12, 1)))
        assert await index.documents("default", limit=10) == []
        assert await target.copy_doc(1, "default", DOC)
        assert await target.documents("default", limit=10) == []
        pause.release.set()
        assert (await asyncio.wait_for(write, 10)).applied
        assert await target.copy_doc(1, "default", DOC)
        assert [(g.value, g.chunks, g.version) for g in await target.documents("default", limit=10)] == [(DOC, 12, 1)]
    finally:
        await index.registry.release("test-list-copy")
        await target.drop()


async def test_hidden_chunks_do_not_crowd_a_leg_out(stack) -> None:
    """The new version's first slice outranks every old chunk for the query: the BM25 leg is
    asked again for more candidates, so the answer still holds top_k old chunks."""
    index, default, _ = stack
    # No candidate floor: a leg fetches 2 x top_k, so a slice's hidden chunks can fill it.
    retriever = Retriever(index=index, embedder=default._embedder, cfg=RetrievalConfig(min_candidates=0))
    await index.apply(DOC, 1, chunks(1, 10, "alpha"), vectors(10, 1))
    new = chunks(2, 12, "alpha alpha alpha alpha")
    pause, write = await PausedAfter.hold(index, 1, index.apply(DOC, 2, new, vectors(12, 2)))
    k = retriever.fetch_k(2)
    assert k <= SLICE  # the leg's first candidates are exactly the hidden chunks
    assert {h.version for h in await index.search_text(bm25_query(query_terms("alpha")), k=k)} == {2}
    out = await retriever.search(SearchSpec(text="alpha", top_k=2, dense_weight=0.0, identifier_weight=0.0))
    assert [(h.chunk.version, h.chunk.doc_id) for h in out.hits] == [(1, DOC), (1, DOC)]
    pause.release.set()
    await asyncio.wait_for(write, 10)


async def test_the_winners_read_brings_every_standing_marker(stack) -> None:
    """The winners' read returns every write marker standing in the index, listed with it:
    none before a sliced write, its marker while it runs and for a while after (finished),
    none once that is gone; the next sliced write's end drops the gone one from the list."""
    index, retriever, client = stack
    await index.apply("specs/small.md", 1, chunks(1, 2, "delta", doc_id="specs/small.md"), vectors(2, 11))
    hits = await index.rank_text(bm25_query(query_terms("delta")), k=5, tag_keys=())
    assert hits
    assert (await index.hydrate(hits, None))[1] == {}
    writing = index._writing_key()
    first_marker = doc_marker_key(index.cfg.name, 1, "default", DOC)
    pause, task = await PausedAfter.hold(index, 1, index.apply(DOC, 1, chunks(1, 10, "echo"), vectors(10, 12)))
    try:
        standing = (await index.hydrate(hits, None))[1]
        assert standing is not None and list(standing) == [first_marker]
        assert standing[first_marker].in_progress
        assert await shown(retriever, "echo") == []  # and the write's chunks stay hidden
    finally:
        pause.restore()
        pause.release.set()
    assert (await task).applied
    complete = index.marker_list.sentinel.encode()
    assert await client.smembers(writing) == {first_marker.encode(), complete}
    standing = (await index.hydrate(hits, None))[1]
    assert standing is not None and standing[first_marker].shown == 1  # finished, kept a while
    assert await shown(retriever, "echo") == [(f"{DOC}_p{i}", 1) for i in range(10)]
    await client.delete(first_marker)  # as its expiry would
    assert (await index.hydrate(hits, None))[1] == {}
    other = "specs/other.md"
    await index.apply(other, 1, chunks(1, 10, "foxtrot", doc_id=other), vectors(10, 13))
    assert await client.smembers(writing) == {doc_marker_key(index.cfg.name, 1, "default", other).encode(), complete}


async def test_a_write_stays_hidden_when_too_many_markers_are_listed_to_read_at_once(stack) -> None:
    """Past the markers one winners' read takes, the candidates' docs' markers are read
    instead, a write under way stays hidden all the same, and the list is pruned."""
    index, retriever, client = stack
    await index.apply(DOC, 1, chunks(1, 6, "golf"), vectors(6, 14))
    await client.sadd(index._writing_key(), *(f"gone-marker-{i}" for i in range(MAX_READ + 1)))
    hits = await index.rank_text(bm25_query(query_terms("golf")), k=5, tag_keys=())
    assert (await index.hydrate(hits, None))[1] is None
    pause, task = await PausedAfter.hold(index, 1, index.apply(DOC, 2, chunks(2, 10, "golf hotel"), vectors(10, 15)))
    try:
        during = await shown(retriever, "golf")  # the slice overwrote some old chunks in place
        assert during and all(version == 1 for _, version in during)
    finally:
        pause.restore()
        pause.release.set()
    assert (await task).applied
    assert await shown(retriever, "golf") == [(f"{DOC}_p{i}", 2) for i in range(10)]
    marker = doc_marker_key(index.cfg.name, 1, "default", DOC).encode()
    assert await client.smembers(index._writing_key()) == {marker, index.marker_list.sentinel.encode()}


async def test_a_lost_list_of_markers_is_read_around_and_rebuilt(stack) -> None:
    """Where the list of markers is gone (evicted, deleted), queries read the candidates'
    markers, a write under way stays hidden, and the list is rebuilt complete."""
    index, retriever, client = stack
    await index.apply(DOC, 1, chunks(1, 6, "juliet"), vectors(6, 17))
    pause, task = await PausedAfter.hold(index, 1, index.apply(DOC, 2, chunks(2, 10, "juliet kilo"), vectors(10, 18)))
    try:
        await client.delete(index._writing_key())
        during = await shown(retriever, "juliet")
        assert during and all(version == 1 for _, version in during)
        for _ in range(100):  # rebuilt in the background
            if await client.sismember(index._writing_key(), index.marker_list.sentinel):
                break
            await asyncio.sleep(0.05)
        marker = doc_marker_key(index.cfg.name, 1, "default", DOC)
        assert await client.smembers(index._writing_key()) == {marker.encode(), index.marker_list.sentinel.encode()}
        hits = await index.rank_text(bm25_query(query_terms("juliet")), k=5, tag_keys=())
        standing = (await index.hydrate(hits, None))[1]
        assert standing is not None and standing[marker].in_progress
    finally:
        pause.restore()
        pause.release.set()
    assert (await task).applied


async def test_a_doc_id_that_looks_like_a_marker_key_is_not_listed(stack) -> None:
    """The rebuild lists only marker keys: a doc whose id holds ':wr:' is searched as any other."""
    index, retriever, client = stack
    doc_id = "notes:wr:1"
    await index.apply(doc_id, 1, chunks(1, 2, "lima", doc_id=doc_id), vectors(2, 19))
    await index.marker_list.relist()
    assert await client.smembers(index._writing_key()) == {index.marker_list.sentinel.encode()}
    assert await shown(retriever, "lima") == [(f"{doc_id}_p0", 1), (f"{doc_id}_p1", 1)]


async def test_markers_stored_unlisted_are_listed_at_start(stack) -> None:
    """A marker left by a daemon that did not list markers is listed when the index starts,
    so queries read it."""
    index, _, client = stack
    await index.apply("specs/small.md", 1, chunks(1, 2, "india", doc_id="specs/small.md"), vectors(2, 16))
    key = doc_marker_key(index.cfg.name, 1, "default", "specs/old.md")
    await client.set(key, WriteMarker(shown=None, writing=1).encode())
    assert key.encode() not in await client.smembers(index._writing_key())
    await index.ensure()
    assert key.encode() in await client.smembers(index._writing_key())
    hits = await index.rank_text(bm25_query(query_terms("india")), k=5, tag_keys=())
    standing = (await index.hydrate(hits, None))[1]
    assert standing is not None and key in standing


@pytest.mark.parametrize("size", [2, SLICE * 3])  # one transaction; and the marker's, of a sliced write
async def test_a_write_whose_watching_connection_is_lost_is_an_outage_not_a_conflict(
    stack: tuple[ChunkIndex, Retriever, aredis.Redis], redis_url: str, size: int
) -> None:
    """Redis restarting, or loading its data after a restart, fails the connection a write
    watches its keys on: redis-py says so with a WatchError. That is an outage, waited out and
    retried (``BackendUnavailable``), not a conflict: tried again at once, 16 times within the
    outage, it would give the write up as conflicting, to the DLQ."""
    index, _, _ = stack
    killer = aredis.from_url(redis_url)
    state = index.registry.state
    killed = 0

    async def lost(pipe: Any = None) -> Any:
        nonlocal killed
        if pipe is not None:  # the watching read: its connection dies under it, as in a restart
            killed += 1
            await killer.execute_command("CLIENT", "KILL", "ID", await pipe.client_id())
        return await state(pipe)

    index.registry.state = lost  # type: ignore[method-assign]
    try:
        with pytest.raises(BackendUnavailable, match=r"redis unavailable during .*Connection closed"):
            await index.apply(DOC, 1, chunks(1, size, "lost"), vectors(size, 1))
        assert killed == 1  # given up as an outage at once, not after 16 tries
    finally:
        del index.registry.state
        await killer.aclose()
    # Redis back: the same write goes through.
    result = await index.apply(DOC, 1, chunks(1, size, "lost"), vectors(size, 1))
    assert result.applied and await index.chunk_ids(DOC) == {f"{DOC}_p{i}" for i in range(size)}
