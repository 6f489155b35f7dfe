"""Whether ingestion is working right now, so background jobs can leave it the cores."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator


def background_wait(
    *, now: float, in_flight: int, last_end: float, deferred_s: float, quiet_s: float, max_defer_s: float
) -> float:
    """Seconds a background job should still wait before it starts, to let ingestion go first.

    Ingestion counts as quiet once no batch is in flight and the last one ended at least
    ``quiet_s`` ago. A job already deferred ``max_defer_s`` starts anyway, so background
    work slows down under a steady stream of events but never stops.

    Args:
        now: the current time (monotonic seconds).
        in_flight: ingest batches being applied right now.
        last_end: when the last batch ended (monotonic seconds; 0 = never).
        deferred_s: how long this job has already waited.
        quiet_s: the quiet time ingestion must have had.
        max_defer_s: the longest a job waits.

    Returns:
        0 to start now, else how long to wait before asking again.
    """
    left = max_defer_s - deferred_s
    if left <= 0:
        return 0.0
    if in_flight > 0:
        return min(quiet_s, left)
    idle = now - last_end
    if idle >= quiet_s:
        return 0.0
    return min(quiet_s - idle, left)


class IngestActivity:
    """Counts ingest batches in flight and remembers when the last one ended."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.in_flight = 0
        self.last_end = 0.0

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Mark one batch as in flight for the duration of the block."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self.last_end = self.clock()

    def wait_s(self, *, deferred_s: float, quiet_s: float, max_defer_s: float) -> float:
        """``background_wait`` for the current state."""
        return background_wait(
            now=self.clock(),
            in_flight=self.in_flight,
            last_end=self.last_end,
            deferred_s=deferred_s,
            quiet_s=quiet_s,
            max_defer_s=max_defer_s,
        )
