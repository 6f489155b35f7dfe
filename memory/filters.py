"""Metadata filters -> RediSearch TAG clauses, validated and escaped (pure)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from memory.errors import InvalidRequest
from memory.text import escape_tag

FilterValue = str | Sequence[str]

#: Keys every deployment can filter on; settings may add more.
BASE_FILTER_KEYS: tuple[str, ...] = (
    "environment",
    "service",
    "agent_id",
    "session_id",
    "kind",
    "doc_id",
    "source",
)

MAX_VALUES_PER_KEY = 64
MAX_VALUE_LENGTH = 512


def build_filter(
    metadata_filter: Mapping[str, FilterValue] | None,
    *,
    allowed: Collection[str],
) -> str:
    """Turn ``{"service": "billing-service", "environment": ["prod", "staging"]}`` into
    ``@environment:{prod|staging} @service:{billing\\-service}`` (keys AND, values OR).

    Args:
        metadata_filter: key -> a string or a list of strings (any of them).
        allowed: the filterable keys; anything else is an error, never ignored.

    Returns:
        A RediSearch query fragment, ``"*"`` when there is no filter.

    Raises:
        InvalidRequest: unknown key, empty or over-long value, empty list, non-string value.
    """
    if not metadata_filter:
        return "*"
    clauses: list[str] = []
    for key in sorted(metadata_filter):
        if key not in allowed:
            raise InvalidRequest(f"unknown metadata_filter key {key!r}; filterable keys: {', '.join(sorted(allowed))}")
        raw = metadata_filter[key]
        if isinstance(raw, str):
            values: list[object] = [raw]
        elif isinstance(raw, list | tuple):
            values = list(raw)
        else:
            raise InvalidRequest(f"metadata_filter[{key!r}] values must be strings or lists of strings")
        if not values:
            raise InvalidRequest(f"metadata_filter[{key!r}] is an empty list")
        if len(values) > MAX_VALUES_PER_KEY:
            raise InvalidRequest(f"metadata_filter[{key!r}] has more than {MAX_VALUES_PER_KEY} values")
        escaped: list[str] = []
        for value in values:
            if not isinstance(value, str):
                raise InvalidRequest(f"metadata_filter[{key!r}] values must be strings")
            if not value or len(value) > MAX_VALUE_LENGTH:
                raise InvalidRequest(f"metadata_filter[{key!r}] values must be 1..{MAX_VALUE_LENGTH} characters")
            escaped.append(escape_tag(value))
        clauses.append(f"@{key}:{{{'|'.join(escaped)}}}")
    return " ".join(clauses)


def combine(text_query: str, filter_query: str) -> str:
    """AND a text clause with a filter clause, keeping each in its own group."""
    if filter_query == "*":
        return text_query
    return f"({text_query}) ({filter_query})"


def and_filters(a: str, b: str) -> str:
    """AND two filter fragments (``"*"`` means no filter)."""
    if a == "*":
        return b
    if b == "*":
        return a
    return f"{a} {b}"
