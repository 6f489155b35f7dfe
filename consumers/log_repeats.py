"""Repeated library log records let through once in a while: a client kept open while its
broker is down should not bury its application's log."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

#: A library's message (by its template) is shown at most once per this many seconds.
REPEAT_WINDOW_S = 30.0


class RepeatFilter(logging.Filter):
    """Lets a library's message through once per ``window_s``, by logger and template.

    With the broker down, aiokafka logs the same connection error at every retry: an MCP
    server wrote ~1,500 such lines a minute to its host's log, burying everything else. The
    template (``"Unable connect to node with id %s: %s"``) is the key, so a message whose
    arguments change each time (the attempt, the error's text) still counts as a repeat.
    """

    def __init__(self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._window = window_s
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` passes: not if its template (and error type) passed within the window.
        Debug and info records always pass: who asks for them wants each."""
        if record.levelno < logging.WARNING:
            return True
        # One template carries many errors: the exception's type is part of the message.
        error = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        key, now = (record.name, f"{record.msg}{error}"), self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._window:
            return False
        if len(self._last) >= 10_000:  # templates are few; this bounds a library that formats its own
            self._last.clear()
        self._last[key] = now
        return True


#: aiokafka's loggers: each logs its own module's records (a logger's filter sees no child's).
_KAFKA_LOGGERS = (
    "aiokafka",
    "aiokafka.admin.client",
    "aiokafka.cluster",
    "aiokafka.conn",
    "aiokafka.consumer.consumer",
    "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator",
    "aiokafka.consumer.subscription_state",
    "aiokafka.producer.producer",
    "aiokafka.producer.sender",
)


def quiet_kafka_repeats() -> None:
    """Give aiokafka's loggers a ``RepeatFilter`` (once per process): with the broker down, a
    client's consumer and producer log the same few errors ~70 times a second, into whatever
    handlers the application configured."""
    for name in _KAFKA_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RepeatFilter) for f in logger.filters):
            logger.addFilter(RepeatFilter())
