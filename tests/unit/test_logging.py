"""Libraries' log records: a message repeated by a retry loop is shown once per window."""

from __future__ import annotations

import logging

from consumers.log_repeats import RepeatFilter


def _record(name: str, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)


def test_a_repeated_library_message_passes_once_per_window() -> None:
    now = [0.0]
    f = RepeatFilter(window_s=30, clock=lambda: now[0])
    template = "Unable connect to node with id %s: %s"
    passed = []
    for attempt in range(50):  # a retry loop 10 times a second, each with its own text
        now[0] = attempt / 10
        passed.append(f.filter(_record("aiokafka", template, 1, f"attempt {attempt}: refused")))
    assert passed == [True] + [False] * 49
    # Another message, or the same from another library, is its own.
    assert f.filter(_record("aiokafka", "Heartbeat failed for group %s", "g"))
    assert f.filter(_record("faststream", template, 1, "x"))
    now[0] = 30.0  # the window after the first one: shown again
    assert f.filter(_record("aiokafka", template, 1, "still refused"))


def test_a_traceback_of_another_type_is_another_message() -> None:
    f = RepeatFilter(window_s=30, clock=lambda: 0.0)

    def with_error(exc: Exception) -> logging.LogRecord:
        record = _record("faststream", "Kafka error occurred")
        record.exc_info = (type(exc), exc, None)
        return record

    assert f.filter(with_error(ValueError("a")))
    assert not f.filter(with_error(ValueError("b")))  # the same error again, within the window
    assert f.filter(with_error(KeyError("c")))  # another error under the same template
