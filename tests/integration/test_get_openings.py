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
from memory.lookups import water_level
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
            whole_reads = await stack.retriever.lookups.lookup(ids)
            short += sum(not o.whole for o in openings)
            shown = [o for o in openings if o.status == "found"]
            level = water_level([o.size or 0 for o in shown], max_bytes)
            for o in shown:
                assert o.size == len(next(w for w in whole_reads if w.doc_id == o.doc_id).content)
                if not o.whole:
                    # Read short only where the reply must cut: it holds more characters than
                    # the reply's bytes shared among the documents keep of it.
                    assert (o.size or 0) > level and len(o.content) > level
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


async def page(stack: Stack, doc: str, max_bytes: int, offset: int, version: int | None = None) -> GetReply:
    """The daemon's reply to a get of ``doc`` from ``offset`` (of ``version``), cut to ``max_bytes``."""
    req = GetRequest(query_id="q", op="get", doc_ids=[doc], content_offset=offset, version=version)
    found = await stack.retriever.lookups.lookup([doc], content_chars=max_bytes, offset=offset, version=version)
    reply = fit(to_get_reply(req, found, 0.0), max_bytes)
    assert isinstance(reply, GetReply)
    return reply


async def read_all(stack: Stack, doc: str, max_bytes: int, version: int | None = None) -> tuple[str, int, int]:
    """A doc read page by page, each from where the last ended, pinned to the first page's
    version: its content, version and number of pages."""
    text, pages = "", 0
    while True:
        (item,) = (await page(stack, doc, max_bytes, len(text), version)).items
        assert item.status == "found" and item.content is not None, (item.status, len(text))
        version, text, pages = item.version, text + item.content, pages + 1
        if not item.content_truncated:
            return text, version or 0, pages


async def test_a_document_is_read_on_from_any_character_in_any_version_it_keeps(redis_url: str, embedder: Any) -> None:
    """A get from a character on is the whole content from there, cut as a reply cuts it, at
    chunk starts, inside chunks, in the text put back between them, and past the end; read
    page by page it is the document byte for byte, its current version or one its history
    keeps, while edits land between the pages. A version kept no longer, or outside the
    filter, is not found."""
    doc = "specs/paged.md"
    contents = {v: paragraphs(doc, 50, f"v{v}").replace("\n\n", "\n\n \t\n\n") + "  \n" for v in (1, 2, 3)}
    async with memory_stack(redis_url, embedder, unique(__name__), history_versions=1) as stack:
        for v in (1, 2):
            await stack.ingestor.apply([upsert(doc, v, contents[v], service="ops")])
        chunks = (await stack.retriever.lookups.lookup([doc]))[0].chunks
        assert len(chunks) > 10
        starts = [c.start or 0 for c in chunks]
        n = len(contents[2])
        offsets = {0, 1, n - 1, n, n + 10, *starts[3:6], *(s - 1 for s in starts[3:6]), *(s + 7 for s in starts[3:6])}
        for offset, max_bytes in itertools.product(sorted(offsets), (700, 5_000, 40_000, 400_000)):
            req = GetRequest(query_id="q", op="get", doc_ids=[doc], content_offset=offset)
            rest = Lookup(doc, "found", chunks, contents[2][offset:], 2)
            assert await page(stack, doc, max_bytes, offset) == fit(to_get_reply(req, [rest], 0.0), max_bytes), offset
        for max_bytes in (3_000, 20_000):
            text, version, pages = await read_all(stack, doc, max_bytes)
            assert (text, version) == (contents[2], 2) and pages > 1
            text, version, _ = await read_all(stack, doc, max_bytes, version=1)
            assert (text, version) == (contents[1], 1)
        # An earlier version says when it was replaced; the current one does not.
        (old,) = (await page(stack, doc, 400_000, 0, version=1)).items
        (now,) = (await page(stack, doc, 400_000, 0, version=2)).items
        assert old.until is not None and now.until is None and old.metadata == {"service": "ops"}
        # An edit lands between two pages: the version read on is the one the first page showed.
        (first,) = (await page(stack, doc, 3_000, 0)).items
        await stack.ingestor.apply([upsert(doc, 3, contents[3], service="dev")])
        (second,) = (await page(stack, doc, 3_000, len(first.content or ""), version=first.version)).items
        assert (second.status, second.version) == ("found", 2)
        assert contents[2].startswith((first.content or "") + (second.content or ""))
        # Kept no longer (one earlier version is kept), or outside the filter: not found.
        (gone,) = (await page(stack, doc, 3_000, 0, version=1)).items
        assert (gone.status, gone.content) == ("not_found", None)
        flt = await stack.retriever.lookups.lookup([doc], version=2, metadata_filter={"service": "dev"})
        assert flt[0].status == "not_found"
        (three,) = await stack.retriever.lookups.lookup([doc], version=3, metadata_filter={"service": "dev"})
        assert (three.status, three.content) == ("found", contents[3])


async def test_a_document_stored_without_its_opening_text_reads_on_from_its_first_word(
    redis_url: str, embedder: Any
) -> None:
    """A doc stored with its chunks' starts but not the text it opens with (an indent; an
    earlier release kept no such text) reads from its first word: read on, page by page, it
    is that content, and a reply from any offset is the one its whole read gives."""
    doc = "notes/indented.md"
    async with memory_stack(redis_url, embedder, unique(__name__)) as stack:
        await stack.ingestor.apply([upsert(doc, 1, "    " + paragraphs(doc, 30, "w") + "\n\n")])
        (stored,) = await stack.retriever.lookups.lookup([doc])
        gen = await stack.index._generation()
        await stack.client.hdel(stack.index._chunk_key(gen, "default", stored.chunks[0].chunk_id), "chunk_gap")
        await stack.client.hdel(stack.index._chunk_key(gen, "default", stored.chunks[-1].chunk_id), "chunk_tail")
        (whole,) = await stack.retriever.lookups.lookup([doc])
        assert whole.content.startswith("w ledger") and stored.content.startswith("    w ledger")
        text, _, pages = await read_all(stack, doc, 5_000)
        assert text == whole.content and pages > 1
        starts = [(c.start or 0) - 4 for c in whole.chunks]
        for offset in (0, 3, starts[5], starts[5] + 9, len(whole.content) - 1):
            req = GetRequest(query_id="q", op="get", doc_ids=[doc], content_offset=offset)
            rest = Lookup(doc, "found", whole.chunks, whole.content[offset:], 1)
            assert await page(stack, doc, 5_000, offset) == fit(to_get_reply(req, [rest], 0.0), 5_000), offset
