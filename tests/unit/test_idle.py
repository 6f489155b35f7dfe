"""The idle backoff's rule and how it is applied (``consumers.idle``), on stand-in consumers:
objects with the one attribute aiokafka's fetcher reads (the real ones: tests/integration/test_idle.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from structlog.testing import capture_logs

from consumers.idle import FetchBackoff, fetch_wait


def consumer(wait_ms: int) -> Any:
    return SimpleNamespace(_fetcher=SimpleNamespace(_fetch_max_wait_ms=wait_ms))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_rule() -> None:
    assert fetch_wait(29.9, active_ms=5, idle_ms=100, idle_after_s=30) == 5
    assert fetch_wait(30.0, active_ms=5, idle_ms=100, idle_after_s=30) == 100
    # An idle wait no longer than the subscriber's own changes nothing (Apache Kafka's 500 ms).
    assert fetch_wait(3600, active_ms=500, idle_ms=100, idle_after_s=30) == 500
    assert fetch_wait(3600, active_ms=20, idle_ms=0, idle_after_s=30) == 20


def test_backs_off_when_idle_and_a_record_restores_the_wait_at_once() -> None:
    clock = Clock()
    queries, docs = consumer(5), consumer(20)
    backoff = FetchBackoff(idle_after_s=30, idle_ms=100, clock=clock)
    backoff.watch("requests", lambda: queries, 5)
    backoff.watch("documents", lambda: docs, 20)
    backoff.tick()
    assert (queries._fetcher._fetch_max_wait_ms, docs._fetcher._fetch_max_wait_ms) == (5, 20)
    clock.now += 29
    backoff.seen("documents")
    clock.now += 1
    backoff.tick()
    assert backoff.waits() == {"requests": 100, "documents": 20}
    assert (queries._fetcher._fetch_max_wait_ms, docs._fetcher._fetch_max_wait_ms) == (100, 20)
    backoff.seen("requests")  # no tick needed: the next fetch already waits 5 ms
    assert queries._fetcher._fetch_max_wait_ms == 5
    clock.now += 29
    backoff.tick()
    assert backoff.waits() == {"requests": 5, "documents": 100}


def test_a_replaced_consumer_gets_the_wait_too_and_a_missing_one_is_skipped() -> None:
    clock = Clock()
    current: list[Any] = [None]
    backoff = FetchBackoff(idle_after_s=30, idle_ms=100, clock=clock)
    backoff.watch("transcripts", lambda: current[0], 20)
    clock.now += 31
    backoff.tick()  # no consumer yet: nothing to set, nothing fails
    current[0] = SimpleNamespace(_fetcher=None)  # made, not started
    backoff.tick()
    current[0] = consumer(20)
    backoff.tick()
    assert current[0]._fetcher._fetch_max_wait_ms == 100
    current[0] = consumer(20)  # the subscriber restarted its consumer
    backoff.tick()
    assert current[0]._fetcher._fetch_max_wait_ms == 100


def test_an_aiokafka_without_the_attribute_is_said_once_and_left_alone() -> None:
    clock = Clock()
    odd = SimpleNamespace(_fetcher=SimpleNamespace())
    odder = SimpleNamespace()  # no fetcher at all
    backoff = FetchBackoff(idle_after_s=30, idle_ms=100, clock=clock)
    backoff.watch("requests", lambda: odd, 5)
    backoff.watch("documents", lambda: odder, 20)
    clock.now += 31
    with capture_logs() as logs:
        backoff.tick()
        backoff.tick()
    assert [e["event"] for e in logs] == ["consumer.idle_backoff_disabled"]
    assert not hasattr(odd._fetcher, "_fetch_max_wait_ms") and not hasattr(odder, "_fetcher")


def test_seen_for_an_unwatched_role_is_ignored() -> None:
    FetchBackoff(idle_after_s=30, idle_ms=100).seen("unknown")


async def test_run_ticks_until_halted() -> None:
    clock = Clock()
    queries = consumer(5)
    backoff = FetchBackoff(idle_after_s=30, idle_ms=100, clock=clock)
    backoff.watch("requests", lambda: queries, 5)
    clock.now += 60
    halt = asyncio.Event()
    task = asyncio.create_task(backoff.run(halt))
    for _ in range(100):
        if queries._fetcher._fetch_max_wait_ms == 100:
            break
        await asyncio.sleep(0.01)
    assert queries._fetcher._fetch_max_wait_ms == 100
    halt.set()
    await asyncio.wait_for(task, timeout=5)
