"""Delivery bookkeeping per Kafka record, kept in Redis so every daemon sees the same state:
how often a record's handling failed, and whether it was already dead-lettered.

A record whose handling keeps failing (a bug, not an outage) must not block its partition
forever: after ``max_attempts`` it is dead-lettered with the error. A batch is redelivered
whole when any of its records fails, so a record dead-lettered in one delivery comes back in
the next; the dead-letter mark keeps it from being published to the DLQ a second time.

A record is its position *and* its timestamp: a broker that lost its log (tansu keeps it in
memory) or a topic deleted and recreated starts its offsets at 0 again, and state left by
the old record at that offset (kept for a day) must not count against the new one,
dead-lettering it before its attempts are spent or hiding it from the DLQ.
"""

from __future__ import annotations

import redis.asyncio as aredis

from memory.index import translate_errors
from memory.keys import attempt_key


class AttemptCounter:
    """``incr`` per record position; ``dead_lettered``/``mark_dead_lettered`` per record."""

    def __init__(self, *, client: aredis.Redis, name: str, ttl_s: int = 86_400) -> None:
        self._r = client
        self._name = name
        self._ttl = ttl_s

    def _key(self, kind: str, topic: str, partition: int, offset: int, stamp: int) -> str:
        return attempt_key(self._name, kind, topic, partition, offset, stamp)

    async def incr(self, topic: str, partition: int, offset: int, stamp: int) -> int:
        """Count one more failed attempt of the record (``stamp``: its Kafka timestamp); returns the total."""
        key = self._key("attempts", topic, partition, offset, stamp)
        async with translate_errors("attempt count"), self._r.pipeline(transaction=True) as pipe:
            pipe.incr(key)
            pipe.expire(key, self._ttl)
            n, _ = await pipe.execute()
        return int(n)

    async def dead_lettered(self, topic: str, partition: int, offset: int, stamp: int) -> bool:
        """Whether the record was already published to the DLQ (in the last day)."""
        async with translate_errors("dead-letter mark"):
            return bool(await self._r.exists(self._key("dead", topic, partition, offset, stamp)))

    async def mark_dead_lettered(self, topic: str, partition: int, offset: int, stamp: int) -> None:
        """Note that the record is in the DLQ. Set only after the publish succeeded: a publish
        that failed must be tried again, so a crash in between can still duplicate a dead
        letter (at-least-once), but never lose one."""
        async with translate_errors("dead-letter mark"):
            await self._r.set(self._key("dead", topic, partition, offset, stamp), 1, ex=self._ttl)
