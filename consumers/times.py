"""Times as every client surface takes them (the client, the CLI, the MCP tools, the
explorer, the LangChain retriever): a datetime, an ISO 8601 string, or an age before now."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from memory.errors import InvalidRequest

_AGE = re.compile(r"(\d{1,9})([smhdw])")
_AGE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
#: Days named by a word, as days before today's (UTC, as a date alone is).
_DAYS = {"today": 0, "yesterday": 1}


def when(value: datetime | str | None, what: str, *, now: datetime | None = None) -> datetime | None:
    """A time argument (``since``, ``until``) as every client surface takes it: a datetime, an
    ISO 8601 time (naive: UTC), an age before ``now`` (``90m``, ``24h``, ``7d``, ``2w``), or
    ``now``. A date alone (or ``today``, ``yesterday``: UTC days) is the day's first instant,
    and for ``until`` (``what`` names it, ``--until`` too) its last, so
    ``since=until="2026-12-05"`` is that whole day rather than one instant.

    Raises:
        InvalidRequest: none of these, naming ``what``.
    """
    if value is None or isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise InvalidRequest(f"{what} takes a datetime or a string, got {type(value).__name__}: {value!r:.80}")
    text = value.strip()
    if not text:
        return None
    word = text.lower()
    if word == "now":
        return now or datetime.now(UTC)
    if word in _DAYS:
        day = (now or datetime.now(UTC)).astimezone(UTC).date() - timedelta(days=_DAYS[word])
        text = day.isoformat()
    try:
        if age := _AGE.fullmatch(text):
            return (now or datetime.now(UTC)) - timedelta(**{_AGE_UNITS[age.group(2)]: int(age.group(1))})
        at = datetime.fromisoformat(text)
        if _DATE.fullmatch(text) and what.lstrip("-") == "until":
            return at + timedelta(days=1, microseconds=-1)
        return at
    except (ValueError, OverflowError):  # OverflowError: an age reaching before year 1
        raise InvalidRequest(
            f"{what} takes an ISO 8601 time (2026-11-24T09:00:00Z), a date, an age (90m, 24h, 7d, 2w), "
            f"today, yesterday or now, got {value[:80]!r}"
        ) from None


def is_shorthand(value: str) -> bool:
    """Whether ``value`` is a time only :func:`when` reads (an age, a date alone, ``today``,
    ``yesterday``, ``now``), not an ISO 8601 time."""
    text = value.strip().lower()
    return bool(_AGE.fullmatch(text) or _DATE.fullmatch(text)) or text == "now" or text in _DAYS


def age(seconds: float) -> str:
    """A duration for people: ``42 s``, ``7 min``, ``3.5 h``, ``2.0 d``."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
