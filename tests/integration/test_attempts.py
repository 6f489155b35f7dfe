"""Delivery attempts and dead-letter marks kept in a real Redis, per record (position and timestamp)."""

from __future__ import annotations

import pytest
import redis.asyncio as aredis

from memory.attempts import AttemptCounter
from tests.conftest import unique

pytestmark = pytest.mark.integration


async def test_a_new_record_at_a_reused_offset_starts_its_own_count(redis_url: str) -> None:
    """A broker that lost its log (or a recreated topic) starts its offsets at 0 again: the
    count an old record left at offset 0 is not the new record's, which gets all its
    attempts before it is dead-lettered. The same record redelivered keeps counting."""
    client = aredis.from_url(redis_url)
    counter = AttemptCounter(client=client, name=unique("attempts"))
    try:
        assert await counter.incr("docs", 0, 0, 1_700_000_000_000) == 1
        assert await counter.incr("docs", 0, 0, 1_700_000_000_000) == 2  # redelivered: same record
        # the log is lost; a different record now sits at offset 0
        assert await counter.incr("docs", 0, 0, 1_700_000_500_000) == 1
        assert await counter.incr("docs", 0, 0, 1_700_000_000_000) == 3  # the old one's count is its own
        # dead-letter marks are per record too
        assert not await counter.dead_lettered("docs", 0, 0, 1_700_000_000_000)
        await counter.mark_dead_lettered("docs", 0, 0, 1_700_000_000_000)
        assert await counter.dead_lettered("docs", 0, 0, 1_700_000_000_000)
        assert not await counter.dead_lettered("docs", 0, 0, 1_700_000_500_000)
        assert not await counter.dead_lettered("docs", 0, 1, 1_700_000_000_000)
    finally:
        await client.aclose()
