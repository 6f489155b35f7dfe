"""Daemons say in Redis whether they can use the index; one that cannot does not join beside one that can.

A daemon started with settings the active index generation was not built with (another
chunking, model or schema; a forgotten config file) cannot write or answer: its writes wait and
its queries answer ``unavailable``. In the consumer groups it still took its share of the
partitions, so beside a healthy daemon it made that share of every query fail and of every
write wait, while doctor saw two members and no fault. Each running daemon now writes how it
stands to the index's daemons hash every :data:`EVERY_S`, stamped with Redis's clock; a daemon
that cannot use the index refuses to start while one of its consumer groups' daemons that can
is running (:func:`refuse_beside`), and doctor names every running daemon that cannot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, fields

import redis.asyncio as aredis
import structlog

from memory import keys
from memory.errors import IndexMismatch, MemdError
from memory.index import redis_now, translate_errors

log = structlog.get_logger()

#: How often a daemon says how it stands.
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
    group: str  # its consumer groups' id (``consumer.group_id``)
    usable: bool
    why: str | None  # why it cannot use the index
    at: float  # Redis's clock


#: What an entry is read by: a later release's own fields are left out.
_FIELDS = frozenset(f.name for f in fields(Standing))


def new_instance() -> str:
    """This process's name among the daemons."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


async def standings(client: aredis.Redis, name: str) -> list[Standing]:
    """The daemons heard from within :data:`FRESH_S` of Redis's clock; entries past
    :data:`FORGET_S` are removed. An entry this release cannot read is left alone (a later
    release's, during a rolling upgrade)."""
    async with translate_errors("daemons read"):
        now = await redis_now(client)
        raw = await client.hgetall(keys.daemons_key(name))
    fresh: list[Standing] = []
    gone: list[bytes | str] = []
    for field, value in raw.items():
        try:
            said = json.loads(value)
            standing = Standing(**{k: v for k, v in said.items() if k in _FIELDS})
        except (ValueError, TypeError):
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


async def refuse_beside(client: aredis.Redis, name: str, group: str, why: str | None) -> None:
    """Refuse to start a daemon that cannot use the index (``why``) while a daemon of the same
    consumer groups that can is running: it would take partitions it cannot serve.

    Raises:
        IndexMismatch: such a daemon runs.
    """
    if why is None:
        return
    usable = [s for s in await standings(client, name) if s.usable and s.group == group and _may_run(s)]
    if usable:
        beside = ", ".join(f"{s.host} pid {s.pid}" for s in usable[:3])
        raise IndexMismatch(
            f"{why}; daemons with the index's settings are running ({beside}): this one would take a share of "
            "their partitions and could serve none of it, so it does not start. Start it with their settings "
            "(the same AGENTMEM_CONFIG_FILE and AGENTMEM_ variables), or, to move every daemon to these, "
            "run `agentmemd reindex` with them first (docs/reindex.md)"
        )


def _may_run(standing: Standing) -> bool:
    """Whether the daemon of ``standing`` may still run: on this host, only if its process
    does (a daemon killed here a moment ago, then started with other settings, is no other)."""
    if standing.host != socket.gethostname():
        return True
    try:
        os.kill(standing.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        pass
    return True


class Presence:
    """This daemon's standing, written every :data:`EVERY_S` until it stops."""

    def __init__(
        self,
        *,
        client: aredis.Redis,
        name: str,
        group: str,
        mismatch: Callable[[], Awaitable[str | None]],
        instance: str | None = None,
    ) -> None:
        self._r, self._name, self._group, self._mismatch = client, name, group, mismatch
        self.instance = instance or new_instance()

    async def run(self, halt: asyncio.Event) -> None:
        """Say how this daemon stands until ``halt``; then withdraw its entry."""
        try:
            while not halt.is_set():
                try:
                    await self.say()
                except MemdError as exc:  # Redis blinked: said again next time
                    log.warning("daemon.presence_failed", error=str(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(halt.wait(), timeout=EVERY_S)
        finally:
            await self.withdraw()

    async def say(self) -> None:
        """Write this daemon's standing now."""
        why = await self._mismatch()
        async with translate_errors("daemons write"):
            me = Standing(
                instance=self.instance,
                host=socket.gethostname(),
                pid=os.getpid(),
                group=self._group,
                usable=why is None,
                why=why,
                at=await redis_now(self._r),
            )
            await self._r.hset(keys.daemons_key(self._name), self.instance, json.dumps(asdict(me)))

    async def withdraw(self) -> None:
        """Remove this daemon's entry (it stops)."""
        with contextlib.suppress(MemdError, OSError):
            async with translate_errors("daemons withdraw"):
                await self._r.hdel(keys.daemons_key(self._name), self.instance)
