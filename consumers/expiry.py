"""Requests older than ``consumer.query_max_age_ms``: answered with an ``expired`` error, and
told to the operator at most once a minute.

Their age is the daemon's clock against the asker's (the record's CreateTime), so a request
is "old" either because it waited (a backlog after an outage: its asker gave up) or because
the two clocks differ by more than the cut-off. In the second case every request of that
asker expires; the error says so to the asker, and the warning to the operator.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from consumers.errors import RequestExpired

log = structlog.get_logger()

#: At most one warning per this many seconds; the requests between are counted in it.
WARN_EVERY_S = 60.0


def expired_error(age_ms: float, max_age_ms: int) -> RequestExpired:
    """The error an expired request is answered with."""
    return RequestExpired(
        f"not answered: the request is {age_ms / 1000:,.0f} s old by the daemon's clock, over "
        f"consumer.query_max_age_ms ({max_age_ms / 1000:,.0f} s). Either it waited that long (its asker "
        "has given up), or the asker's clock is behind the daemon's by that much: check the hosts' time sync"
    )


class ExpiryLog:
    """Warns ``query.request_expired`` on the first expired request, then at most once per ``every_s``
    with how many expired since (a backlog of thousands would flood the log)."""

    def __init__(self, every_s: float = WARN_EVERY_S) -> None:
        self._every_s = every_s
        self._last = -float("inf")
        self._since = 0

    def seen(self, record: Any, age_ms: float) -> None:
        """Count an expired request; warn if the last warning is ``every_s`` old."""
        self._since += 1
        now = time.monotonic()
        if now - self._last < self._every_s:
            return
        log.warning(
            "query.request_expired",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            age_s=round(age_ms / 1000, 1),
            expired=self._since,
            why="older than consumer.query_max_age_ms by this daemon's clock: a backlog, or the asker's clock behind",
        )
        self._last, self._since = now, 0
