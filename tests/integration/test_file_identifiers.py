"""Files, commits and names as identifiers, against a real Redis with RediSearch and the real
model: a coding agent asks for a file by its path or name, for a commit by its short hash, and
for a setting by the words of its name."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from consumers.events import TranscriptEvent
from memory.errors import InvalidRequest
from memory.filters import BASE_FILTER_KEYS
from memory.records import MemoryItem
from memory.retrieval import Retriever
from memory.search_spec import SearchSpec
from tests.conftest import unique
from tests.helpers.stacks import memory_stack

pytestmark = pytest.mark.integration

DOCS = {
    # its text never writes its own path
    "src/server/http.py": "def parse_request(body):\n    # routes are matched here, then the handler runs\n",
    "src/server/routes.py": "def match_route(path):\n    # the request's path is matched against each route\n",
    "runbooks/db.md": "To raise the pool size, edit config/db.toml and restart the workers.",
    # names as code writes them, never their words apart
    "src/auth/tokens.py": "token = jwt.encode(claims, INTERNAL_SIGNING_KEY)  # read from vault at start",
    "src/client/fetch.py": "async def fetchWithBackoff(url, maxRetries=5):\n    ...",
}
TURN = "I reverted a3f9c2e and changed config/worker.toml; the pool size stays as it is."


def _doc(doc_id: str, text: str) -> MemoryItem:
    return MemoryItem(op="upsert", doc_id=doc_id, version=1, content=text, source=doc_id, tags={}, metadata={})


@pytest.fixture(scope="module")
async def retriever(redis_url: str, embedder) -> AsyncIterator[Retriever]:
    turn = TranscriptEvent(event_id="t", agent_id="coder", session_id="s-1", turn=1, content=TURN)
    async with memory_stack(redis_url, embedder, unique(__name__)) as stack:
        items = [*(_doc(d, t) for d, t in DOCS.items()), turn.to_item(BASE_FILTER_KEYS)]
        assert (await stack.ingestor.apply(items)).failed == []
        yield stack.retriever


@pytest.mark.parametrize(
    ("question", "first"),
    [
        ("src/server/http.py", "src/server/http.py"),  # the doc's own path, never in its text
        ("what does http.py do?", "src/server/http.py"),  # its file name alone
        ("how do I change config/db.toml", "runbooks/db.md"),  # not the turn naming config/worker.toml
        ("which commit did we revert, a3f9c2e?", "transcript:coder/s-1/1"),
    ],
)
async def test_a_file_or_commit_named_in_a_question_comes_first(
    retriever: Retriever, question: str, first: str
) -> None:
    out = await retriever.search(SearchSpec(text=question, top_k=3))
    assert out.hits[0].chunk.doc_id == first, [h.chunk.doc_id for h in out.hits]
    assert out.hits[0].ranks.get("identifier") == 1


@pytest.mark.parametrize(
    ("question", "first"),
    [
        ("where is the internal signing key used?", "src/auth/tokens.py"),
        ("how many max retries does fetch with backoff make?", "src/client/fetch.py"),
        ("INTERNAL_SIGNING_KEY", "src/auth/tokens.py"),
    ],
)
async def test_a_name_is_found_by_its_words_in_the_bm25_leg(retriever: Retriever, question: str, first: str) -> None:
    """The BM25 leg alone finds ``INTERNAL_SIGNING_KEY`` and ``maxRetries`` by their words (and
    by their own spelling), in Redis's own scoring."""
    out = await retriever.search(
        SearchSpec(text=question, top_k=3, dense_weight=0.0, sparse_weight=1.0, identifier_weight=0.0)
    )
    assert out.hits and out.hits[0].chunk.doc_id == first, [h.chunk.doc_id for h in out.hits]


async def test_the_identifier_leg_alone_is_an_exact_lookup(retriever: Retriever) -> None:
    """With the text legs off, a question naming an identifier finds exactly what holds it; one
    naming none is refused, since nothing could be found."""
    alone = {"dense_weight": 0.0, "sparse_weight": 0.0, "identifier_weight": 1.0}
    out = await retriever.search(SearchSpec(text="config/db.toml", top_k=5, **alone))
    assert [h.chunk.doc_id for h in out.hits] == ["runbooks/db.md"]
    with pytest.raises(InvalidRequest, match="names an identifier"):
        await retriever.search(SearchSpec(text="the pool size", top_k=5, **alone))
