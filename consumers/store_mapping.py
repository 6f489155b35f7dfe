"""How a LangGraph store item maps onto a contract document, and back (pure; no LangGraph here).

An item ``(namespace, key) -> value`` is one document:

- ``source`` is the namespace, ``lgstore:`` then each label percent-encoded and followed by
  ``/`` (``("users", "u1")`` is ``lgstore:users/u1/``). ``source`` is filterable on every
  deployment, so a search within a namespace filters inside both legs, before fusion; the
  trailing ``/`` makes a prefix of it a namespace prefix (``users/`` never matches
  ``users2/``).
- ``doc_id`` is the source then the key, encoded the same way, or (past 1,024 characters) the
  source's root and a SHA-256 of both: deterministic, so a put replaces and a delete finds it.
- ``metadata`` holds the value as JSON (in pieces of at most 4,096 characters: the contract's
  limit for a metadata string), the namespace, the key and when it was created, plus the
  value's string fields that the deployment can filter on (``filter_keys``).
- ``content``, what the daemon indexes (BM25 and vector), is the text of the value's indexed
  fields, as LangGraph's ``index`` config picks them.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote

from consumers.fields import MAX_DOC_ID_CHARS
from memory.errors import InvalidRequest
from memory.filters import EXCLUDE_OPERATOR
from memory.filters import MAX_VALUE_LENGTH as MAX_SOURCE_CHARS  # a source is filtered on

#: Root of every store document's ``source`` (and, so, ``doc_id``).
ROOT = "lgstore:"
#: A metadata string's limit, and how many pieces of JSON a value may take.
PIECE_CHARS = 4096
MAX_PIECES = 56
#: Metadata keys the store writes itself.
NAMESPACE_KEY, KEY_KEY, CREATED_KEY, PIECES_KEY = "lg_namespace", "lg_key", "lg_created_at", "lg_pieces"
#: Value fields copied into filterable metadata by default: the built-in keys a value may carry.
DEFAULT_FILTER_KEYS: tuple[str, ...] = ("environment", "service", "agent_id", "session_id")
_NOT_PROMOTED = frozenset({"kind", "doc_id", "source"})


def _label(text: str) -> str:
    # Everything but letters, digits and _.-~ is escaped: no "/" (the separator) or NUL can
    # remain, and the result is plain ASCII, safe as a TAG value and in a filter expression.
    return quote(text, safe="")


def namespace_source(namespace: Sequence[str]) -> str:
    """The ``source`` of a namespace's documents, which is also its prefix filter.

    Raises:
        InvalidRequest: a string, not a tuple of labels (it would be read letter by letter); the
            encoded namespace is longer than a filter value may be (512).
    """
    if isinstance(namespace, str):
        raise InvalidRequest(
            f"a namespace is a tuple of labels, ({namespace[:64]!r},), not the string {namespace[:64]!r}"
        )
    source = ROOT + "".join(_label(label) + "/" for label in namespace)
    if len(source) > MAX_SOURCE_CHARS:
        raise InvalidRequest(f"namespace {tuple(namespace)!r} encodes to {len(source)} characters, over 512")
    return source


def source_namespace(source: str) -> tuple[str, ...] | None:
    """The namespace a store document's ``source`` names; None for any other source."""
    if not source.startswith(ROOT) or not source.endswith("/"):
        return None
    body = source[len(ROOT) : -1]
    return tuple(unquote(part) for part in body.split("/")) if body else ()


def item_doc_id(namespace: Sequence[str], key: str) -> str:
    """The deterministic ``doc_id`` of an item."""
    source = namespace_source(namespace)
    doc_id = source + _label(key)
    if len(doc_id) <= MAX_DOC_ID_CHARS:
        return doc_id
    return f"{ROOT}sha256:{hashlib.sha256(doc_id.encode()).hexdigest()}"


def value_metadata(
    namespace: Sequence[str],
    key: str,
    value: Mapping[str, Any],
    *,
    created_at: datetime,
    filter_keys: Collection[str] = DEFAULT_FILTER_KEYS,
) -> dict[str, str | int]:
    """The document metadata that carries an item.

    Raises:
        InvalidRequest: the value is no JSON, or its JSON is over ~229 KB (56 pieces of 4,096).
    """
    try:
        text = json.dumps(dict(value), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"the value of {key!r} is not JSON: {exc}") from exc
    pieces = [text[i : i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)] or ["{}"]
    if len(pieces) > MAX_PIECES:
        limit = MAX_PIECES * PIECE_CHARS
        raise InvalidRequest(f"the value of {key!r} is {len(text):,} characters of JSON, over {limit:,}")
    meta: dict[str, str | int] = {
        NAMESPACE_KEY: json.dumps(list(namespace), ensure_ascii=False),
        KEY_KEY: key,
        CREATED_KEY: created_at.astimezone(UTC).isoformat(),
        PIECES_KEY: len(pieces),
    }
    meta.update({f"lg_v{i}": piece for i, piece in enumerate(pieces)})
    for field in filter_keys:
        if field not in _NOT_PROMOTED and isinstance(v := value.get(field), str) and 0 < len(v) <= PIECE_CHARS:
            meta[field] = v
    return meta


def is_item(metadata: Mapping[str, Any] | None) -> bool:
    """Whether a document's metadata carries a store item."""
    return bool(metadata) and all(k in metadata for k in (NAMESPACE_KEY, KEY_KEY, PIECES_KEY))  # type: ignore[operator]


def item_parts(metadata: Mapping[str, Any]) -> tuple[tuple[str, ...], str, dict[str, Any], datetime | None]:
    """Namespace, key, value and creation time from a store document's metadata.

    Raises:
        ValueError: the metadata is no store item's.
    """
    pieces = int(metadata[PIECES_KEY])
    value = json.loads("".join(str(metadata[f"lg_v{i}"]) for i in range(pieces)))
    namespace = tuple(json.loads(str(metadata[NAMESPACE_KEY])))
    created = metadata.get(CREATED_KEY)
    return namespace, str(metadata[KEY_KEY]), value, datetime.fromisoformat(created) if created else None


#: What a LangGraph filter pushes down: a field's string, or ``{"not": string}``.
PushedFilter = dict[str, str | dict[str, str]]


def pushdown_filter(flt: Mapping[str, Any] | None, filter_keys: Collection[str]) -> PushedFilter:
    """The part of a LangGraph ``filter`` the daemon can apply before fusion: equality or
    inequality (``$ne``) to a string, for fields copied into filterable metadata. Only string
    values are copied, so a stored value equals the string exactly when the item's field does,
    and an item without the field passes ``$ne`` in both. The whole filter is still applied
    afterwards (``matches_filter``); this only narrows what the daemon returns."""
    out: PushedFilter = {}
    for field, want in (flt or {}).items():
        negated = isinstance(want, dict) and set(want) == {"$ne"}
        if isinstance(want, dict) and len(want) == 1 and set(want) <= {"$eq", "$ne"}:
            want = next(iter(want.values()))
        if field in filter_keys and field not in _NOT_PROMOTED and isinstance(want, str) and 0 < len(want) <= 512:
            out[field] = {EXCLUDE_OPERATOR: want} if negated else want
    return out


def matches_filter(value: Mapping[str, Any], flt: Mapping[str, Any] | None) -> bool:
    """Whether a value passes a LangGraph ``filter``, exactly as ``InMemoryStore`` decides it
    (nested dicts, lists element by element, ``$eq $ne $gt $gte $lt $lte``).

    Raises:
        ValueError: an operator other than those.
    """
    return all(_compare(value.get(field), want) for field, want in (flt or {}).items())


def _compare(have: Any, want: Any) -> bool:
    if isinstance(want, dict):
        if any(k.startswith("$") for k in want):
            return all(_operator(have, op, arg) for op, arg in want.items())
        return isinstance(have, dict) and all(_compare(have.get(k), v) for k, v in want.items())
    if isinstance(want, list | tuple):
        return (
            isinstance(have, list | tuple)
            and len(have) == len(want)
            and all(_compare(h, w) for h, w in zip(have, want, strict=True))
        )
    return bool(have == want)


def _operator(have: Any, op: str, arg: Any) -> bool:
    if op == "$eq":
        return bool(have == arg)
    if op == "$ne":
        return bool(have != arg)
    if op in ("$gt", "$gte", "$lt", "$lte"):
        try:
            a, b = float(have), float(arg)
        except (TypeError, ValueError):
            return False  # a missing or non-numeric field is no match (InMemoryStore raises)
        if math.isnan(a) or math.isnan(b):
            return False
        return {"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[op]
    raise ValueError(f"unsupported filter operator {op!r}")


def namespace_matches(namespace: tuple[str, ...], match_type: str, path: Sequence[str]) -> bool:
    """A ``MatchCondition``: ``path`` (``*`` matching any label) as a prefix or suffix."""
    if len(namespace) < len(path):
        return False
    labels = namespace if match_type == "prefix" else namespace[::-1]
    pattern = path if match_type == "prefix" else list(path)[::-1]
    return all(p == "*" or n == p for n, p in zip(labels, pattern, strict=False))


def literal_prefix(path: Sequence[str]) -> tuple[str, ...]:
    """The labels of a prefix pattern before its first wildcard: what a listing can narrow by."""
    out: list[str] = []
    for label in path:
        if label == "*":
            break
        out.append(label)
    return tuple(out)
