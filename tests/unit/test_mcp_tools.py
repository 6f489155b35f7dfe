"""The MCP tools' pure parts: time arguments, the next free turn, acks as a model sees them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from consumers.events import WriteAck
from consumers.requests import GetItem
from daemon import mcp_tools
from daemon.mcp_tools import MCPConfig, MemoryTools, ToolFailure, ack_view, next_free_turn, parse_time


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


async def test_a_long_lived_server_forgets_its_least_recently_used_idle_sessions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every session used to keep a lock and a next turn for the server's life."""
    monkeypatch.setattr(mcp_tools, "MAX_SESSIONS", 3)
    tools = MemoryTools(lambda: None, MCPConfig())  # type: ignore[arg-type,return-value]
    busy = tools._session_lock(("a", "busy"))
    await busy.acquire()  # a write in progress is never forgotten
    for n in range(5):
        tools._session_lock(("a", f"s{n}"))
        tools._next_turn[("a", f"s{n}")] = n
    assert list(tools._session_locks) == [("a", "busy"), ("a", "s3"), ("a", "s4")]
    assert set(tools._next_turn) == {("a", "s3"), ("a", "s4")}
    assert tools._session_lock(("a", "s3")) is tools._session_locks[("a", "s3")]  # used again: kept
    busy.release()
    tools._session_lock(("a", "s5"))
    assert list(tools._session_locks) == [("a", "s4"), ("a", "s3"), ("a", "s5")]
