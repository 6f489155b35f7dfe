"""structlog configuration: once, here. Console on a TTY, JSON otherwise."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

from consumers.log_repeats import RepeatFilter


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
