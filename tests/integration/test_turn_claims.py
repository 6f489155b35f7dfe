"""Claimed turns through the real ingestor and Redis: a claim repeated in one batch (a retry
landing beside the call it repeats) is the first claim's, time and ack alike."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from consumers.events import TranscriptEvent
from memory.filters import BASE_FILTER_KEYS
from memory.records import MemoryItem
from tests.conftest import unique
from tests.helpers.stacks import Stack, memory_stack

pytestmark = pytest.mark.integration


@pytest.fixture
async def stack(redis_url: str, embedder: Any) -> AsyncIterator[Stack]:
    async with memory_stack(redis_url, embedder, unique(__name__)) as own:
        yield own


def claim(text: str, at: str, event_id: str) -> MemoryItem:
    body = {
        "event_id": event_id,
        "agent_id": "coder",
        "session_id": "s",
        "turn": 1,
        "role": "user",
        "content": text,
        "timestamp": at,
        "if_absent": True,
    }
    return TranscriptEvent.model_validate_json(json.dumps(body)).to_item(BASE_FILTER_KEYS, "default")


async def test_a_claim_and_its_retry_in_one_batch_keep_the_first_time(stack: Stack) -> None:
    """The call at 08:00 and its retry at 08:05 arrive in one batch: the turn is written once,
    with 08:00, and both are acked indexed; a different text claimed after them is refused."""
    first = claim("The build failed today.", "2026-12-01T08:00:00Z", "e1")
    retry = claim("The build failed today.", "2026-12-01T08:05:00Z", "e2")
    other = claim("The build failed today", "2026-12-01T08:06:00Z", "e3")
    report = await stack.ingestor.apply([first, retry, other])
    assert report.outcomes[id(first)].status == "indexed" and report.outcomes[id(retry)].status == "indexed"
    assert report.outcomes[id(other)].refused is not None
    [chunk] = (await stack.index.turns([first.doc_id]))[first.doc_id]
    assert chunk.text == "The build failed today." and chunk.timestamp == first.timestamp
