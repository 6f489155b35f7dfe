"""A delete or a forget withdraws the summaries that may quote what it removed, even from a
summary being written meanwhile, and again when the withdrawal failed and the event comes back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from consumers.events import ForgetEvent, TranscriptEvent
from graph.ner import SpacyNer
from memory.config import IndexConfig
from memory.errors import BackendUnavailable
from memory.records import COMMUNITY_PREFIX, MemoryItem
from memory.search_spec import SearchSpec
from tests.conftest import unique
from tests.integration.test_graph import GatedEmbedder, Stack, make_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def ner() -> AsyncIterator[SpacyNer]:
    n = await SpacyNer.load("en_core_web_sm")
    yield n
    n.close()


SECRET = "Alice Johnson of Acme Corporation gave Bob Smith the vault code in Paris on Monday."
KEPT = "Alice Johnson met Bob Smith in Paris."
SPEC = SearchSpec(text="vault code Paris", top_k=10, kinds=("community",))


async def _two_sessions(s: Stack) -> tuple[list[MemoryItem], MemoryItem]:
    keys = IndexConfig().filter_keys
    turns = [
        TranscriptEvent(event_id=f"t{n}", agent_id="a1", session_id=f"s{n}", turn=0, content=text).to_item(keys)
        for n, text in enumerate([SECRET, KEPT])
    ]
    await s.ingestor.apply(turns)
    await s.graph.recompute(force=True)
    return turns, ForgetEvent(event_id="f", op="forget", agent_id="a1", session_id="s0").to_item(keys)


async def _quoted(s: Stack) -> bool:
    """Whether a summary (in the index or the store) still quotes the forgotten turn."""
    hits = (await s.search.search(SPEC, "communities"))[0].hits
    stored = [(await s.store.summaries.get(c.id)) or {} for c in await s.store.communities()]
    return any("vault code" in h.chunk.text for h in hits) or any("vault code" in r.get("text", "") for r in stored)


async def test_a_summary_being_written_from_the_forgotten_turn_is_refused(
    redis_url: str, embedder: Any, ner: SpacyNer
) -> None:
    """The first summary of a community has read the turn's passage and is embedding it when
    the forget is applied: its write, under an older token than the withdrawal's, is refused."""
    gate = GatedEmbedder(embedder)
    s = await make_stack(redis_url, gate, ner, unique("withdraw-inflight"))
    _, forget = await _two_sessions(s)
    (cid,) = [c.id for c in await s.store.communities()]
    gate.armed = True
    writing = asyncio.create_task(s.graph.summarize(cid))
    await asyncio.wait_for(gate.entered.wait(), 30)  # the passages are read, the summary not written

    assert not (await s.ingestor.apply([forget])).failed
    gate.release.set()
    assert await writing is None  # superseded by the withdrawal
    assert not await _quoted(s) and not await s.index.chunk_ids(COMMUNITY_PREFIX + cid)
    while await s.graph.work_once():
        pass
    assert (await s.store.summaries.get(cid) or {}).get("text") and not await _quoted(s)


@pytest.mark.parametrize("removal", ["forget", "delete"])
async def test_a_withdrawal_that_failed_is_done_when_the_removal_is_applied_again(
    redis_url: str, embedder: Any, ner: SpacyNer, monkeypatch: pytest.MonkeyPatch, removal: str
) -> None:
    """Redis fails as the summary is withdrawn. The removal is applied again (as after an
    outage, or as a redelivery after a crash) and finds the graph already changed (a
    versioned delete is then a replay): it still withdraws the summary before it is
    acknowledged."""
    s = await make_stack(redis_url, embedder, ner, unique(f"withdraw-retry-{removal}"))
    if removal == "delete":
        await s.put("vault.md", SECRET)
        await s.put("met.md", KEPT)
        await s.graph.recompute(force=True)
    else:
        _, forget = await _two_sessions(s)
    while await s.graph.work_once():
        pass
    assert await _quoted(s)
    real = s.graph._recomputer.delete_summary_chunk
    failures: list[str] = []

    async def once_unreachable(cid: str, token: int) -> bool:
        if not failures:
            failures.append(cid)
            raise BackendUnavailable("redis went away mid-withdrawal")
        return await real(cid, token)

    monkeypatch.setattr(s.graph._recomputer, "delete_summary_chunk", once_unreachable)
    if removal == "forget":
        assert not (await s.ingestor.apply([forget])).failed  # waited the outage out, applied again
    else:
        await s.delete("vault.md")  # applied again, its graph change is a replay
    assert failures and not await _quoted(s)
