"""A document's chunks are read with the headings they fall under, through the real embedder,
Redis and retriever: a section's later chunk is found by its heading's words, its vector reads
them, renaming a heading re-embeds its section's chunks alone, and a source file's comments are
no headings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from memory.conversation import CONTEXT_MARK
from memory.records import MemoryItem
from memory.search_spec import SearchSpec
from tests.conftest import unique
from tests.helpers.counting import Counting
from tests.helpers.stacks import Stack, memory_stack

pytestmark = pytest.mark.integration

# Each paragraph is long enough to be a chunk of its own (default chunking: 64 tokens or more).
FILLER = "The operator checks the dashboards, reads the recent alerts and writes down what was seen. " * 4


def runbook(failover: str = "Failover") -> str:
    return (
        "# Runbook\n\n"
        f"## {failover}\n\n"
        f"Promote the standby first. {FILLER}\n\n"
        f"Then repoint the clients with the pgbouncer reload. {FILLER}\n\n"
        "## Backups\n\n"
        f"Nightly snapshots go to the cold bucket. {FILLER}\n"
    )


@pytest.fixture
async def stack(redis_url: str, embedder: Any) -> AsyncIterator[tuple[Stack, Counting]]:
    counting = Counting(embedder)
    async with memory_stack(redis_url, counting, unique(__name__)) as own:
        yield own, counting


def upsert(doc_id: str, version: int, content: str) -> MemoryItem:
    return MemoryItem("upsert", doc_id, version, content=content)


async def test_a_later_chunk_of_a_section_is_read_with_its_headings(stack: Any) -> None:
    """The second chunk of "Failover" never says "failover", yet BM25 finds it by that word
    with its own, and the model reads it after "Runbook > Failover"."""
    own, counting = stack
    await own.ingestor.apply([upsert("wiki/runbook.md", 1, runbook())])
    repoint = next(t for t in counting.sent if "repoint the clients" in t)
    assert repoint.startswith(f"Runbook > Failover{CONTEXT_MARK}Then repoint")
    # A chunk that opens with its heading is read under that heading's parents.
    assert f"Runbook{CONTEXT_MARK}## Backups" in " ".join(counting.sent)

    spec = SearchSpec(text="failover pgbouncer", top_k=3, dense_weight=0.0, identifier_weight=0.0)
    hits = (await own.retriever.search(spec)).hits
    assert hits[0].chunk.text.startswith("Then repoint the clients")
    # The result is the chunk's own text; its headings are matched, and named as its section.
    assert "Failover" not in hits[0].chunk.text and hits[0].chunk.section == "Runbook > Failover"


async def test_renaming_a_heading_reembeds_its_section_alone(stack: Any) -> None:
    """A heading's new title changes what its section's chunks are read with: the chunk that
    holds it and the one under it whose text is unchanged are embedded again, the other
    section's chunk keeps its vector."""
    own, counting = stack
    first = await own.ingestor.apply([upsert("wiki/runbook.md", 1, runbook())])
    assert first.chunks_embedded == 3
    counting.sent.clear()
    renamed = await own.ingestor.apply([upsert("wiki/runbook.md", 2, runbook(failover="Switchover"))])
    assert (renamed.chunks_embedded, renamed.chunks_reused) == (2, 1)
    heads = ("# Runbook\n\n## Switchover\n\nPromote", f"Runbook > Switchover{CONTEXT_MARK}Then repoint")
    assert sorted(next(h for h in heads if t.startswith(h)) for t in counting.sent) == sorted(heads)


async def test_a_source_files_comments_are_no_headings(stack: Any) -> None:
    """A shell script's ``# comment`` lines head nothing: its chunks are embedded as written."""
    own, counting = stack
    script = f"# Rotate the logs\n\necho {FILLER}\n\n# Then restart\n\necho {FILLER}\n"
    await own.ingestor.apply([upsert("ops/rotate.sh", 1, script)])
    assert counting.sent and not any(CONTEXT_MARK in t for t in counting.sent)
