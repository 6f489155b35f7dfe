"""Delivery attempts per Kafka record, counted in Redis so every daemon sees the same count.

A record whose handling keeps failing (a bug, not an outage) must not block its partition
forever: after ``max_attempts`` it is dead-lettered with the error.

A record is its position *and* its timestamp: a broker that lost its log (tansu keeps it in
memory) or a topic deleted and recreated starts its offsets at 0 again, and a count left by
the old record at that offset (one that failed, then got through, expires only after a day)
must not count against the new one, dead-lettering it before its attempts are spent.
"""

from __future__ import annotations

import redis.asyncio as aredis

from memory.index import translate_errors


class AttemptCounter:
    """``incr`` per record position; ``forget`` once the record is settled."""

    def __init__(self, *, client: aredis.Redis, name: str, ttl_s: int = 86_400) -> None:
        self._r = client
        self._prefix = f"{name}:attempts"
        self._ttl = ttl_s

    def _key(self, topic: str, partition: int, offset: int, stamp: int) -> str:
        return f"{self._prefix}:{topic}:{partition}:{offset}:{stamp}"

    async def incr(self, topic: str, partition: int, offset: int, stamp: int) -> int:
        """Count one more failed attempt of the record (``stamp``: its Kafka timestamp); returns the total."""
        key = self._key(topic, partition, offset, stamp)
        async with translate_errors("attempt count"), self._r.pipeline(transaction=True) as pipe:
            pipe.incr(key)
            pipe.expire(key, self._ttl)
            n, _ = await pipe.execute()
        return int(n)

    async def forget(self, topic: str, partition: int, offset: int, stamp: int) -> None:
        """Drop the count of a settled record."""
        async with translate_errors("attempt count"):
            await self._r.delete(self._key(topic, partition, offset, stamp))
