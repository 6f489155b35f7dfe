"""The recency list against a real Redis and the real model: newest first among the relevant
memories, never a sort of a small memory by time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from consumers.events import TranscriptEvent
from memory.filters import BASE_FILTER_KEYS
from memory.retrieval import Retriever
from memory.search_spec import SearchSpec
from tests.conftest import unique
from tests.helpers.stacks import memory_stack

pytestmark = pytest.mark.integration

START = datetime(2026, 10, 1, 9, tzinfo=UTC)
SMALL_TALK = [
    "Good morning!", "Thanks, that works.", "Ok, sounds good.", "Not sure yet.", "Sure, why not.",
    "I'll think about it.", "Talk to you later.", "Yes please.", "Haha, fair enough.", "Got it, thanks.",
]  # fmt: skip
# (day, said): a fact, its update two weeks on, a look-alike about someone else, then weeks of small talk
SAID = [
    (0, "Ana lives in Paris, in a small flat near the canal."),
    (5, "Ana's sister lives in Rome."),
    (14, "Ana lives in Berlin now: the move went well."),
    *[(20 + n // 2, SMALL_TALK[n % 10]) for n in range(40)],
]


@pytest.fixture(scope="module")
async def retriever(redis_url: str, embedder) -> AsyncIterator[Retriever]:
    turns = [
        TranscriptEvent(
            event_id=f"t{n}", agent_id="pa-ana", session_id=f"s{day // 7}", turn=n, role="user", content=text,
            timestamp=START + timedelta(days=day),
        ).to_item(BASE_FILTER_KEYS)
        for n, (day, text) in enumerate(SAID)
    ]  # fmt: skip
    async with memory_stack(redis_url, embedder, unique(__name__)) as stack:
        assert (await stack.ingestor.apply(turns)).failed == []
        yield stack.retriever


@pytest.mark.parametrize("weight", [5.0, 50.0])
async def test_recency_orders_the_results_and_never_brings_in_small_talk(retriever: Retriever, weight: float) -> None:
    """Each leg's floor of 30 candidates holds most of these 43 turns; ranked by time among
    them all, a heavy weight put the last small talk first. Among the results the fusion
    without it gives, the newer fact comes first, however heavy, and the results are the same."""
    question = "Where does Ana live?"
    plain = await retriever.search(SearchSpec(text=question, top_k=3))
    recent = await retriever.search(SearchSpec(text=question, top_k=3, recency_weight=weight))
    assert {h.chunk.doc_id for h in recent.hits} == {h.chunk.doc_id for h in plain.hits}
    assert "Berlin" in recent.hits[0].chunk.text, [h.chunk.text for h in recent.hits]
    assert "Berlin" not in plain.hits[0].chunk.text  # what the weight changed
