"""Filters that exclude values (``{"not": ...}``) in every leg, in the winners' read, in
``get`` and in ``recent``, against a real Redis with RediSearch and the real model."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest

from consumers.events import TranscriptEvent
from memory.config import ChunkingConfig, IngestConfig
from memory.errors import InvalidRequest
from memory.filters import BASE_FILTER_KEYS
from memory.index import ChunkIndex
from memory.ingest import Ingestor
from memory.records import MemoryItem
from memory.retrieval import Retriever
from memory.search_spec import SearchSpec
from tests.conftest import unique
from tests.helpers.stacks import memory_stack

pytestmark = pytest.mark.integration

TEXT = "The gateway returned HTTP 504 while the postgres pool ERR_POOL_77 was exhausted."
# doc id -> the service it names (None: no service key at all)
SERVICES = {"d/billing": "billing", "d/auth": "auth", "d/spaced": "edge ", "d/none": None}
ONLY_LEG = {
    "dense": {"sparse_weight": 0.0, "identifier_weight": 0.0},
    "sparse": {"dense_weight": 0.0, "identifier_weight": 0.0},
    "identifier": {"dense_weight": 0.0, "sparse_weight": 0.0},
}


def _doc(doc_id: str, service: str | None, env: str = "production") -> MemoryItem:
    meta = {"environment": env} | ({"service": service} if service is not None else {})
    return MemoryItem(op="upsert", doc_id=doc_id, version=1, content=TEXT, source=doc_id, tags=meta, metadata=meta)


def _turn(session: str, n: int, text: str) -> MemoryItem:
    event = TranscriptEvent(event_id=f"{session}{n}", agent_id="ex-agent", session_id=session, turn=n, content=text)
    return event.to_item(BASE_FILTER_KEYS)


@pytest.fixture(scope="module")
async def stack(redis_url: str, embedder) -> AsyncIterator[tuple[ChunkIndex, Retriever]]:
    items = [_doc(d, s) for d, s in SERVICES.items()]
    items += [_turn("s-1", 1, "the walrus deploy failed on s-1"), _turn("s-1", 2, "walrus rollback on s-1")]
    items += [_turn("s-2", 1, "the walrus deploy worked on s-2"), _turn("s-3", 1, "walrus notes from s-3")]
    async with memory_stack(redis_url, embedder, unique(__name__)) as own:
        assert (await own.ingestor.apply(items)).failed == []
        yield own.index, own.retriever


async def _found(retriever: Retriever, text: str, flt: dict[str, object], **weights: float) -> set[str]:
    # The docs share one text on purpose: each stays its own result (no folding of repeats).
    spec = SearchSpec(text=text, top_k=10, metadata_filter=flt, fold_repeats=False, **weights)  # type: ignore[arg-type]
    return {h.chunk.doc_id for h in (await retriever.search(spec)).hits}


@pytest.mark.parametrize("leg", sorted(ONLY_LEG))
async def test_each_leg_leaves_out_the_excluded_values_and_keeps_chunks_without_the_key(stack, leg: str) -> None:
    """A pure exclusion is a valid engine query in each leg (the vector leg's pre-filter too);
    a value a TAG cannot match exactly (edge spaces) is excluded by its hash; a doc without
    the key passes."""
    _, retriever = stack
    docs = set(SERVICES)
    text = "HTTP 504 postgres pool ERR_POOL_77"
    assert await _found(retriever, text, {}, **ONLY_LEG[leg]) >= docs
    found = await _found(retriever, text, {"service": {"not": "billing"}}, **ONLY_LEG[leg])
    assert found & docs == docs - {"d/billing"}
    found = await _found(retriever, text, {"service": {"not": ["billing", "edge "]}}, **ONLY_LEG[leg])
    assert found & docs == {"d/auth", "d/none"}
    # "edge" is not "edge ": nothing of it is excluded
    found = await _found(retriever, text, {"service": {"not": "edge"}}, **ONLY_LEG[leg])
    assert found & docs == docs


async def test_the_exclusion_is_applied_inside_each_leg_not_after_it(stack) -> None:
    """Forty better matches of the excluded service do not crowd out the one worse match of
    another: each leg's candidates (30 at top_k 3) are fetched past the excluded ones."""
    index, retriever = stack
    ingestor = Ingestor(index=index, embedder=retriever._embedder, chunking=ChunkingConfig(), cfg=IngestConfig())
    crowd = [_doc(f"c/{i}", "crowd", "staging") for i in range(40)]
    crowd = [
        dataclasses.replace(c, content=f"kestrel outage KES_ERR_9 kestrel outage {i}") for i, c in enumerate(crowd)
    ]
    lone = dataclasses.replace(_doc("c/lone", "lone", "staging"), content="A note on KES_ERR_9 and a kestrel.")
    assert (await ingestor.apply([*crowd, lone])).failed == []
    not_crowd = {"service": {"not": "crowd"}}
    for leg, weights in ONLY_LEG.items():
        out = await retriever.search(
            SearchSpec(text="kestrel outage KES_ERR_9", top_k=3, metadata_filter=not_crowd, **weights)  # type: ignore[arg-type]
        )
        assert "c/lone" in {h.chunk.doc_id for h in out.hits}, leg


async def test_an_exclusion_and_inclusions_and_with_each_other(stack) -> None:
    """Keys AND: an inclusion on one key with an exclusion on another; the kind exclusion
    within a scope's kinds."""
    _, retriever = stack
    found = await _found(retriever, "HTTP 504 walrus", {"environment": "production", "service": {"not": "auth"}})
    assert found == {"d/billing", "d/spaced", "d/none"}
    found = await _found(retriever, "walrus deploy HTTP 504", {"kind": {"not": "document"}})
    assert found == {"transcript:ex-agent/s-1/1", "transcript:ex-agent/s-1/2", "transcript:ex-agent/s-2/1"} | {
        "transcript:ex-agent/s-3/1"
    }
    out = await retriever.search(
        SearchSpec(text="walrus deploy", top_k=5, metadata_filter={"kind": {"not": "document"}}, kinds=("document",))
    )
    assert out.hits == []  # the scope's one kind is the one excluded


async def test_other_sessions_only(stack) -> None:
    """The agent's use: memories of its earlier sessions, not of the one it is in."""
    _, retriever = stack
    found = await _found(retriever, "walrus deploy", {"session_id": {"not": "s-1"}, "kind": "transcript"})
    assert found == {"transcript:ex-agent/s-2/1", "transcript:ex-agent/s-3/1"}


async def test_get_and_recent_apply_the_exclusion(stack) -> None:
    """``get`` answers not_found for an excluded memory; ``recent`` passes over the excluded
    session's turns, and excluding the agent asked for reads nothing."""
    _, retriever = stack
    got = await retriever.lookups.lookup(
        ["d/billing", "d/auth", "d/none"], metadata_filter={"service": {"not": "billing"}}
    )
    assert [(g.doc_id, g.status) for g in got] == [("d/billing", "not_found"), ("d/auth", "found"), ("d/none", "found")]
    turns = await retriever.lookups.recent("ex-agent", metadata_filter={"session_id": {"not": ["s-1", "s-3"]}})
    assert [t.doc_id for t in turns] == ["transcript:ex-agent/s-2/1"]
    turns = await retriever.lookups.recent("ex-agent", metadata_filter={"agent_id": {"not": "ex-agent"}})
    assert turns == []
    turns = await retriever.lookups.recent("ex-agent", "s-1", metadata_filter={"session_id": {"not": "s-2"}})
    assert [t.doc_id for t in turns] == ["transcript:ex-agent/s-1/1", "transcript:ex-agent/s-1/2"]


@pytest.mark.parametrize(
    ("flt", "message"),
    [
        ({"service": {"is": "a"}}, "its one key is 'not'"),
        ({"service": {}}, "its one key is 'not'"),
        ({"service": {"not": []}}, "empty list"),
        ({"service": {"not": 3}}, "must be strings"),
        ({"tenant": {"not": "a"}}, "unknown metadata_filter key"),
        ({"kind": {"not": "turn"}}, "kinds: document, transcript, community"),
    ],
)
async def test_bad_exclusions_are_invalid_requests(stack, flt: dict[str, object], message: str) -> None:
    _, retriever = stack
    with pytest.raises(InvalidRequest, match=message):
        await retriever.search(SearchSpec(text="walrus", top_k=3, metadata_filter=flt))  # type: ignore[arg-type]
