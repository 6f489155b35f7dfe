"""Longer broker waits for a subscriber that has had nothing to do for a while.

tansu may hold a fetch for its whole wait even when data arrives, so the daemon's subscribers
ask for short waits (5 ms for requests, 20 ms for events): idle, they fetched ~300 times a
second and the daemon and the broker burned a third of a core between them. After
``idle_after_s`` without a record, a subscriber's fetches wait ``idle_fetch_max_wait_ms``; its
first records back restore its own wait as they are handled, so only the records of the first
fetch or two may wait the longer one (aiokafka may send its next fetch before the handler
runs; on Apache Kafka, which answers a fetch when data arrives, none do).

``fetch_wait`` is the rule; ``FetchBackoff`` applies it to the subscribers' aiokafka consumers.
aiokafka reads its fetch wait from its fetcher each time it builds a fetch request, and has no
public way to change it: where that attribute is missing (another aiokafka), nothing changes
and ``consumer.idle_backoff_disabled`` says so once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from consumers.kafka_clients import set_fetch_wait

log = structlog.get_logger()

_MISSING = object()

#: How often the rule is applied: a subscriber backs off at most this long after its idle_after_s.
TICK_S = 1.0


def fetch_wait(idle_for_s: float, *, active_ms: int, idle_ms: int, idle_after_s: float) -> int:
    """The fetch wait of a subscriber that has had no record for ``idle_for_s`` seconds."""
    return idle_ms if idle_for_s >= idle_after_s and idle_ms > active_ms else active_ms


@dataclass
class _Watched:
    consumer_of: Callable[[], Any]  # the subscriber's current aiokafka consumer, or None
    active_ms: int
    last_record: float
    applied: int | None = None  # the wait last set on the consumer (None: its own)
    consumer_id: int | None = None  # the consumer it was set on


class FetchBackoff:
    """Applies :func:`fetch_wait` to each watched subscriber: ``seen`` on every record,
    ``run`` in the background."""

    def __init__(self, *, idle_after_s: float, idle_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._idle_after_s = idle_after_s
        self._idle_ms = idle_ms
        self._clock = clock
        self._watched: dict[str, _Watched] = {}
        self._unavailable = False

    def watch(self, role: str, consumer_of: Callable[[], Any], active_ms: int) -> None:
        """Apply the rule to the subscriber ``role``, whose own wait is ``active_ms``."""
        self._watched[role] = _Watched(consumer_of, active_ms, self._clock())

    def seen(self, role: str) -> None:
        """A record of ``role`` arrived: its own wait again, from its next fetch on."""
        watched = self._watched.get(role)
        if watched is None:
            return
        watched.last_record = self._clock()
        if watched.applied is not None and watched.applied != watched.active_ms:
            self._apply(role, watched, watched.active_ms)

    def waits(self) -> dict[str, int]:
        """Each watched subscriber's fetch wait as last set (its own where none was)."""
        return {role: w.active_ms if w.applied is None else w.applied for role, w in self._watched.items()}

    def tick(self) -> None:
        """Set each watched subscriber's wait by the rule."""
        now = self._clock()
        for role, watched in self._watched.items():
            wait = fetch_wait(
                now - watched.last_record,
                active_ms=watched.active_ms,
                idle_ms=self._idle_ms,
                idle_after_s=self._idle_after_s,
            )
            self._apply(role, watched, wait)

    async def run(self, halt: asyncio.Event) -> None:
        """``tick`` every :data:`TICK_S` until ``halt`` is set."""
        while not halt.is_set():
            self.tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(halt.wait(), timeout=TICK_S)

    def _apply(self, role: str, watched: _Watched, wait: int) -> None:
        consumer = watched.consumer_of()
        if consumer is None:  # not started yet, or being restarted: the next tick sees the new one
            return
        fetcher: Any = getattr(consumer, "_fetcher", _MISSING)
        if fetcher is None:  # aiokafka makes its fetcher when the consumer starts
            return
        if id(consumer) == watched.consumer_id and watched.applied == wait:
            return
        if not set_fetch_wait(consumer, wait):
            if not self._unavailable:
                self._unavailable = True
                log.warning("consumer.idle_backoff_disabled", reason="aiokafka's fetcher has no _fetch_max_wait_ms")
            return
        watched.applied, watched.consumer_id = wait, id(consumer)
        log.debug("consumer.fetch_wait_set", subscriber=role, wait_ms=wait)
