"""How the ingestor runs a call to a backend (Redis, the embedding worker, the change hook's
graph store): retried with exponential backoff while the backend is unavailable or Redis
refuses us, until the daemon stops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import structlog

from memory.config import IngestConfig
from memory.errors import BackendUnavailable, Unauthorized, WritesHeld

log = structlog.get_logger()

T = TypeVar("T")


# After the first tries, a long outage is logged once in this many tries (every ~5 min at
# the default 5 s cap), so a refused index does not fill the log with one line each wait.
_LOG_EVERY = 60


def worth_logging(attempt: int, kind: str, last_logged: str | None) -> bool:
    """Whether the ``attempt``-th failed try (1-based) is logged: a new kind of error (its
    class) always, the same kind on tries 1, 2, 4, 8, … and then once every ``_LOG_EVERY``
    tries (its message may change with every try: a port, a time)."""
    if kind != last_logged:
        return True
    return attempt & (attempt - 1) == 0 if attempt < _LOG_EVERY else attempt % _LOG_EVERY == 0


def doubling(attempt: int, initial_s: float, most_s: float) -> float:
    """The wait after the ``attempt``-th failure in a row (1-based): ``initial_s``, doubled
    with each further one, never over ``most_s``."""
    return min(initial_s * 2.0 ** min(max(attempt, 1) - 1, 64), most_s)


def backoff_s(attempt: int, cfg: IngestConfig) -> float:
    """The wait after the ``attempt``-th failed try of an ingest step (see ``doubling``)."""
    return doubling(attempt, cfg.retry_initial_s, cfg.retry_max_s)


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds``, or less if ``stop`` is set meanwhile (a shutdown cuts every backoff short)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


class Retrying(Protocol):
    """How the ingestor runs a backend call: retried while the backend is unavailable."""

    async def __call__(self, what: str, fn: Callable[[], Awaitable[T]]) -> T: ...


async def retry_while_unavailable(
    what: str, fn: Callable[[], Awaitable[T]], *, stopping: asyncio.Event, cfg: IngestConfig
) -> T:
    """Retry ``fn`` with exponential backoff while its backend is unavailable (Redis, a
    crashed embedding worker: any ``BackendUnavailable``), or Redis refuses us.

    Gives up only when the daemon is stopping, so offsets are never committed past
    data that is not in Redis. A refusal (a password rotated, an ACL that lost a
    command, e.g. WATCH) is the deployment's, not the event's: waited out, loudly,
    instead of dead-lettering every event until an operator fixes it. The log names the
    try and the error, but only on the tries ``worth_logging`` picks.

    Args:
        what: what ``fn`` does, for the log.
        fn: the call, made again on each try.
        stopping: set when the daemon stops; the wait between tries ends with it.
        cfg: the backoff's first and longest delays.

    Returns:
        What ``fn`` returned.

    Raises:
        BackendUnavailable: the backend is unavailable and ``stopping`` is set.
        Unauthorized: Redis refuses us and ``stopping`` is set.
        WritesHeld: at once: the caller's whole batch waits and starts over (see ``Ingestor.apply``).
    """
    attempt = 0
    logged: str | None = None
    while True:
        try:
            return await fn()
        except WritesHeld:
            raise
        except (BackendUnavailable, Unauthorized) as exc:
            attempt += 1
            if stopping.is_set():
                raise
            delay = backoff_s(attempt, cfg)
            if worth_logging(attempt, type(exc).__name__, logged):
                logged = type(exc).__name__
                emit = log.error if isinstance(exc, Unauthorized) else log.warning
                emit("ingest.backend_retried", what=what, attempt=attempt, delay_s=delay, error=str(exc))
            await pause(stopping, delay)
