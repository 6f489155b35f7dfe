"""The tenants a daemon has seen, shared by every daemon of an index in one Redis set
(``memory.keys.tenants_key``): what the graph's loops walk, and whose topics the daemon
recreates when the broker lost them. An erased tenant (``memory.keys.erased_key``) is in
neither, and is not recorded again until its topics are created anew (``restore``)."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import redis.asyncio as aredis

from memory.index import translate_errors
from memory.keys import erased_key, tenants_key
from memory.schema import as_str

# Record a tenant unless it is erased (KEYS: the tenants set, the erased hash; ARGV: tenant).
_SAW = """
local v = redis.call('HGET', KEYS[2], ARGV[1])
if v and not cjson.decode(v).restored then return 0 end
redis.call('SADD', KEYS[1], ARGV[1])
return 1
"""

# Mark a tenant erased at Redis's own time and take it off the list (KEYS as _SAW): returns the time.
_ERASE = """
local t = redis.call('TIME')
local at = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode({at = at, restored = false}))
redis.call('SREM', KEYS[1], ARGV[1])
return tostring(at)
"""

# Lift an erasure, keeping when it was and noting when it was lifted, at Redis's own time
# (KEYS[1]: the erased hash; ARGV: tenant): the erasure's time, or nil when the tenant is not
# erased now.
_RESTORE = """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return nil end
local d = cjson.decode(v)
if d.restored then return nil end
local t = redis.call('TIME')
d.restored = true
d.restored_at = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(d))
return tostring(d.at)
"""


@dataclass(frozen=True, slots=True)
class Erasure:
    """A tenant's erasure: when, and whether (and when) its topics were created again since (it
    started anew; its events from before then are still never applied, nor replayed)."""

    at: float
    restored: bool
    # When the erasure was lifted (None: still erased, or lifted by an older release, which kept
    # no time). Events written between the two were acked as refused: they stay refused.
    restored_at: float | None = None

    @classmethod
    def from_json(cls, raw: bytes | str) -> Erasure:
        """One erasure as the erased hash keeps it (the scripts above write it)."""
        d = json.loads(raw)
        lifted = d.get("restored_at")
        return cls(
            at=float(d["at"]), restored=bool(d["restored"]), restored_at=None if lifted is None else float(lifted)
        )

    def refuses(self, record_ms: int | None) -> bool:
        """Whether an event of the tenant, written to Kafka at ``record_ms`` (its record's
        time; ``None``: unknown), is to be left unapplied: one from before the erasure, or
        from before it was lifted (its writer was told it was refused; a reindex or a daemon
        behind must not apply it later)."""
        if not self.restored or record_ms is None:
            return True
        return record_ms <= (self.restored_at or self.at) * 1000


def refused(erased: Mapping[str, Erasure], tenant: str | None, record_ms: int | None) -> bool:
    """Whether an erasure in ``erased`` leaves unapplied an event of ``tenant`` written to Kafka
    at ``record_ms`` (``None``: unknown); an event of no tenant, or of one never erased, is not."""
    erasure = erased.get(tenant) if tenant is not None else None
    return erasure is not None and erasure.refuses(record_ms)


#: The erased tenants as a daemon last read them (``TenantRegistry.erased``).
ErasedTenants = Callable[[], Awaitable[Mapping[str, Erasure]]]


async def none_erased() -> Mapping[str, Erasure]:
    """No tenant is erased (single tenancy, and tests that build a pipeline alone)."""
    return {}


def erased_now(erased: Mapping[str, Erasure], tenant: str | None) -> Erasure | None:
    """``tenant``'s erasure while it stands (not lifted since), else None."""
    erasure = erased.get(tenant) if tenant is not None else None
    return erasure if erasure is not None and not erasure.restored else None


#: How long a daemon trusts its last read of the erased tenants: an erase waits longer than
#: this before it deletes, so that no batch read after the erase writes the tenant's data.
ERASED_READ_TTL_S = 1.0


class TenantRegistry:
    """The tenants of one index name; each is written to Redis once per process."""

    def __init__(self, *, client: aredis.Redis, name: str) -> None:
        self._r = client
        self._key = tenants_key(name)
        self._erased_key = erased_key(name)
        self._known: set[str] = set()
        self._saw = client.register_script(_SAW)
        self._erase = client.register_script(_ERASE)
        self._restore = client.register_script(_RESTORE)
        self._erased: dict[str, Erasure] = {}
        self._erased_read_at = float("-inf")

    async def saw(self, tenant: str) -> None:
        """Record ``tenant`` (a set lookup once it is known to this process), unless it is erased.

        Raises:
            BackendUnavailable: Redis is unreachable.
        """
        if tenant not in self._known:
            async with translate_errors("tenant list"):
                recorded = await self._saw(keys=[self._key, self._erased_key], args=[tenant])
            if int(recorded):
                self._known.add(tenant)

    async def all(self) -> list[str]:
        """Every tenant any daemon of the index has seen and nobody erased since, sorted.

        Raises:
            BackendUnavailable: Redis is unreachable.
        """
        async with translate_errors("tenant list"):
            found = {as_str(m) for m in await self._r.smembers(self._key)}
            raw = await self._r.hgetall(self._erased_key)
        gone = {t for t, e in _erasures(raw).items() if not e.restored}
        self._known -= gone
        return sorted((found | self._known) - gone)

    async def with_topics(self) -> list[str]:
        """The tenants whose topics topic tenancy keeps: every one recorded. ``default`` is on
        record only where single tenancy wrote: a deployment that moved to topic tenancy reads
        that memory through ``memory.*.default``, which a broker that forgets its topics at a
        restart (tansu) would otherwise leave unreachable.

        Raises:
            BackendUnavailable: Redis is unreachable.
        """
        return await self.all()

    async def erased(self) -> dict[str, Erasure]:
        """Each tenant ever erased, with when and whether it started anew since; read again at
        most every ``ERASED_READ_TTL_S`` (one read per batch would cost every batch a round
        trip).

        Raises:
            BackendUnavailable: Redis is unreachable.
        """
        now = time.monotonic()
        if now - self._erased_read_at >= ERASED_READ_TTL_S:
            async with translate_errors("tenant list"):
                raw = await self._r.hgetall(self._erased_key)
            self._erased = _erasures(raw)
            self._erased_read_at = now
        return self._erased

    async def erase(self, tenant: str) -> float:
        """Mark ``tenant`` erased and take it off the list; returns when (Redis's clock).

        Raises:
            BackendUnavailable: Redis is unreachable.
        """
        async with translate_errors("tenant erase"):
            at = await self._erase(keys=[self._key, self._erased_key], args=[tenant])
        self._known.discard(tenant)
        return float(as_str(at))

    async def restore(self, tenant: str) -> float | None:
        """Lift ``tenant``'s erasure (its topics are being created again, for a new start);
        returns when it had been erased, ``None`` if it is not erased now. When stays recorded:
        its events from before are still never applied, nor replayed by a reindex.

        Raises:
            BackendUnavailable: Redis is unreachable.
        """
        async with translate_errors("tenant list"):
            at = await self._restore(keys=[self._erased_key], args=[tenant])
        return None if at is None else float(as_str(at))


def _erasures(raw: Mapping[bytes | str, bytes | str]) -> dict[str, Erasure]:
    return {as_str(k): Erasure.from_json(v) for k, v in raw.items()}
