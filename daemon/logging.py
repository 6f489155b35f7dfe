"""structlog configuration: once, here. Console on a TTY, JSON otherwise."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Literal

import structlog

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
        """Whether ``record`` passes: not if its template (and error type) passed within the window."""
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


def configure_logging(
    level: str = "info",
    fmt: Literal["auto", "json", "console"] = "auto",
) -> None:
    """Configure structlog and route stdlib logging (aiokafka, FastStream) through it."""
    json_output = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer] if json_output else [*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processor=renderer, foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared]
        )
    )
    handler.addFilter(RepeatFilter())  # only libraries' records reach it: ours go through structlog
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.WARNING)
    for noisy in ("aiokafka", "faststream", "kafka", "sentence_transformers", "transformers", "LiteLLM"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
