"""The MCP tools' pure parts: time arguments, the next free turn, acks as a model sees them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from consumers.events import WriteAck
from consumers.requests import GetItem
from daemon.mcp_tools import ToolFailure, ack_view, next_free_turn, parse_time


def _items(*found: bool) -> list[GetItem]:
    return [GetItem(doc_id=f"t{i}", status="found" if f else "not_found") for i, f in enumerate(found)]


def test_the_next_free_turn_follows_the_last_one_found() -> None:
    assert next_free_turn(0, _items(False, False)) == 0
    assert next_free_turn(0, _items(True, True, False)) == 2
    assert next_free_turn(10, _items(True, False, True, False)) == 13  # a gap is not reused
    assert next_free_turn(0, _items(True, True)) is None  # all taken: look further


def test_times_are_iso_8601_or_an_invalid_request() -> None:
    assert parse_time("2026-01-31T12:00:00Z", "since") == datetime(2026, 1, 31, 12, tzinfo=UTC)
    assert parse_time(None, "since") is None
    with pytest.raises(ToolFailure) as info:
        parse_time("yesterday", "until")
    assert info.value.code == "invalid_request" and "until" in str(info.value)


def test_an_ack_shows_only_what_it_has() -> None:
    ack = WriteAck(event_id="e", status="indexed", doc_id="d", version=3, chunks=1)
    assert ack_view(ack, "d") == {"status": "indexed", "doc_id": "d", "version": 3, "chunks": 1}
