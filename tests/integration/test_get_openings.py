"""A ``get`` reads only the opening of documents longer than its reply holds, on the real
embedder and Redis: the reply, once cut to its size, is the one a read of every chunk gives
(contents, versions, metadata, histories, what is left off and what says so, in any order of
ids, with a filter that leaves a long document out); a document being written in slices shows
as it would, alone or ahead of others; and a read while edits land is of one version."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from consumers.queries import to_get_reply
from consumers.reply_fit import fit
from consumers.requests import GetReply, GetRequest
from memory.records import ChunkRecord, MemoryItem
from memory.search_results import Lookup
from tests.conftest import unique
from tests.helpers.stacks import Stack, memory_stack
from tests.integration.test_sliced_writes import PausedAfter, vectors

pytestmark = pytest.mark.integration


def paragraphs(doc: str, n: int, word: str) -> str:
    # Non-ASCII letters too: a character is not a byte, and JSON escapes none of these.
    para = f"{word} ledger-service note {{}} for {doc}: replication lag on shard {{}}, café déjà vu. " * 6
    return "\n\n".join(para.format(*[i, i] * 6) for i in range(n)) + "\n"


def upsert(doc: str, version: int, content: str, **meta: Any) -> MemoryItem:
    tags = {k: str(v) for k, v in meta.items()}
    return MemoryItem(
        "upsert", doc, version, content=content, source=doc, tags=tags, metadata=meta, timestamp=1000.0 * version
    )


async def replies(
    stack: Stack, ids: Sequence[str], max_bytes: int, *, history: bool = False, flt: dict[str, str] | None = None
) -> tuple[GetReply, GetReply, list[Lookup]]:
    """The reply to a get of ``ids`` cut to ``max_bytes``, read whole and read as openings (and those openings)."""
    req = GetRequest(query_id="q", op="get", doc_ids=list(ids), history=history, metadata_filter=flt)
    whole = await stack.retriever.lookups.lookup(ids, history=history, metadata_filter=flt)
    opened = await stack.retriever.lookups.lookup(ids, history=history, metadata_filter=flt, content_chars=max_bytes)
    return fit(to_get_reply(req, whole, 0.0), max_bytes), fit(to_get_reply(req, opened, 0.0), max_bytes), opened


async def test_a_reply_read_from_openings_is_the_reply_read_whole(redis_url: str, embedder: Any) -> None:
    docs = {"notes/one.md": 1, "notes/few.md": 4, "specs/long.md": 40, "specs/longer.md": 60}
    async with memory_stack(redis_url, embedder, unique(__name__)) as stack:
        for version in (1, 2):
            await stack.ingestor.apply(
                [upsert(d, version, paragraphs(d, n, f"v{version}"), team="ops") for d, n in docs.items()]
            )
        lengths = {d: len((await stack.retriever.lookups.lookup([d]))[0].content) for d in docs}
        assert lengths["specs/long.md"] > 20_000 and len(await stack.index.chunk_ids("specs/long.md")) > 10
        orders = [
            ["specs/long.md"],
            ["notes/one.md", "specs/long.md", "notes/few.md"],
            ["specs/longer.md", "notes/missing.md", "notes/one.md"],
            ["notes/few.md", "notes/one.md", "specs/long.md", "specs/longer.md"],
        ]
        short = 0
        for ids, max_bytes, history in itertools.product(orders, (700, 3_000, 12_000, 50_000, 400_000), (False, True)):
            whole, opened, openings = await replies(stack, ids, max_bytes, history=history)
            assert opened == whole, (ids, max_bytes, history)
            short += sum(not o.whole for o in openings)
            for i, o in enumerate(openings):
                if not o.whole:
                    # Read short only where the reply must cut: the contents up to it hold more
                    # characters than the reply holds bytes.
                    assert sum(len(x.content) for x in openings[: i + 1]) > max_bytes
                    assert len(o.chunks) < len(await stack.index.chunk_ids(o.doc_id))
        assert short > 0, "no document was read short: the test did not exercise the openings"
        # A long document the filter leaves out takes no characters from the ones after it.
        for d in docs:
            service = "dev" if "long" in d else "ops"
            await stack.ingestor.apply([upsert(d, 3, paragraphs(d, docs[d], "v3"), service=service)])
        for ids in (["specs/long.md", "notes/few.md"], ["specs/longer.md", "specs/long.md", "notes/one.md"]):
            for max_bytes in (700, 3_000, 12_000, 30_000):
                whole, opened, _ = await replies(stack, ids, max_bytes, flt={"service": "ops"})
                assert opened == whole, (ids, max_bytes)
        # A budget past every document reads each whole.
        _, _, openings = await replies(stack, list(docs), 10**7)
        assert all(o.whole for o in openings)


async def test_a_document_being_written_in_slices_shows_as_a_whole_read_shows_it(redis_url: str, embedder: Any) -> None:
    doc = "specs/sliced.md"

    def chunks(version: int, n: int, doc: str = doc) -> list[ChunkRecord]:
        text = [f"v{version} section {i} of the large specification, in words enough to count. " for i in range(n)]
        starts = list(itertools.accumulate((len(t) for t in text), initial=0))
        return [
            ChunkRecord(
                chunk_id=f"{doc}_p{i}",
                doc_id=doc,
                position=i,
                text=t,
                kind="document",
                source=doc,
                tags={},
                metadata={},
                version=version,
                timestamp=1_700_000_000.0 + version,
                start=starts[i],
            )
            for i, t in enumerate(text)
        ]

    async with memory_stack(redis_url, embedder, unique(__name__), write_slice_chunks=4) as stack:
        index = stack.index

        async def both() -> tuple[Lookup, Lookup]:
            (a,) = await stack.retriever.lookups.lookup([doc])
            (b,) = await stack.retriever.lookups.lookup([doc], content_chars=200)
            return a, b

        # A new doc half written: not found either way.
        pause, write = await PausedAfter.hold(index, 1, index.apply(doc, 1, chunks(1, 12), vectors(12, 1)))
        a, b = await both()
        assert (a.status, b.status) == ("not_found", "not_found")
        pause.release.set()
        await asyncio.wait_for(write, 10)
        pause.restore()
        # Ahead of a whole doc, a half-written one takes none of its characters.
        big, small = "specs/half.md", "notes/small.md"
        await stack.ingestor.apply([upsert(small, 1, paragraphs(small, 8, "v1"))])
        pause, write = await PausedAfter.hold(index, 8, index.apply(big, 1, chunks(1, 40, big), vectors(40, 1)))
        req = GetRequest(query_id="q", op="get", doc_ids=[big, small])
        for max_bytes in (300, 5_000, 20_000):  # 5,000: more than the small doc, less than both
            whole = await stack.retriever.lookups.lookup([big, small])
            opened = await stack.retriever.lookups.lookup([big, small], content_chars=max_bytes)
            assert whole[0].status == "not_found" and whole[1].status == "found" and len(whole[1].chunks) > 1
            assert fit(to_get_reply(req, opened, 0.0), max_bytes) == fit(to_get_reply(req, whole, 0.0), max_bytes)
        pause.release.set()
        await asyncio.wait_for(write, 10)
        pause.restore()
        a, b = await both()
        assert (a.status, b.status, b.whole) == ("found", "found", False)
        assert a.content.startswith(b.content) and len(b.content) > 200
        # A new version half written over it: being written, either way, though the opening
        # read holds only chunks of the new version and the rest only by their versions.
        pause, write = await PausedAfter.hold(index, 2, index.apply(doc, 2, chunks(2, 12), vectors(12, 2)))
        a, b = await both()
        assert (a.status, b.status) == ("writing", "writing")
        pause.release.set()
        await asyncio.wait_for(write, 10)
        a, b = await both()
        assert (a.status, a.version, b.status, b.version) == ("found", 2, "found", 2)
        assert a.content.startswith(b.content)


async def test_an_opening_read_while_edits_land_is_one_versions(redis_url: str, embedder: Any) -> None:
    """Edits (each of another length and version) land while openings are read: each reply is
    one version's opening, never the versions of one and the chunks of another."""
    doc = "wiki/growing.md"
    contents = {v: paragraphs(doc, 24 + 3 * (v % 3), f"v{v}") for v in range(1, 16)}
    async with memory_stack(redis_url, embedder, unique(__name__)) as stack:
        await stack.ingestor.apply([upsert(doc, 1, contents[1])])
        seen: list[Lookup] = []
        editing = True

        async def look() -> None:
            while editing:
                (got,) = await stack.retriever.lookups.lookup([doc], content_chars=3_000)
                seen.append(got)

        reader = asyncio.create_task(look())
        try:
            for version in range(2, 16):
                await stack.ingestor.apply([upsert(doc, version, contents[version])])
                await asyncio.sleep(0)
        finally:
            editing = False
            await reader
        assert len({got.version for got in seen}) > 3, "the lookups met too few of the edits to tell"
        for got in seen:
            assert got.status == "found" and not got.whole and len(got.content) > 3_000
            assert contents[got.version or 0].startswith(got.content), got.version
            assert {c.version for c in got.chunks} == {got.version}
