"""An event of the version already stored: a redelivery, or a conflict (pure)."""

from __future__ import annotations

from typing import Any

from memory.records import MemoryItem, StoredChunk
from memory.replays import differs_between, differs_from_stored


def item(content: str = "alpha beta", **kw: Any) -> MemoryItem:
    fields: dict[str, Any] = {"source": "kb", "metadata": {"team": "ops", "n": 2}} | kw
    return MemoryItem("upsert", "d", 4, content=content, **fields)


def chunk(text: str, start: int | None, version: int | None = 4, **kw: Any) -> StoredChunk:
    fields: dict[str, Any] = {"source": "kb", "metadata": {"team": "ops", "n": 2}} | kw
    return StoredChunk(f"d_p{start}", text, "d", kind="document", version=version, start=start, **fields)


def test_a_redelivery_is_no_conflict_and_each_difference_is_named() -> None:
    stored = [chunk("alpha", 0), chunk("beta", 6, gap=" ")]
    assert differs_from_stored(item(), stored) is None
    assert differs_from_stored(item("alpha gamma"), stored) == "content"
    assert differs_from_stored(item(source="wiki"), stored) == "source"
    assert differs_from_stored(item(metadata={"team": "ops", "n": 3}), stored) == "metadata"


def test_nothing_is_compared_where_the_stored_doc_cannot_say() -> None:
    # A chunk of another version (a write of this one not whole), or none at all.
    assert differs_from_stored(item("other"), [chunk("alpha", 0), chunk("beta", 6, version=3)]) is None
    assert differs_from_stored(item("other"), []) is None
    # Chunks without their starts read back only near the content: its source still counts.
    assert differs_from_stored(item("other"), [chunk("alpha", None)]) is None
    assert differs_from_stored(item("other", source="wiki"), [chunk("alpha", None)]) == "source"


def test_two_events_of_one_version_in_a_batch() -> None:
    assert differs_between(item(), item()) is None
    assert differs_between(item(), item("x")) == "content"
    assert differs_between(item(), MemoryItem("delete", "d", 4)) is None  # as when stored: not compared
    assert differs_between(item(), item(metadata={})) == "metadata"
