"""Times as every client surface takes them (the client, the CLI, the MCP tools, the
explorer, the LangChain retriever): a datetime, an ISO 8601 string, or an age before now."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from memory.errors import InvalidRequest

_AGE = re.compile(r"(\d{1,9})([smhdw])")
_AGE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def when(value: datetime | str | None, what: str, *, now: datetime | None = None) -> datetime | None:
    """A time argument (``since``, ``until``) as every client surface takes it: a datetime, an
    ISO 8601 time (naive: UTC), or an age before ``now`` (``90m``, ``24h``, ``7d``, ``2w``).

    Raises:
        InvalidRequest: none of these, naming ``what``.
    """
    if value is None or isinstance(value, datetime):
        return value
    text = value.strip()
    if not text:
        return None
    try:
        if age := _AGE.fullmatch(text):
            return (now or datetime.now(UTC)) - timedelta(**{_AGE_UNITS[age.group(2)]: int(age.group(1))})
        return datetime.fromisoformat(text)
    except (ValueError, OverflowError):  # OverflowError: an age reaching before year 1
        raise InvalidRequest(
            f"{what} takes an ISO 8601 time (2026-11-24T09:00:00Z) or an age (90m, 24h, 7d, 2w), got {value[:80]!r}"
        ) from None
