"""BM25 statistics of a memory whose chunks are rewritten (each turn, as the next two arrive),
against a real Redis with RediSearch, set up as the embedded one is (``daemon.launcher``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aredis

from consumers.events import TranscriptEvent
from daemon.doctor_index import check_lengths
from memory.filters import BASE_FILTER_KEYS
from memory.ingest import Ingestor
from memory.retrieval import Retriever
from memory.schema import as_str
from memory.search_spec import SearchSpec
from memory.server_policies import (
    GC_CLEAN_THRESHOLD,
    GC_RUN_INTERVAL_S,
    gc_clean_threshold,
    keeps_rewritten_lengths,
    writes_per_chunk,
)
from tests.conftest import unique
from tests.helpers.stacks import memory_stack

pytestmark = pytest.mark.integration

CHAT = [
    "I think I need a new phone.",
    "What do you use it for most?",
    "I mostly take photos and I read on it.",
    "Do you have a budget in mind?",
    "I would say about 400 euros.",
    "Any brand you prefer?",
    "I had a Pixel before and I liked it.",
    "Battery life matters to you?",
    "Yes, I travel a lot and I hate charging.",
    "How about screen size?",
    "I like small phones, I have small hands.",
    "Noted. Any colour?",
    "I don't care about the colour.",
    "Shall I compare three models?",
    "Yes please, I want to decide this week.",
    "Do you need a case as well?",
    "I think I have one already.",
    "Should the camera be great in low light?",
    "I shoot a lot at night, so yes.",
    "Would you buy refurbished?",
    "I would, if the warranty is good.",
    "Any trade-in?",
    "I can give my old phone back.",
    "Great, I'll prepare the comparison.",
]


@pytest.fixture
async def stack(redis_url: str, embedder) -> AsyncIterator[tuple[aredis.Redis, Ingestor, Retriever]]:
    async with memory_stack(redis_url, embedder, unique(__name__)) as own:
        yield own.client, own.ingestor, own.retriever


async def test_a_word_in_every_turn_never_outranks_the_answer_once_rewrites_are_collected(stack) -> None:
    """24 turns, each published alone, so each earlier turn is rewritten twice (its context):
    "i" then counts in ~70 documents of 24. Until RediSearch's GC collects the old ones its IDF
    overflows (40 where it should be 0.02), and the BM25 leg's first five for "What budget did
    I give?" were the turns saying "I" most ("I mostly take photos and I read on it."). With the
    embedded Redis's GC settings, within seconds the first is a turn naming the budget or what
    to give; with RediSearch's defaults (GC after 100 rewrites) it never was."""
    client, ingestor, retriever = stack
    assert await gc_clean_threshold(client) == GC_CLEAN_THRESHOLD
    for n, text in enumerate(CHAT):
        event = TranscriptEvent(event_id=f"e{n}", agent_id="shopper", session_id="s1", turn=n, content=text)
        assert (await ingestor.apply([event.to_item(BASE_FILTER_KEYS)])).failed == []
    spec = SearchSpec(text="What budget did I give?", top_k=3, dense_weight=0.0, identifier_weight=0.0)
    deadline = time.monotonic() + 6 * GC_RUN_INTERVAL_S
    first = ""
    while time.monotonic() < deadline:
        first = (await retriever.search(spec)).hits[0].chunk.text
        if "give" in first or "budget" in first:
            return
        await asyncio.sleep(0.5)
    pytest.fail(f"the BM25 leg still puts {first!r} first")


async def test_the_lengths_bm25_divides_by_drift_with_rewrites_and_doctor_says_so(stack) -> None:
    """This RediSearch adds a rewritten chunk's length again to the total BM25 averages over:
    the probe finds so (and leaves no key or index behind), the index's writes per chunk count
    the rewrites, and doctor says both, as a note (it costs no recall: decision 0076)."""
    client, ingestor, retriever = stack
    name = retriever._index.cfg.name
    assert await keeps_rewritten_lengths(client, name) is True
    assert await client.keys(f"{name}:lengthprobe*") == []
    assert not [n for n in await client.execute_command("FT._LIST") if as_str(n).startswith(f"{name}:lengthprobe")]

    async def write(round_: int) -> None:
        events = [
            TranscriptEvent(event_id=f"e{round_}-{n}", agent_id="a", session_id="s1", turn=n, content=f"{t} ({round_})")
            for n, t in enumerate(CHAT[:6])
        ]
        assert (await ingestor.apply([e.to_item(BASE_FILTER_KEYS) for e in events])).failed == []

    await write(0)
    first = writes_per_chunk(await client.ft(name).info())
    assert first is not None and first < 2
    for round_ in range(1, 4):  # each turn's text changes: each is written again
        await write(round_)
    info = await client.ft(name).info()
    ratio = writes_per_chunk(info)
    assert ratio is not None and ratio >= first + 3
    [finding] = await check_lengths(client, name, info)
    assert finding.ok and f"{ratio:.1f} writes per chunk" in finding.detail, finding
    assert "counts each in the average length BM25 divides by" in finding.detail, finding
