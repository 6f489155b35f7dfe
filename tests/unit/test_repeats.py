"""Folding repeated texts while the winners are read (pure: the index is a double that hands
back stored chunks and counts its round trips)."""

from __future__ import annotations

from typing import Any

import pytest

from memory.config import RetrievalConfig
from memory.filters import BASE_FILTER_KEYS
from memory.fusion import Fused
from memory.index import LegHit
from memory.records import DEFAULT_TENANT, StoredChunk
from memory.repeats import MAX_LISTED_REPEATS, fold_key, repeat_key
from memory.retrieval import Retriever
from memory.search_spec import SearchSpec, search_filter


class CountingIndex:
    """``ChunkIndex.hydrate``'s shape: the chunks of the hits asked for, no write markers."""

    def __init__(self, chunks: dict[str, StoredChunk]) -> None:
        self.chunks = chunks
        self.reads: list[int] = []

    async def hydrate(self, found: list[LegHit], _docs: Any) -> tuple[list[StoredChunk | None], dict[Any, Any]]:
        self.reads.append(len(found))
        return [self.chunks.get(h.chunk_id) for h in found], {}


def _chunk(n: int, text: str, kind: str = "document", role: str = "") -> StoredChunk:
    meta = {"role": role} if role else {}
    tags = {"tenant": DEFAULT_TENANT, "kind": kind}
    return StoredChunk(f"d{n}_p0", text, f"d{n}", f"d{n}", kind, meta, tags, timestamp=float(n), version=1)


async def _fold(chunks: list[StoredChunk], top_k: int, **spec: Any) -> tuple[list[Any], list[int]]:
    index = CountingIndex({c.chunk_id: c for c in chunks})
    retriever = Retriever(index=index, embedder=None, cfg=RetrievalConfig())  # type: ignore[arg-type]
    s = SearchSpec(text="q", top_k=top_k, **spec)
    fused = [Fused(c.chunk_id, 1.0 / (i + 1), {"sparse": i + 1}) for i, c in enumerate(chunks)]
    by_id = {c.chunk_id: LegHit(c.chunk_id, c.chunk_id, c.kind, c.tags, (), c.timestamp, 1, None) for c in chunks}
    hits, _ = await retriever._hydrated(fused, by_id, s, search_filter(s, BASE_FILTER_KEYS))
    return hits, index.reads


async def test_a_hundred_copies_fold_into_one_result_in_a_few_reads() -> None:
    """The places the copies free go to the next memories, and reads double once texts repeat."""
    copies = [_chunk(n, "Nightly build FAILED on test_ledger_close.") for n in range(100)]
    others = [_chunk(100 + n, f"Memory number {n}.") for n in range(2)]
    hits, reads = await _fold(copies + others, top_k=3)
    assert [h.chunk.doc_id for h in hits] == ["d0", "d100", "d101"]
    assert hits[0].repeat_count == 99 and len(hits[0].repeats) == MAX_LISTED_REPEATS
    assert [r.doc_id for r in hits[0].repeats[:2]] == ["d99", "d98"]  # newest first (d<n> is at time n)
    assert len(reads) <= 8, reads  # a read per freed place took 51


async def test_nothing_folds_when_asked_not_to_or_nothing_repeats() -> None:
    chunks = [_chunk(n, "Same words.") for n in range(3)]
    hits, reads = await _fold(chunks, top_k=3, fold_repeats=False)
    assert [h.repeat_count for h in hits] == [0, 0, 0] and reads == [3]
    hits, reads = await _fold([_chunk(n, f"Text {n}.") for n in range(5)], top_k=3)
    assert len(hits) == 3 and reads == [3]  # one round trip, as before folding


@pytest.mark.parametrize(
    ("a", "b", "context_turns", "folds"),
    [
        (("Bye!", "transcript", "user"), ("bye!", "transcript", "user"), 0, True),
        (("Bye!", "transcript", "user"), ("Bye!", "transcript", "assistant"), 0, False),  # two speakers
        (("Yes, do it.", "transcript", "user"), ("Yes, do it.", "transcript", "user"), 2, False),  # two exchanges
        (("Restart  pgbouncer.\n", "document", ""), ("restart pgbouncer.", "document", ""), 2, True),
        (("Restart pgbouncer.", "document", ""), ("Restart pgbouncer", "document", ""), 0, True),  # its stop
        (("Restart pgbouncer, now", "document", ""), ("Restart pgbouncer now", "document", ""), 0, False),
        (("Restart pgbouncer.", "document", ""), ("Restart pgbouncer.", "transcript", "user"), 0, False),
    ],
)
def test_what_folds(a: tuple[str, str, str], b: tuple[str, str, str], context_turns: int, folds: bool) -> None:
    x, y = _chunk(1, a[0], a[1], a[2]), _chunk(2, b[0], b[1], b[2])
    kx, ky = fold_key(x, context_turns), fold_key(y, context_turns)
    assert (bool(kx) and kx == ky) is folds
    assert repeat_key(" A\tb ") == repeat_key("a B")
