"""One thread that calls what is due past its deadline, for blocking calls that cannot watch a clock.

Arming and disarming only touch a heap under a lock: nothing starts a thread per call. The
thread sleeps until the earliest deadline and is woken only when a new one comes first. Its
calls run one after another, so a call must not block: a slow one delays every later one.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger()


class Watchdog:
    """``arm`` a call for later, ``disarm`` it when the watched call returned in time."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._due: dict[int, tuple[Callable[..., Any], tuple[Any, ...]]] = {}
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, delay_s: float, fn: Callable[..., Any], *args: Any) -> int:
        """Call ``fn(*args)`` on the watchdog's thread in ``delay_s`` unless disarmed first."""
        when = time.monotonic() + delay_s
        with self._cv:
            token = next(self._tokens)
            self._due[token] = (fn, args)
            heapq.heappush(self._heap, (when, token))
            if self._thread is None or not self._thread.is_alive():
                thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                thread.start()  # kept only once started: a failed start is tried again next time
                self._thread = thread
            elif self._heap[0][1] == token:  # sooner than what the thread sleeps until
                self._cv.notify()
        return token

    def disarm(self, token: int) -> None:
        """Forget ``token``'s call (a no-op once it ran)."""
        with self._cv:
            self._due.pop(token, None)
            # Disarmed entries leave the heap when they reach its top; rebuilt when they
            # crowd it (thousands of requests a minute against deadlines of a minute or more).
            if len(self._heap) > 2 * len(self._due) + 64:
                self._heap = [e for e in self._heap if e[1] in self._due]
                heapq.heapify(self._heap)

    def pending(self) -> int:
        """How many calls are armed and have not run."""
        with self._cv:
            return len(self._due)

    def _run(self) -> None:
        with self._cv:
            while True:
                while self._heap and self._heap[0][1] not in self._due:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cv.wait()
                    continue
                when, token = self._heap[0]
                wait = when - time.monotonic()
                if wait > 0:
                    self._cv.wait(wait)
                    continue
                heapq.heappop(self._heap)
                fn, args = self._due.pop(token)
                self._cv.release()
                try:
                    fn(*args)
                except Exception:  # a failed call must not stop the ones after it
                    log.exception("watchdog.call_failed", watchdog=self._name)
                finally:
                    self._cv.acquire()
