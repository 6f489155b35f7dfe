"""The generation registry's Redis I/O: which generation is active, the build slot, the hold.

``memory.generations`` has the model (specs, states); this module reads and changes the hash
``<name>:generations`` with scripts, so each change is atomic against every other process.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, Concatenate, ParamSpec, TypeVar

import redis.asyncio as aredis
import redis.exceptions as rexc

from memory.errors import ReindexConflict
from memory.generations import STALE_BUILD_S, GenerationState, IndexSpec
from memory.index.errors import translate_errors
from memory.keys import generation_of, physical_name, registry_key
from memory.schema import as_str

_P = ParamSpec("_P")
_T = TypeVar("_T")


def _translating(
    what: str,
) -> Callable[
    [Callable[Concatenate[GenerationRegistry, _P], Awaitable[_T]]],
    Callable[Concatenate[GenerationRegistry, _P], Awaitable[_T]],
]:
    """A registry method whose redis errors arrive translated (``memory.index.errors``)."""

    def wrap(
        fn: Callable[Concatenate[GenerationRegistry, _P], Awaitable[_T]],
    ) -> Callable[Concatenate[GenerationRegistry, _P], Awaitable[_T]]:
        @wraps(fn)
        async def call(self: GenerationRegistry, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
            async with translate_errors(f"{what} ({self.key})"):
                return await fn(self, *args, **kwargs)

        return call

    return wrap


# Create the first generation once, however many daemons start together. The alias first:
# a script is not rolled back on an error, and an alias that already exists (the registry
# lost to eviction, say) must fail the start rather than leave writes going to generation 1
# while searches go wherever the alias points.
_BOOTSTRAP = """
if redis.call('HEXISTS', KEYS[1], 'active') == 1 then return 0 end
redis.call('FT.ALIASADD', ARGV[2], ARGV[3])
redis.call('HSET', KEYS[1], 'active', 1, 'seq', 1, 'spec:1', ARGV[1])
return 1
"""

# Re-record a generation the alias still points at when the registry itself is gone.
# Only while the registry has no active generation (another daemon may have done it), and
# ``seq`` past every generation still in Redis, so that no later build reuses a number.
_ADOPT = """
if redis.call('HEXISTS', KEYS[1], 'active') == 1 then return 0 end
local seq = math.max(tonumber(ARGV[2]), tonumber(redis.call('HGET', KEYS[1], 'seq') or '0'))
redis.call('HSET', KEYS[1], 'active', ARGV[1], 'seq', seq, 'spec:' .. ARGV[1], ARGV[3])
redis.call('HSET', KEYS[1], 'adopted:' .. ARGV[1], ARGV[4])
return 1
"""

# Heartbeats are Redis's clock, not the hosts': a skewed host can neither take a live build
# over nor keep a dead one's slot.
_NOW = "local t = redis.call('TIME'); local now = tonumber(t[1]) + tonumber(t[2]) / 1e6\n"

# Unregister a generation about to be dropped by hand: never the active one, never one a live
# reindex is building (an abandoned build leaves the slot with it). -1 active, -2 building.
_UNREGISTER = (
    _NOW
    + """
local active = tonumber(redis.call('HGET', KEYS[1], 'active') or '0')
if active == 0 then return -3 end
if tonumber(ARGV[1]) == active then return -1 end
if redis.call('HGET', KEYS[1], 'building') == ARGV[1] then
  local hb = tonumber(redis.call('HGET', KEYS[1], 'building_heartbeat') or '0')
  if now - hb < tonumber(ARGV[2]) then return -2 end
  redis.call('HDEL', KEYS[1], 'building', 'building_owner', 'building_heartbeat')
end
redis.call('HDEL', KEYS[1], 'kept:' .. ARGV[1], 'adopted:' .. ARGV[1], 'spec:' .. ARGV[1])
return 1
"""
)

# Take the build slot unless a live reindex holds it (its heartbeat is recent). Also
# returns the generation an abandoned build left behind (0 if none), for the caller to drop.
_RESERVE = (
    _NOW
    + """
local b = redis.call('HGET', KEYS[1], 'building')
local abandoned = 0
if b and b ~= '' then
  local hb = tonumber(redis.call('HGET', KEYS[1], 'building_heartbeat') or '0')
  if now - hb < tonumber(ARGV[2]) then
    return {-1, redis.call('HGET', KEYS[1], 'building_owner') or '', b}
  end
  -- A build that died after its switch left the active generation: never to be dropped.
  if b ~= redis.call('HGET', KEYS[1], 'active') then abandoned = tonumber(b) end
end
redis.call('HDEL', KEYS[1], 'held')
local g = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HSET', KEYS[1], 'building', g, 'building_owner', ARGV[1], 'building_heartbeat', tostring(now))
return {g, ARGV[1], tostring(abandoned)}
"""
)

_HEARTBEAT = (
    _NOW
    + """
if redis.call('HGET', KEYS[1], 'building_owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'building_heartbeat', tostring(now))
return 1
"""
)

# The switch: active generation, its spec and the alias change in one step. The build slot
# stays taken until the reindex releases it: its catch-up, drop and graph re-pointing still
# run, and a second reindex reserving the slot meanwhile could drop what they work on. The
# old generation is marked kept in the same step, until the reindex has checked that the
# new one holds everything it does: a reindex that dies in between (Ctrl-C, a kill) leaves
# it marked, so nobody drops the only copy of the writes made during the switch.
_SWITCH = """
if redis.call('HGET', KEYS[1], 'building_owner') ~= ARGV[1] then return -1 end
if redis.call('HGET', KEYS[1], 'building') ~= ARGV[2] then return -1 end
local old = tonumber(redis.call('HGET', KEYS[1], 'active') or '0')
redis.call('HSET', KEYS[1], 'active', ARGV[2], 'spec:' .. ARGV[2], ARGV[3])
if old > 0 then redis.call('HSET', KEYS[1], 'kept:' .. old, ARGV[6]) end
redis.call('FT.ALIASUPDATE', ARGV[4], ARGV[5])
return old
"""

_RELEASE = """
if redis.call('HGET', KEYS[1], 'building_owner') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'building', 'building_owner', 'building_heartbeat', 'held')
return 1
"""

# Hold (ARGV[2] = the generation) or release (ARGV[2] = '') unversioned writes, only for the
# reindex that holds the build slot. The write of this field also fails every writer's
# transaction in flight: each watches the registry, and reads the hold when it retries.
_HOLD = """
if redis.call('HGET', KEYS[1], 'building_owner') ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('HDEL', KEYS[1], 'held') else redis.call('HSET', KEYS[1], 'held', ARGV[2]) end
return 1
"""


class GenerationRegistry:
    """Reads and changes the generation registry of one index name; its redis errors
    arrive translated."""

    def __init__(self, client: aredis.Redis, name: str) -> None:
        self._r = client
        self.name = name
        self.key = registry_key(name)

    async def _read(self, reader: Any = None) -> dict[str, str]:
        return {as_str(k): as_str(v) for k, v in (await (reader or self._r).hgetall(self.key)).items()}

    @_translating("generation registry read")
    async def state(self, reader: Any = None) -> GenerationState:
        """The registry as it is now, read through ``reader`` (e.g. a watching pipeline) or the client."""
        raw = await self._read(reader)
        active = int(raw.get("active", 0) or 0)
        spec_raw = raw.get(f"spec:{active}")
        return GenerationState(
            active=active,
            spec=IndexSpec.model_validate_json(spec_raw) if spec_raw else None,
            building=int(raw.get("building", 0) or 0),
            building_owner=raw.get("building_owner", ""),
            building_heartbeat=float(raw.get("building_heartbeat", 0) or 0),
            held=int(raw.get("held", 0) or 0),
        )

    @_translating("generation bootstrap")
    async def bootstrap(self, spec: IndexSpec) -> bool:
        """Make generation 1 active (its physical index must exist). True if this call did it."""
        done = await self._r.eval(
            _BOOTSTRAP, 1, self.key, spec.model_dump_json(), self.name, physical_name(self.name, 1)
        )
        return bool(done)

    @_translating("generation adoption")
    async def adopt(self, generation: int, seq: int, spec: IndexSpec, why: str) -> bool:
        """Record ``generation`` (behind the alias already) as active after the registry was lost.

        ``spec`` is the adopting process's: what the generation was built with is lost with
        the registry, and only its schema can be checked. True if this call did it.
        """
        done = await self._r.eval(
            _ADOPT, 1, self.key, str(generation), str(max(seq, generation)), spec.model_dump_json(), why
        )
        return bool(done)

    @_translating("generation unregistering")
    async def unregister(self, generation: int) -> None:
        """Take ``generation`` out of the registry before it is dropped by hand.

        Raises:
            ReindexConflict: it is the active generation, or a live reindex is building it.
        """
        res = int(await self._r.eval(_UNREGISTER, 1, self.key, str(generation), STALE_BUILD_S))
        if res == -1:
            raise ReindexConflict(f"generation {generation} is the active one: queries are served from it")
        if res == -2:
            raise ReindexConflict(f"generation {generation} is being built by a running reindex")
        if res == -3:
            raise ReindexConflict(
                "the generation registry has no active generation (lost?): start a daemon, which adopts the "
                "generation the alias points at, then drop the others"
            )

    @_translating("reindex reservation")
    async def reserve(self, owner: str) -> tuple[int, int]:
        """Take the build slot: the new generation's number, and the generation an abandoned
        build (one whose heartbeat stopped) left behind, 0 if none. The caller drops the
        abandoned one unless it is the active generation (a reindex that died after its switch).

        Raises:
            ReindexConflict: another reindex is running.
        """
        res = await self._r.eval(_RESERVE, 1, self.key, owner, STALE_BUILD_S)
        gen = int(res[0])
        if gen < 0:
            other = res[1].decode() if isinstance(res[1], bytes) else res[1]
            raise ReindexConflict(f"another reindex ({other}) is building generation {int(res[2])}")
        return gen, int(res[2])

    @_translating("reindex heartbeat")
    async def heartbeat(self, owner: str) -> None:
        """Keep the build slot; raises ReindexConflict if it was taken over."""
        if not await self._r.eval(_HEARTBEAT, 1, self.key, owner):
            raise ReindexConflict("the build slot was taken over by another reindex")

    @_translating("reindex switch")
    async def switch(self, owner: str, generation: int, spec: IndexSpec) -> int:
        """Atomically make ``generation`` active and point the alias at it; returns the old one."""
        old = await self._r.eval(
            _SWITCH,
            1,
            self.key,
            owner,
            str(generation),
            spec.model_dump_json(),
            self.name,
            physical_name(self.name, generation),
            f"the reindex that switched to generation {generation} had not checked that it holds "
            "everything this one does (it stopped before its final check, or is still running)",
        )
        if int(old) < 0:
            raise ReindexConflict(f"generation {generation} is no longer the build in progress")
        return int(old)

    @_translating("hold of unversioned writes")
    async def hold_unversioned(self, owner: str, generation: int) -> None:
        """Hold unversioned writes (transcript turns, unversioned docs) to ``generation``,
        the active one, while the reindex ``owner`` replays their last events into it.

        Versions make a replayed event that is older than what a live daemon wrote a no-op;
        without one, the replay would write it over the newer state (a forgotten turn back).
        Daemons wait the hold out (``WritesHeld``, retried, nothing committed).

        Raises:
            ReindexConflict: ``owner`` no longer holds the build slot.
        """
        if not await self._r.eval(_HOLD, 1, self.key, owner, str(generation)):
            raise ReindexConflict("the build slot was taken over by another reindex")

    @_translating("release of unversioned writes")
    async def release_unversioned(self, owner: str) -> None:
        """End ``owner``'s hold on unversioned writes (a no-op if it holds none)."""
        await self._r.eval(_HOLD, 1, self.key, owner, "")

    @_translating("generation note")
    async def mark_kept(self, generation: int, why: str) -> None:
        """Record why an old generation was kept (``doctor`` shows it and warns not to drop it)."""
        await self._r.hset(self.key, f"kept:{generation}", why)

    @_translating("generation note")
    async def unmark_kept(self, generation: int) -> None:
        """The reindex's check passed: the old generation holds nothing the active one lacks."""
        await self._r.hdel(self.key, f"kept:{generation}")

    @_translating("generation notes read")
    async def kept(self) -> dict[int, str]:
        """Generations kept for a reason (``mark_kept``) -> the reason."""
        return await self._notes("kept:")

    @_translating("generation notes read")
    async def adopted(self) -> dict[int, str]:
        """Generations adopted from the alias after the registry was lost (``adopt``) -> how."""
        return await self._notes("adopted:")

    async def _notes(self, prefix: str) -> dict[int, str]:
        return {int(k[len(prefix) :]): v for k, v in (await self._read()).items() if k.startswith(prefix)}

    @_translating("index listing")
    async def listed(self) -> set[int]:
        """The generations of this name that have a search index in Redis."""
        names = await self._r.execute_command("FT._LIST")  # type: ignore[no-untyped-call]
        return {g for n in names if (g := generation_of(self.name, as_str(n))) is not None}

    @_translating("alias read")
    async def alias_info(self) -> Any:
        """FT.INFO through the alias (describing the index it points at); None when there is
        neither an alias nor an index of this name."""
        try:
            return await self._r.ft(self.name).info()  # type: ignore[no-untyped-call]
        except rexc.ResponseError as exc:
            if "unknown index name" in str(exc).lower() or "no such index" in str(exc).lower():
                return None
            raise

    @_translating("build slot release")
    async def release(self, owner: str) -> None:
        """Give the build slot up (a build aborted, or a reindex finished)."""
        await self._r.eval(_RELEASE, 1, self.key, owner)
