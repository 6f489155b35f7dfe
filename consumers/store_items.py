"""LangGraph items from the daemon's replies: a looked-up item, a search hit, an earlier value."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeVar

from langgraph.store.base import Item, SearchItem

from consumers.requests import GetItem
from consumers.store_mapping import is_item, item_parts

T = TypeVar("T", bound=Item)


def _built(cls: type[T], metadata: dict[str, Any] | None, timestamp: str | None, **extra: Any) -> T | None:
    """The ``cls`` item a store document's metadata and time carry; None for any other document."""
    if metadata is None or not is_item(metadata):
        return None
    namespace, key, value, created = item_parts(metadata)
    updated = datetime.fromisoformat(timestamp) if timestamp else created or datetime.now(UTC)
    return cls(namespace=namespace, key=key, value=value, created_at=created or updated, updated_at=updated, **extra)


def found_item(found: GetItem | None) -> Item | None:
    return None if found is None else _built(Item, found.metadata, found.timestamp)


class EarlierItem(Item):
    """A value an item held before its current one: put at ``updated_at``, held ``until`` a
    put of another value (None where the daemon did not say)."""

    __slots__ = ("until",)

    def __init__(self, *, until: datetime | None, **item: Any) -> None:
        super().__init__(**item)
        self.until = until

    def dict(self) -> dict[str, Any]:
        """The item's fields, and ``until`` (ISO 8601)."""
        return {**super().dict(), "until": self.until.isoformat() if self.until else None}


def earlier_item(metadata: dict[str, Any], timestamp: str | None, until: str | None) -> EarlierItem | None:
    return _built(EarlierItem, metadata, timestamp, until=datetime.fromisoformat(until) if until else None)


def search_item(found: GetItem | None) -> SearchItem | None:
    return None if found is None else _built(SearchItem, found.metadata, found.timestamp)


def search_item_of(metadata: dict[str, Any], timestamp: str | None, score: float) -> SearchItem | None:
    return _built(SearchItem, metadata, timestamp, score=score)
