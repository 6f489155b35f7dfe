"""The tenants a daemon has seen, shared by every daemon of an index in one Redis set
(``memory.keys.tenants_key``): what the graph's loops walk, and whose topics the daemon
recreates when the broker lost them."""

from __future__ import annotations

import redis.asyncio as aredis

from memory.index import translate_errors
from memory.keys import tenants_key
from memory.records import DEFAULT_TENANT
from memory.schema import as_str


class TenantRegistry:
    """The tenants of one index name; each is written to Redis once per process."""

    def __init__(self, *, client: aredis.Redis, name: str) -> None:
        self._r = client
        self._key = tenants_key(name)
        self._known: set[str] = set()

    async def saw(self, tenant: str) -> None:
        """Record ``tenant`` (a set lookup once it is known to this process).

        Raises:
            BackendUnavailable: Redis is unreachable.
        """
        if tenant not in self._known:
            async with translate_errors("tenant list"):
                await self._r.sadd(self._key, tenant)
            self._known.add(tenant)

    async def all(self) -> list[str]:
        """Every tenant any daemon of the index has seen, sorted.

        Raises:
            BackendUnavailable: Redis is unreachable.
        """
        async with translate_errors("tenant list"):
            found = {as_str(m) for m in await self._r.smembers(self._key)}
        return sorted(found | self._known)

    async def with_topics(self) -> list[str]:
        """The tenants whose topics topic tenancy keeps: every one recorded but ``default``,
        single tenancy's one tenant (a deployment that moved to topic tenancy has it on record).

        Raises:
            BackendUnavailable: Redis is unreachable.
        """
        return [t for t in await self.all() if t != DEFAULT_TENANT]
