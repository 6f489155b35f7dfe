"""The recency lift against a real Redis and the real model: the newer of the relevant memories
first, never a sort of a small memory by time, never small talk lifted above what answers."""

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


# (day, session, role, said): a budget, its update, each followed in its session by small talk,
# then a later session of small talk alone (an adopter's trial: the update was never first)
TRIP = [
    (0, "a", "user", "Hi! I'm Ana and I live in Paris with my two cats."),
    (0, "a", "assistant", "Nice to meet you, Ana."),
    (0, "a", "user", "The budget for the Lisbon trip is 3000 euros."),
    (0, "a", "assistant", "Noted, 3000 euros for Lisbon."),
    (4, "b", "user", "The nightly build failed again."),
    (4, "b", "assistant", "I'll look at the logs."),
    (7, "c", "user", "Change of plans: the Lisbon trip budget is now 4500 euros."),
    (7, "c", "assistant", "Updated."),
    (7, "c", "user", "lol thanks"),
    (7, "c", "assistant", "Anything else?"),
    (9, "d", "user", "The nightly build failed again."),
    (9, "d", "assistant", "Checking."),
    (9, "d", "user", "cool"),
    (9, "d", "assistant", "Sounds good."),
]


@pytest.fixture(scope="module")
async def retriever(redis_url: str, embedder) -> AsyncIterator[Retriever]:
    turns = [
        TranscriptEvent(
            event_id=f"t{n}", agent_id="pa-ana", session_id=f"s{day // 7}", turn=n, role="user", content=text,
            timestamp=START + timedelta(days=day),
        ).to_item(BASE_FILTER_KEYS)
        for n, (day, text) in enumerate(SAID)
    ] + [
        TranscriptEvent(
            event_id=f"trip{n}", agent_id="trip", session_id=session, turn=n, role=role, content=text,
            timestamp=START + timedelta(days=day, minutes=n),
        ).to_item(BASE_FILTER_KEYS)
        for n, (day, session, role, text) in enumerate(TRIP)
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


@pytest.mark.parametrize("weight", [0.5, 1.0, 5.0, 50.0])
async def test_an_update_comes_before_the_small_talk_after_it(retriever: Retriever, weight: float) -> None:
    """Ten results of a 14-turn memory hold most of its small talk, newer than the update: the
    update comes first at every weight, and the results are those without the weight. As one
    more RRF list, recency put "Anything else?" first from a weight of 5."""
    question = "what is the budget for the Lisbon trip?"
    only = {"agent_id": "trip"}
    plain = await retriever.search(SearchSpec(text=question, top_k=10, metadata_filter=only))
    recent = await retriever.search(SearchSpec(text=question, top_k=10, recency_weight=weight, metadata_filter=only))
    texts = [h.chunk.text for h in recent.hits]
    assert "4500" in texts[0], texts
    assert {h.chunk.doc_id for h in recent.hits} == {h.chunk.doc_id for h in plain.hits}
