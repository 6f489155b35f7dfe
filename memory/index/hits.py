"""What a search leg returns: ids, the fields fusion and the filter re-check read, no text (pure).

A leg's candidates are twice the results asked for, and most are dropped by fusion: reading
and modelling their text and metadata cost 34.4 core-ms per query at ``top_k`` 50 against
11.7 at 5 (issue 24). So the legs return these hits, and only the fused winners are read
whole (``_Search.hydrate``), by the codec that reads every other chunk.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memory import keys
from memory.index.codec import _float_or_none, _int_or_none
from memory.schema import as_str

#: What every leg returns besides the filter's tags: ids, the time (``ts`` exact, ``timestamp``
#: for a chunk written before ``ts`` existed), the version (write markers) and the kind (a
#: transcript turn's own leg weights).
LEG_FIELDS = ("chunk_id", "doc_id", "kind", "ts", "timestamp", "version")


@dataclass(frozen=True, slots=True)
class LegHit:
    """One candidate of a leg: where it is stored and what fusion and the re-checks read.

    The attribute names are ``StoredChunk``'s, so the same checks (``memory.filters.matches``,
    ``in_time``, the write markers) read either.
    """

    key: str
    chunk_id: str
    doc_id: str
    kind: str
    tags: dict[str, str] = field(default_factory=dict)  # the filter's keys only (the tenant among them)
    idents: tuple[str, ...] = ()  # only from the identifier leg
    timestamp: float | None = None
    version: int | None = None
    generation: int | None = None


def leg_fields(tag_keys: Iterable[str], *, idents: bool = False) -> tuple[str, ...]:
    """The fields a leg asks for: :data:`LEG_FIELDS`, ``idents`` if it ranks by them, and the tags it re-checks."""
    return tuple(dict.fromkeys((*LEG_FIELDS, *(("idents",) if idents else ()), *tag_keys)))


def _pairs(raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return {as_str(k): v for k, v in raw.items()}
    items = list(raw or ())
    return {as_str(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)}


def search_rows(reply: Any) -> list[tuple[str, dict[str, Any]]]:
    """(key, returned fields) of each result of a raw ``FT.SEARCH`` reply, in order.

    RESP3 answers a map (``results``: each an ``id`` and its ``extra_attributes``); RESP2
    a flat list (the total, then each key and its field/value pairs).
    """
    if isinstance(reply, Mapping):
        top = _pairs(reply)
        rows = []
        for item in top.get("results") or ():
            entry = _pairs(item)
            rows.append((as_str(entry.get("id", "")), _pairs(entry.get("extra_attributes") or {})))
        return rows
    items = list(reply or ())[1:]
    return [(as_str(items[i]), _pairs(items[i + 1])) for i in range(0, len(items) - 1, 2)]


def leg_hit(key: str, values: Mapping[str, Any], tag_keys: Sequence[str]) -> LegHit:
    """A leg's hit from its key and returned fields (read as ``codec._stored`` reads them)."""
    ts = _float_or_none(values.get("ts"))
    raw_idents = values.get("idents")
    return LegHit(
        key=key,
        chunk_id=as_str(values.get("chunk_id", "")),
        doc_id=as_str(values.get("doc_id", "")),
        kind=as_str(values.get("kind", "")),
        tags={k: as_str(v) for k in tag_keys if (v := values.get(k)) is not None},
        idents=tuple(as_str(raw_idents).split()) if raw_idents is not None else (),
        timestamp=ts if ts is not None else _float_or_none(values.get("timestamp")),
        version=_int_or_none(values.get("version")),
        generation=keys.key_generation(key),
    )
