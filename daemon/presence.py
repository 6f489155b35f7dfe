"""Daemons say in Redis whether they can use the index; one that cannot stands aside for one that can.

A daemon started with settings the active index generation was not built with (another
chunking, model or schema; a forgotten config file) cannot write or answer: its writes wait and
its queries answer ``unavailable``. In the consumer groups it still held its share of the
partitions, so beside a healthy daemon it made that share of every query fail and of every
write wait, while doctor saw two members and no fault. Now each daemon writes its state to the
index's daemons hash every :data:`EVERY_S`; one that cannot use the index leaves its groups
(its subscribers stop) while a daemon that can is alive, and joins again once it can use the
index, or once none that can is left (then it answers ``unavailable`` with the reason, rather
than leaving askers to time out). Doctor reads the same hash.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import redis.asyncio as aredis
import structlog

from memory import keys
from memory.errors import MemdError
from memory.index import translate_errors

log = structlog.get_logger()

#: How often a daemon says how it stands (and looks at the others).
EVERY_S = 5.0
#: A daemon not heard from for this long is taken to be gone.
FRESH_S = 3 * EVERY_S
#: An entry this old is removed by whoever reads it (a daemon killed without a word).
FORGET_S = 3600.0


@dataclass(frozen=True, slots=True)
class Standing:
    """One daemon's word on itself."""

    instance: str
    host: str
    pid: int
    usable: bool
    why: str | None  # why it cannot use the index
    aside: bool  # it left its consumer groups
    at: float


def new_instance() -> str:
    """This process's name among the daemons."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def next_move(*, usable: bool, aside: bool, others_usable: bool) -> str | None:
    """``"leave"``, ``"join"`` or nothing (pure): a daemon that cannot use the index leaves
    while another that can is alive; one aside joins once it can, or once none can."""
    if not usable and others_usable and not aside:
        return "leave"
    if aside and (usable or not others_usable):
        return "join"
    return None


async def standings(client: aredis.Redis, name: str, now: float) -> list[Standing]:
    """The daemons heard from within :data:`FRESH_S`; entries past :data:`FORGET_S` are removed."""
    async with translate_errors("daemons read"):
        raw = await client.hgetall(keys.daemons_key(name))
    fresh: list[Standing] = []
    gone: list[bytes | str] = []
    for field, value in raw.items():
        try:
            standing = Standing(**json.loads(value))
        except (ValueError, TypeError):
            gone.append(field)
            continue
        if now - standing.at > FORGET_S:
            gone.append(field)
        elif now - standing.at <= FRESH_S:
            fresh.append(standing)
    if gone:
        with contextlib.suppress(MemdError):
            async with translate_errors("daemons prune"):
                await client.hdel(keys.daemons_key(name), *gone)
    return fresh


class Presence:
    """This daemon's standing, written every :data:`EVERY_S`, and its subscribers stopped or
    started again as :func:`next_move` says."""

    def __init__(
        self,
        *,
        client: aredis.Redis,
        name: str,
        mismatch: Callable[[], Awaitable[str | None]],
        subscribers: Sequence[Any],
        instance: str | None = None,
    ) -> None:
        self._r, self._name, self._mismatch = client, name, mismatch
        self._subscribers = subscribers
        self.instance = instance or new_instance()
        self.aside = False

    async def run(self, halt: asyncio.Event) -> None:
        """Say how this daemon stands, and move, until ``halt``; then withdraw its entry."""
        try:
            while not halt.is_set():
                try:
                    await self.step(time.time())
                except MemdError as exc:  # Redis blinked: said again next time
                    log.warning("daemon.presence_failed", error=str(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(halt.wait(), timeout=EVERY_S)
        finally:
            with contextlib.suppress(MemdError, OSError):
                async with translate_errors("daemons withdraw"):
                    await self._r.hdel(keys.daemons_key(self._name), self.instance)

    async def step(self, now: float) -> None:
        """One look: write this daemon's standing, read the others', leave or join."""
        why = await self._mismatch()
        others = [s for s in await standings(self._r, self._name, now) if s.instance != self.instance]
        move = next_move(usable=why is None, aside=self.aside, others_usable=any(s.usable for s in others))
        if move == "leave":
            for sub in self._subscribers:
                await sub.stop()
            self.aside = True
            said = f"agentmemd stands aside: it cannot use the index ({why}), and a daemon that can is running"
            log.warning("daemon.stood_aside", why=why, others=[s.instance for s in others if s.usable])
            print(said, file=sys.stdout, flush=True)
        elif move == "join":
            for sub in self._subscribers:
                await sub.start()
            self.aside = False
            log.info("daemon.rejoined", usable=why is None)
        me = Standing(
            instance=self.instance,
            host=socket.gethostname(),
            pid=os.getpid(),
            usable=why is None,
            why=why,
            aside=self.aside,
            at=now,
        )
        async with translate_errors("daemons write"):
            await self._r.hset(keys.daemons_key(self._name), self.instance, json.dumps(asdict(me)))
