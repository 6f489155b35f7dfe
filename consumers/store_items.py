"""LangGraph items from the daemon's replies: a looked-up item, a search hit, an earlier value."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from langgraph.store.base import Item, SearchItem

from consumers.requests import GetItem
from consumers.store_mapping import is_item, item_parts


def _parts(item: GetItem | None) -> tuple[tuple[str, ...], str, dict[str, Any], datetime, datetime] | None:
    if item is None or not is_item(item.metadata):
        return None
    assert item.metadata is not None
    return _from_metadata(item.metadata, item.timestamp)


def _from_metadata(
    metadata: dict[str, Any], timestamp: str | None
) -> tuple[tuple[str, ...], str, dict[str, Any], datetime, datetime]:
    namespace, key, value, created = item_parts(metadata)
    updated = datetime.fromisoformat(timestamp) if timestamp else created or datetime.now(UTC)
    return namespace, key, value, created or updated, updated


def found_item(found: GetItem | None) -> Item | None:
    parts = _parts(found)
    if parts is None:
        return None
    ns, key, value, created, updated = parts
    return Item(namespace=ns, key=key, value=value, created_at=created, updated_at=updated)


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
    if not is_item(metadata):
        return None
    ns, key, value, created, updated = _from_metadata(metadata, timestamp)
    held = datetime.fromisoformat(until) if until else None
    return EarlierItem(namespace=ns, key=key, value=value, created_at=created, updated_at=updated, until=held)


def search_item(found: GetItem | None) -> SearchItem | None:
    parts = _parts(found)
    if parts is None:
        return None
    ns, key, value, created, updated = parts
    return SearchItem(namespace=ns, key=key, value=value, created_at=created, updated_at=updated)


def search_item_of(metadata: dict[str, Any], timestamp: str | None, score: float) -> SearchItem | None:
    if not is_item(metadata):
        return None
    ns, key, value, created, updated = _from_metadata(metadata, timestamp)
    return SearchItem(namespace=ns, key=key, value=value, created_at=created, updated_at=updated, score=score)
