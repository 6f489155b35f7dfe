"""A session's next free turn, for writers that do not number their turns themselves.

``MemoryClient.publish_observation`` without ``turn`` (and so ``agentmemd publish
observation`` without ``--turn``) and the MCP server's ``remember`` take the turn after the
session's last stored one: this process's high-water mark for the session, then ``get``
probes from there. Writes to one session are serialised within the process; another process
writing the same session at the same moment may take the same number: each sends its turn as
a claim, the daemon writes the first and refuses the other, which takes the next number
(``memory.turn_claims``; docs/mcp.md, "Turn numbers").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from consumers.requests import GetItem

#: Turns probed per ``get`` (the contract's cap on one get's ids).
PROBE_BATCH = 100
#: Sessions a process remembers: beyond this many, the least recently used idle ones are
#: forgotten (their next turn is then looked up again).
MAX_SESSIONS = 10_000

#: A session, as (tenant, agent_id, session_id); the tenant as the client names it (None: its own).
Session = tuple[str | None, str, str]
#: Reads turns ``(agent_id, session_id, turn)`` by id, in the order asked (``MemoryClient.get``).
ReadTurns = Callable[[list[tuple[str, str, int]]], Awaitable[Sequence[GetItem]]]


def next_free_turn(start: int, items: Sequence[GetItem]) -> int | None:
    """The turn after the last one found among ``items`` (turns ``start``, ``start+1``, ...),
    or None when the last of them was found (look further: a turn past them may be taken
    too, and a gap, such as a forgotten turn, is no end of the session)."""
    if not items or items[-1].status != "not_found":
        return None
    found = [start + i for i, item in enumerate(items) if item.status != "not_found"]
    return (found[-1] + 1) if found else start


@dataclass
class _Known:
    next: int = 0  # the next turn this process would use (0: not known, probe from the start)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # calls holding or waiting for the lock: never forgotten under them


class TurnNumbers:
    """Per session: the next turn this process will use, and a lock serialising its writes."""

    def __init__(self) -> None:
        self._sessions: dict[Session, _Known] = {}  # least recently used first

    def _known(self, key: Session) -> _Known:
        """The session's entry, now its most recently used; idle ones beyond ``MAX_SESSIONS``
        are forgotten (a long-lived process sees sessions without end)."""
        known = self._sessions.pop(key, None) or _Known()
        self._sessions[key] = known
        excess = len(self._sessions) - MAX_SESSIONS
        if excess > 0:
            for old in list(self._sessions):
                if excess <= 0:
                    break
                if old != key and not self._sessions[old].users:
                    del self._sessions[old]
                    excess -= 1
        return known

    @contextlib.asynccontextmanager
    async def writing(self, key: Session) -> AsyncIterator[None]:
        """Hold the session's write lock (counted in use while waiting for it, so it is never
        forgotten and replaced under a waiter: two writers would then number alike)."""
        known = self._known(key)
        known.users += 1
        try:
            async with known.lock:
                yield
        finally:
            known.users -= 1

    def used(self, key: Session, turn: int) -> None:
        """``turn`` of the session is about to be sent: the next free one is after it (a send
        that fails leaves a gap, which is no end of the session; a number taken again would
        overwrite the turn that holds it)."""
        known = self._known(key)
        known.next = max(known.next, turn + 1)

    def forgotten(self, tenant: str | None, agent_id: str, session_id: str | None) -> None:
        """A forget of the agent's session (every session when None): probe again from the start."""
        for key, known in self._sessions.items():
            if key[:2] == (tenant, agent_id) and session_id in (None, key[2]):
                known.next = 0

    async def free(self, read: ReadTurns, key: Session, at_least: int = 0) -> int:
        """The first turn after the session's last stored one, from this process's high-water
        mark (or ``at_least``) on."""
        start = max(self._known(key).next, at_least)
        while True:
            items = await read([(key[1], key[2], n) for n in range(start, start + PROBE_BATCH)])
            found = next_free_turn(start, items)
            if found is not None:
                # A numbered turn of this process sent during the probe (not stored yet) counts.
                known = self._known(key)
                known.next = max(found, known.next)
                return known.next
            start += PROBE_BATCH
