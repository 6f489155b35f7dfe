"""The MCP tools' pure parts: time arguments, the next free turn, acks as a model sees them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from consumers import turn_numbers
from consumers.events import WriteAck
from consumers.requests import GetItem
from consumers.turn_numbers import TurnNumbers, next_free_turn
from daemon.mcp_server import unknown_arguments
from daemon.mcp_tools import MCPConfig, MemoryTools
from daemon.mcp_views import ToolFailure, ack_view, parse_time


def _items(*found: bool) -> list[GetItem]:
    return [GetItem(doc_id=f"t{i}", status="found" if f else "not_found") for i, f in enumerate(found)]


def test_the_next_free_turn_follows_the_last_one_found() -> None:
    assert next_free_turn(0, _items(False, False)) == 0
    assert next_free_turn(0, _items(True, True, False)) == 2
    assert next_free_turn(10, _items(True, False, True, False)) == 13  # a gap is not reused
    assert next_free_turn(0, _items(True, True)) is None  # all taken: look further
    # A gap (a forgotten turn) with the batch's last turn taken: the turns past it may be taken too.
    assert next_free_turn(0, _items(True, False, True)) is None


def test_times_are_iso_8601_or_an_invalid_request() -> None:
    assert parse_time("2026-01-31T12:00:00Z", "since") == datetime(2026, 1, 31, 12, tzinfo=UTC)
    assert parse_time(None, "since") is None
    with pytest.raises(ToolFailure) as info:
        parse_time("last tuesday", "until")
    assert info.value.code == "invalid_request" and "until" in str(info.value)


def test_an_ack_shows_only_what_it_has() -> None:
    ack = WriteAck(event_id="e", status="indexed", doc_id="d", version=3, chunks=1)
    assert ack_view(ack, "d") == {"status": "indexed", "doc_id": "d", "version": 3, "chunks": 1}


async def test_a_long_lived_writer_forgets_its_least_recently_used_idle_sessions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every session used to keep a lock and a next turn for the process's life."""
    monkeypatch.setattr(turn_numbers, "MAX_SESSIONS", 3)
    turns = TurnNumbers()
    busy = turns._known((None, "a", "busy"))
    busy.users = 1  # a write in progress (or waiting) is never forgotten
    for n in range(5):
        turns.used((None, "a", f"s{n}"), n)
    assert list(turns._sessions) == [(None, "a", "busy"), (None, "a", "s3"), (None, "a", "s4")]
    assert turns._known((None, "a", "s3")) is turns._sessions[(None, "a", "s3")]  # used again: kept
    assert turns._sessions[(None, "a", "s3")].next == 4
    busy.users = 0
    assert busy is turns._sessions[(None, "a", "busy")]
    turns.used((None, "a", "s5"), 0)
    assert list(turns._sessions) == [(None, "a", "s4"), (None, "a", "s3"), (None, "a", "s5")]
    turns.forgotten(None, "a", "s3")
    assert turns._sessions[(None, "a", "s3")].next == 0 and turns._sessions[(None, "a", "s4")].next == 5
    turns.used(("acme", "a", "s4"), 7)  # another tenant's session of the same name
    turns.forgotten(None, "a", None)
    assert {k: v.next for k, v in turns._sessions.items() if v.next} == {("acme", "a", "s4"): 8}


async def test_a_turn_numbered_during_a_probe_is_not_taken_again() -> None:
    """A numbered turn sent while another call probes (it is not stored yet) moves the probe's
    answer past it; a send counts before its ack, so a timed-out write is not overwritten."""
    turns = TurnNumbers()
    key = (None, "a", "s")
    probing = asyncio.Event()

    async def read(refs: Any) -> list[GetItem]:
        probing.set()
        await asyncio.sleep(0.01)
        return [GetItem(doc_id=f"t/{n}", status="not_found") for _a, _s, n in refs]

    free = asyncio.ensure_future(turns.free(read, key))
    await probing.wait()
    turns.used(key, 0)  # an explicit turn 0, sent meanwhile
    assert await free == 1


class _FakeClient:
    """Holds each write 0.2 s and counts the writers of one session at once; gates let the test
    order a write and a forget."""

    tenant = None

    def turn_key(self, agent_id: str, session_id: str) -> Any:
        return (None, agent_id, session_id)

    async def next_turn(self, agent_id: str, session_id: str, *, at_least: int = 0) -> int:
        async def read(refs: Any) -> Any:
            return (await self.get(turns=refs)).items

        return await self.turns.free(read, self.turn_key(agent_id, session_id), at_least)

    async def claim_next_turn(self, agent_id: str, session_id: str, claim: Any) -> Any:
        return await claim(await self.next_turn(agent_id, session_id))

    def __init__(self) -> None:
        self.turns = TurnNumbers()
        self.inside = 0
        self.max_inside = 0
        self.gates: dict[str, asyncio.Event] = {}
        self.store: dict[int, str] = {}

    async def start(self) -> None: ...
    async def close(self) -> None: ...

    async def publish_observation(self, *, turn: int, content: str, **_: Any) -> Any:
        self.inside += 1
        self.max_inside = max(self.max_inside, self.inside)
        await asyncio.sleep(0.2)
        self.store[turn] = content
        if content == "a":
            await self.gates["a"].wait()  # A's write awaits its ack, A still holding the session lock
        self.inside -= 1
        return SimpleNamespace(ack=None, doc_id=f"t/{turn}", turn=turn)

    async def get(self, *, turns: Any = (), **_: Any) -> Any:
        items = []
        for _agent, _session, n in turns:
            if n in self.store:
                found = GetItem(doc_id=f"t/{n}", status="found", content=self.store[n], metadata={"role": "assistant"})
                items.append(found)
            else:
                items.append(GetItem(doc_id=f"t/{n}", status="not_found"))
        return SimpleNamespace(items=items)

    async def forget(self, **_: Any) -> Any:
        await self.gates["forget"].wait()
        return SimpleNamespace(ack=None, doc_id="f")


async def test_a_forget_never_drops_a_lock_that_a_write_waits_for() -> None:
    """A forget dropped a session lock that read unlocked while handing over to
    its next waiter; a later write then took a second lock, and two wrote the session at once
    (one turn lost)."""
    fake = _FakeClient()
    fake.gates = {"a": asyncio.Event(), "forget": asyncio.Event()}
    tools = MemoryTools(lambda: fake, MCPConfig())  # type: ignore[arg-type,return-value]
    a = asyncio.ensure_future(tools.remember("a", agent_id="ag", session_id="s"))
    await asyncio.sleep(0.05)
    b = asyncio.ensure_future(tools.remember("b", agent_id="ag", session_id="s"))  # waits on A's lock
    f = asyncio.ensure_future(tools.forget("ag", "s"))
    await asyncio.sleep(0.4)  # A awaits its ack, holding the lock; B waits on it; F in c.forget
    fake.gates["a"].set()  # A wakes first and releases: B is woken, not yet running
    fake.gates["forget"].set()  # F runs before B: the lock reads unlocked, and is dropped
    await asyncio.sleep(0.05)
    c = asyncio.ensure_future(tools.remember("c", agent_id="ag", session_id="s"))
    await asyncio.gather(a, b, f, c)
    assert fake.max_inside == 1 and sorted(fake.store.values()) == ["a", "b", "c"], fake.store


def test_an_argument_a_tool_does_not_take_is_named_with_its_near_spelling_or_what_it_takes() -> None:
    known = ("query", "top_k", "filters")
    assert unknown_arguments({"query": "x", "top_k": 3}, known) is None
    assert unknown_arguments({"query": "x", "filter": {}}, known) == (
        "unknown argument 'filter': did you mean 'filters'?"
    )
    # a near spelling of an argument already given is no hint
    assert unknown_arguments({"query": "x", "querry": "y"}, known) == (
        "unknown argument 'querry': it takes query, top_k, filters"
    )
    assert unknown_arguments({"a": 1, "b": 2}, ()) == "unknown argument 'a' (and 1 more): it takes none"
    assert unknown_arguments({"anything": 1}, None) is None  # not one of ours: the SDK decides


async def test_a_remember_that_times_out_names_the_turn_it_sent() -> None:
    """The agent can then check that turn, or send it again at that number (stored once); a
    retry without a turn would take the next number and store the turn twice."""
    fake = _FakeClient()
    fake.gates = {"a": asyncio.Event()}  # never set: the write of "a" never hears back
    tools = MemoryTools(lambda: fake, MCPConfig(timeout_s=0.5))  # type: ignore[arg-type,return-value]
    with pytest.raises(ToolFailure) as info:
        await tools.remember("a", agent_id="ag", session_id="s")
    said = str(info.value)
    assert info.value.code == "timeout" and "turn 0 of session 's' may still be written" in said, said
    assert "call remember again with turn=0 and if_absent=true" in said, said


def test_a_document_chunks_section_reaches_every_caller() -> None:
    """A result's ``section`` is in the MCP tool's view and the LangChain document's metadata;
    where the chunk falls under no heading the view has none and the metadata None."""
    from consumers.langchain_retriever import to_document
    from daemon.mcp_views import result_view
    from tests.helpers.results import result_item

    under = result_item(section="Runbook > Failover")
    assert result_view(under)["section"] == "Runbook > Failover"
    assert to_document(under).metadata["section"] == "Runbook > Failover"
    assert "section" not in result_view(result_item())
    # A memory's own "section" key gives way, as every key of ours does: None where none.
    assert to_document(result_item(metadata={"section": "mine"})).metadata["section"] is None
