"""Metadata filters -> RediSearch TAG clauses, validated and escaped (pure)."""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from memory.errors import InvalidRequest
from memory.records import KINDS
from memory.text import escape_tag

FilterValue = str | Sequence[str]
#: A request's filter as given: key -> a value, values (any of them), or ``{"not": ...}``.
FilterSpec = Mapping[str, FilterValue | Mapping[Literal["not"], FilterValue]]

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

#: Unit separator: a TAG value may contain commas (the RediSearch default separator),
#: so no printable character is used to split values. The schema declares it; the
#: filters must know it to tell which values a TAG clause can match.
TAG_SEPARATOR = "\x1f"

#: Filter keys whose values a chunk takes from its own fields, never from its metadata.
OWN_TAG_KEYS = frozenset({"kind", "doc_id", "source"})

MAX_VALUES_PER_KEY = 64
MAX_VALUE_LENGTH = 512


def tag_values(metadata: Mapping[str, object], filter_keys: Collection[str]) -> dict[str, str]:
    """A memory's filterable metadata values as TAG values (booleans as true/false) (pure).

    The one rule both ingestion and a reindex's copy of stored chunks use, so a chunk's tags
    always follow from the metadata stored beside it.
    """
    return {key: tag_text(value) for key, value in metadata.items() if key in filter_keys and key not in OWN_TAG_KEYS}


def tag_text(value: object) -> str:
    """A metadata value as its TAG value: text, booleans as true/false (pure)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def value_hash(value: str) -> int:
    """A stable 53-bit hash of a filter value: exact as a RediSearch NUMERIC (a double)."""
    return int.from_bytes(hashlib.blake2b(value.encode("utf-8"), digest_size=8).digest(), "big") >> 11


#: Prefix of the NUMERIC hash fields (so no filter key may start with it).
HASH_FIELD_PREFIX = "h_"


def hash_field(key: str) -> str:
    """The NUMERIC field holding ``value_hash`` of a TAG field's value."""
    return f"{HASH_FIELD_PREFIX}{key}"


@dataclass(frozen=True, slots=True)
class TagFilter:
    """A request's exact filter: keys AND; under a key, a chunk's value must be one of the
    ``include`` values (when the key has any) and none of the ``exclude`` values. A chunk
    without the key passes an exclusion and fails an inclusion, in the engine as here."""

    include: Mapping[str, Sequence[str]] = field(default_factory=dict)
    exclude: Mapping[str, Sequence[str]] = field(default_factory=dict)

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key the filter names: the tags a hit must carry to be re-checked."""
        return tuple(sorted({*self.include, *self.exclude}))

    def admits(self, key: str, value: str | None) -> bool:
        """Whether ``value`` under ``key`` passes the filter's clauses on that key."""
        wanted = self.include.get(key)
        return (wanted is None or value in wanted) and value not in self.exclude.get(key, ())

    def matches(self, tags: Mapping[str, str]) -> bool:
        """Whether a stored chunk's tag values satisfy the filter (exact string comparison)."""
        if not matches(tags, self.include):
            return False
        for key, values in self.exclude.items():  # noqa: SIM110 (hot: every candidate of every leg)
            if tags.get(key) in values:
                return False
        return True

    def including(self, key: str, values: Sequence[str]) -> TagFilter:
        """The filter with ``key`` limited to ``values`` (its inclusion replaced)."""
        return TagFilter({**self.include, key: list(values)}, self.exclude)

    def without(self, keys: Collection[str]) -> TagFilter:
        """The filter with no clause on ``keys``."""
        return TagFilter(
            {k: v for k, v in self.include.items() if k not in keys},
            {k: v for k, v in self.exclude.items() if k not in keys},
        )

    def hash_query(self) -> str:
        """The non-scoring form (see :func:`hash_clause`); ``"*"`` when empty."""
        return conjoin(hash_clause(self.include), self.exclusions())

    def knn_query(self) -> str:
        """The vector leg's pre-filter (see :func:`knn_clause`); ``"*"`` when empty."""
        return conjoin(knn_clause(self.include), self.exclusions())

    def exclusions(self) -> str:
        """Every excluded value negated on its hashed field; ``"*"`` when none.

        By hash in every form: a TAG clause matches a value RediSearch trimmed ("edge" matches
        a stored "edge "), which a re-check drops from an inclusion's hits but could never
        bring back into an exclusion's."""
        return conjoin(*(f"-{hash_clause({k: v})}" for k, v in sorted(self.exclude.items())))


#: The one operator a filter value may be given as: ``{"not": value or values}``.
EXCLUDE_OPERATOR: Literal["not"] = "not"


def normalize_filter(
    metadata_filter: FilterSpec | None,
    *,
    allowed: Collection[str],
) -> TagFilter:
    """Validate a request's filter: key -> a value, values (any of them), or
    ``{"not": value or values}`` (none of them). Keys AND.

    Raises:
        InvalidRequest: unknown key or operator, empty or over-long value, empty list,
            non-string value.
    """
    include: dict[str, list[str]] = {}
    exclude: dict[str, list[str]] = {}
    for key in sorted(metadata_filter or {}):
        if key not in allowed:
            near = next((a for a in sorted(allowed) if a.casefold() == key.casefold()), None) or next(
                iter(difflib.get_close_matches(key, sorted(allowed), 1, 0.8)), None
            )
            meant = f" (did you mean {near!r}?)" if near else ""
            raise InvalidRequest(
                f"unknown metadata_filter key {key!r}{meant}; filterable keys: {', '.join(sorted(allowed))} "
                "(a deployment adds keys with index.extra_filter_keys, then one agentmemd reindex)"
            )
        raw = (metadata_filter or {})[key]
        into, where = include, f"metadata_filter[{key!r}]"
        if isinstance(raw, Mapping):
            if set(raw) != {EXCLUDE_OPERATOR}:
                raise InvalidRequest(
                    f"{where} is an object: its one key is {EXCLUDE_OPERATOR!r} (values none of which may "
                    f"match), not {', '.join(repr(str(k)) for k in raw) or 'nothing'}"
                )
            raw, into, where = raw[EXCLUDE_OPERATOR], exclude, f"{where}[{EXCLUDE_OPERATOR!r}]"
        into[key] = _values(key, raw, where)
    return TagFilter(include, exclude)


def filter_from_pairs(pairs: Iterable[str], *, strip: bool = False) -> dict[str, object]:
    """``key=value`` and ``key!=value`` texts (a command's options, a form's lines) as a
    request's filter: a key given twice takes any of its values, or with ``!=`` none of them.
    ``strip``: whitespace around a key and a value is dropped.

    Raises:
        InvalidRequest: a text without ``=`` or a key, or a key given with both ``=`` and ``!=``.
    """
    include: dict[str, list[str]] = {}
    exclude: dict[str, list[str]] = {}
    for raw in pairs:
        key, sep, value = raw.partition("=")
        into = include
        if strip:
            key = key.rstrip()
        if key.endswith("!"):
            key, into = key[:-1], exclude
        if strip:
            key, value = key.strip(), value.strip()
        if not sep or not key:
            raise InvalidRequest(f"a filter looks like key=value or key!=value, not {raw!r}")
        into.setdefault(key, []).append(value)
    both = sorted(set(include) & set(exclude))
    if both:
        raise InvalidRequest(f"filter key {both[0]!r} is given with both = and !=: give one or the other")
    out: dict[str, object] = {k: v[0] if len(v) == 1 else v for k, v in include.items()}
    out.update({k: {EXCLUDE_OPERATOR: v[0] if len(v) == 1 else v} for k, v in exclude.items()})
    return out


def _values(key: str, raw: object, where: str) -> list[str]:
    """One key's values, validated, in order and without repeats."""
    if isinstance(raw, str):
        values: list[object] = [raw]
    elif isinstance(raw, list | tuple):
        values = list(raw)
    else:
        raise InvalidRequest(f"{where} values must be strings or lists of strings")
    if not values:
        raise InvalidRequest(f"{where} is an empty list")
    if len(values) > MAX_VALUES_PER_KEY:
        raise InvalidRequest(f"{where} has more than {MAX_VALUES_PER_KEY} values")
    for value in values:
        if not isinstance(value, str):
            raise InvalidRequest(f"{where} values must be strings")
        if not value or len(value) > MAX_VALUE_LENGTH:
            raise InvalidRequest(f"{where} values must be 1..{MAX_VALUE_LENGTH} characters")
        if key == "kind" and value not in KINDS:
            # A closed set: a value outside it ("turn") would match nothing, in silence.
            raise InvalidRequest(f"{where} is {value!r}; kinds: {', '.join(KINDS)}")
    return list(dict.fromkeys(str(v) for v in values))


def tag_clause(flt: Mapping[str, Sequence[str]]) -> str:
    """``@environment:{prod|staging} @service:{billing\\-service}``; ``"*"`` when empty."""
    if not flt:
        return "*"
    return " ".join(f"@{key}:{{{'|'.join(escape_tag(v) for v in flt[key])}}}" for key in sorted(flt))


def hash_clause(flt: Mapping[str, Sequence[str]]) -> str:
    """The same filter over the NUMERIC hash fields; ``"*"`` when empty.

    Why: in RediSearch a TAG clause is scored like a term, which adds a document-length
    dependent bonus to every BM25 score (it cost 0.1 nDCG@10 on SciFact); a numeric range
    adds nothing. Hashes can collide, so text-leg hits are re-checked with ``matches``.
    """
    if not flt:
        return "*"
    clauses = []
    for key in sorted(flt):
        ranges = [f"@{hash_field(key)}:[{h} {h}]" for h in (value_hash(v) for v in flt[key])]
        clauses.append(ranges[0] if len(ranges) == 1 else "(" + " | ".join(ranges) + ")")
    return " ".join(clauses)


def _tag_safe(value: str) -> bool:
    # RediSearch trims TAG values when it indexes them and splits them at the separator, so
    # a value with edge whitespace or a separator can only be matched exactly by its hash.
    # Nor can a TAG query hold an ASCII control character, escaped or not (NUL, \x01, \x7f:
    # a syntax error): those values are matched by hash too.
    return value == value.strip() and TAG_SEPARATOR not in value and not any(ch < " " or ch == "\x7f" for ch in value)


def knn_clause(flt: Mapping[str, Sequence[str]]) -> str:
    """The filter for the vector leg's KNN pre-filter: TAG clauses, or hash ranges for a key
    with a value a TAG cannot match exactly; ``"*"`` when empty.

    Why not hashes throughout: a KNN filtered by a numeric range measured ~10% slower than
    by the same TAG clause (20,000 vectors here), and nothing is scored in this leg.
    """
    if not flt:
        return "*"
    parts = []
    for key in sorted(flt):
        one = {key: flt[key]}
        parts.append(tag_clause(one) if all(_tag_safe(v) for v in flt[key]) else hash_clause(one))
    return " ".join(parts)


def matches(tags: Mapping[str, str], flt: Mapping[str, Sequence[str]]) -> bool:
    """Whether a stored chunk's tag values satisfy the filter (exact string comparison)."""
    # A loop, not all() over a generator: called for every candidate of every leg.
    for key, values in flt.items():  # noqa: SIM110
        if tags.get(key) not in values:
            return False
    return True


def build_filter(
    metadata_filter: FilterSpec | None,
    *,
    allowed: Collection[str],
) -> str:
    """Validate and render a filter as TAG clauses (keys AND, values OR), ``not`` values
    negated on their hashed fields; ``"*"`` when empty.

    Raises:
        InvalidRequest: see ``normalize_filter``.
    """
    flt = normalize_filter(metadata_filter, allowed=allowed)
    return conjoin(tag_clause(flt.include), flt.exclusions())


def time_clause(since: float | None, until: float | None) -> str:
    """A NUMERIC range over chunk timestamps (epoch seconds, both ends inclusive); ``"*"``
    when both ends are open. A numeric range scores nothing in the BM25 leg (see
    ``hash_clause``) and is exact, so hits need no re-check beyond :func:`in_time`."""
    if since is None and until is None:
        return "*"
    low = "-inf" if since is None else repr(float(since))
    high = "+inf" if until is None else repr(float(until))
    return f"@timestamp:[{low} {high}]"


def in_time(timestamp: float | None, since: float | None, until: float | None, *, exact: bool = False) -> bool:
    """Whether a hit's timestamp lies in the range (a hit without one passes only an open range).

    ``exact``: the timestamp was read from the hash, not returned by a search (no slack).
    """
    if since is None and until is None:
        return True
    if timestamp is None:
        return False
    # RediSearch returns a NUMERIC field rounded to 12 significant digits (10 ms for epoch
    # seconds), while its range filter compares the exact value: without this slack the
    # re-check would drop hits the engine had rightly matched, at the range's ends.
    slack = 0.0 if exact else _RETURNED_PRECISION * abs(timestamp)
    return (since is None or timestamp >= since - slack) and (until is None or timestamp <= until + slack)


_RETURNED_PRECISION = 6e-12  # 12 significant digits: a relative error of at most 5e-12


def conjoin(*clauses: str) -> str:
    """Clauses ANDed, ``"*"`` (match all) dropped; ``"*"`` when nothing is left."""
    kept = [c for c in clauses if c != "*"]
    return " ".join(kept) if kept else "*"
