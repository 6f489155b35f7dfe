"""The list of write markers a query reads with its winners (``keys.writing_key``).

Every marker ``SET`` lists its key in the same transaction (``sliced.set_marker``), so a
query that reads the list with its winners sees every marker standing without naming the
marker of each candidate's doc. The list is complete only once its sentinel member is in it:
``relist`` adds that after listing every stored marker, so a list that is lost (evicted,
deleted, a partial restore) reads as incomplete, and queries read the candidates' markers
instead until it is rebuilt.
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aredis
import structlog

from memory import keys
from memory.schema import as_str

log = structlog.get_logger()

#: More standing markers than this and a query reads its candidates' markers instead (and
#: the list is pruned): each listed one costs the winners' read a GET and a decode.
MAX_READ = 64

# KEYS[1]: the list; ARGV[1]: its sentinel. Drops what is no longer a marker (expired,
# deleted), atomically: a marker set meanwhile is listed again in its own transaction.
_PRUNE = """
local gone = {}
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if key ~= ARGV[1] and redis.call('TYPE', key).ok ~= 'string' then gone[#gone + 1] = key end
end
for i = 1, #gone, 1000 do redis.call('SREM', KEYS[1], unpack(gone, i, math.min(i + 999, #gone))) end
return #gone
"""

_TEND_EVERY_S = 5.0


class MarkerList:
    """The list of one index's write markers: its key, sentinel, rebuild and pruning."""

    def __init__(self, client: aredis.Redis, name: str) -> None:
        self._r = client
        self._name = name
        self.key = keys.writing_key(name)
        self.sentinel = keys.writing_sentinel(name)
        self._tending: asyncio.Task[None] | None = None
        self._tended_at = -_TEND_EVERY_S

    async def relist(self) -> None:
        """List every write marker stored (whoever set it), then mark the list complete."""
        found: list[str] = []
        async for raw in self._r.scan_iter(match=keys.marker_pattern(self._name), count=1000):
            key = as_str(raw)
            if keys.is_marker_key(self._name, key):  # the pattern's * also matches ':'
                found.append(key)
        for i in range(0, len(found), 1000):
            await self._r.sadd(self.key, *found[i : i + 1000])
        await self._r.sadd(self.key, self.sentinel)

    async def prune(self) -> int:
        """Drop the listed keys that are no longer markers; how many."""
        return int(await self._r.eval(_PRUNE, 1, self.key, self.sentinel))

    def tend(self, *, incomplete: bool) -> None:
        """In the background, at most every few seconds: rebuild the list where it was found
        incomplete, else prune it (a query found too many listed)."""
        now = time.monotonic()
        if (self._tending is not None and not self._tending.done()) or now - self._tended_at < _TEND_EVERY_S:
            return
        self._tended_at = now
        self._tending = asyncio.get_running_loop().create_task(self._tend(incomplete))

    async def _tend(self, incomplete: bool) -> None:
        try:
            if incomplete:
                await self.relist()
                log.warning("index.marker_list_rebuilt", index=self._name)
            else:
                await self.prune()
        except Exception as exc:  # the next query that needs it tries again
            log.warning("index.marker_list_failed", index=self._name, error=f"{type(exc).__name__}: {exc}")
