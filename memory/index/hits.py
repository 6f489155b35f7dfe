"""What a search leg returns: ids, the fields fusion and the filter re-check read, no text (pure).

A leg's candidates are twice the results asked for, and most are dropped by fusion: reading
and modelling their text and metadata cost 34.4 core-ms per query at ``top_k`` 50 against
11.7 at 5 (issue 24). So the legs return these hits, and only the fused winners are read
whole (``_Search.hydrate``), by the codec that reads every other chunk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from memory import keys
from memory.index.codec import _float_or_none, _int_or_none
from memory.records import StoredChunk
from memory.schema import as_str

#: What every leg returns besides the filter's tags: ids, the time (``ts`` exact, ``timestamp``
#: for a chunk written before ``ts`` existed), the version (write markers) and the kind (a
#: transcript turn's own leg weights).
LEG_FIELDS = ("chunk_id", "doc_id", "kind", "ts", "timestamp", "version")


class LegHit(NamedTuple):
    """One candidate of a leg: where it is stored and what fusion and the re-checks read.

    The attribute names are ``StoredChunk``'s, so the same checks (``memory.filters.matches``,
    ``in_time``, the write markers) read either. A tuple: a leg builds up to hundreds per
    query, and a frozen dataclass took four times as long to build.
    """

    key: str
    chunk_id: str
    doc_id: str
    kind: str
    tags: dict[str, str]  # the filter's keys only (the tenant among them)
    idents: tuple[str, ...]  # only from the identifier leg
    timestamp: float | None
    version: int | None
    generation: int | None


def leg_fields(tag_keys: Sequence[str], *, idents: bool = False) -> tuple[str, ...]:
    """The fields a leg asks for: :data:`LEG_FIELDS`, ``idents`` if it ranks by them, and the tags it re-checks."""
    return tuple(dict.fromkeys((*LEG_FIELDS, *(("idents",) if idents else ()), *tag_keys)))


def _text(value: Any) -> str:
    return "" if value is None else as_str(value)


class _Generations:
    """The generation of each key, by its ``<name>:g<N>:chunk:`` prefix: one leg's keys share it."""

    def __init__(self) -> None:
        self._prefix = ""
        self._generation: int | None = None

    def __call__(self, key: str) -> int | None:
        if self._prefix and key.startswith(self._prefix):
            return self._generation
        generation = keys.key_generation(key)
        if generation is not None:
            self._prefix, self._generation = keys.chunk_prefix(key.split(":", 1)[0], generation), generation
        return generation


def _hit(key: str, get: Any, tags: Sequence[tuple[str, Any]], names: Sequence[Any], generation: int | None) -> LegHit:
    # ``names``: the field names as the reply spells them (text from a client that decodes).
    chunk_id, doc_id, kind, ts, timestamp, version, idents = (get(n) for n in names)
    exact = _float_or_none(ts)
    return LegHit(
        key,
        _text(chunk_id),
        _text(doc_id),
        _text(kind),
        {k: as_str(v) for k, n in tags if (v := get(n)) is not None},
        tuple(as_str(idents).split()) if idents is not None else (),
        exact if exact is not None else _float_or_none(timestamp),
        _int_or_none(version),
        generation,
    )


def _number(value: bytes | None, kind: type[float] | type[int]) -> Any:
    try:
        return None if value is None else kind(value)
    except ValueError:
        return None


def _raw_hit(key: str, get: Any, tags: Sequence[tuple[str, bytes]], generation: int | None) -> LegHit:
    # The same reading as _hit, of bytes (what the daemon's connection returns), spelled out:
    # up to 200 hits per query, and the generic reading was half of a leg's client-side CPU.
    ts = _number(get(b"ts"), float)
    idents = get(b"idents")
    values = {}
    for k, n in tags:  # a loop: a comprehension's own frame cost more than its one or two tags
        if (v := get(n)) is not None:
            values[k] = v.decode()
    return LegHit(
        key,
        (get(b"chunk_id") or b"").decode(),
        (get(b"doc_id") or b"").decode(),
        (get(b"kind") or b"").decode(),
        values,
        tuple(idents.decode().split()) if idents is not None else (),
        ts if ts is not None else _number(get(b"timestamp"), float),
        _number(get(b"version"), int),
        generation,
    )


def leg_hits(reply: Any, tag_keys: Sequence[str]) -> list[LegHit]:
    """The hits of a raw ``FT.SEARCH`` reply, in its order, as ``codec._stored`` would read them.

    RESP3 answers a map (``results``: each an ``id`` and its ``extra_attributes``); RESP2 a
    flat list (the total, then each key and its field/value pairs). Names and values come
    back as bytes, or as text from a client that decodes responses.
    """
    generation_of = _Generations()
    fields = (*LEG_FIELDS, "idents")
    if isinstance(reply, Mapping) and b"results" in reply:
        raw_tags = [(k, k.encode()) for k in tag_keys]
        out = []
        for item in reply[b"results"] or ():
            key = item[b"id"].decode()
            out.append(_raw_hit(key, (item.get(b"extra_attributes") or {}).get, raw_tags, generation_of(key)))
        return out
    if isinstance(reply, Mapping):
        tags = [(k, k) for k in tag_keys]
        out = []
        for item in reply.get("results") or ():
            key = as_str(item["id"])
            out.append(_hit(key, (item.get("extra_attributes") or {}).get, tags, fields, generation_of(key)))
        return out
    items = list(reply or ())[1:]
    out = []
    for i in range(0, len(items) - 1, 2):
        flat = items[i + 1] or ()
        values = {as_str(flat[j]): flat[j + 1] for j in range(0, len(flat) - 1, 2)}
        key = as_str(items[i])
        out.append(_hit(key, values.get, [(k, k) for k in tag_keys], fields, generation_of(key)))
    return out


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def whole_chunks(
    rows: Sequence[tuple[str, Sequence[Any] | None]], fields: Sequence[str], tag_keys: Sequence[str]
) -> list[StoredChunk | None]:
    """The chunks of ``(key, values of fields)`` rows read back from their hashes (None for a
    row of a hash that is gone), exactly as ``codec._stored`` reads a search hit holding the
    fields that are there: the winners read after fusion are what the legs would have returned."""
    at = {f: i for i, f in enumerate(fields)}
    i_chunk, i_text, i_doc, i_source, i_kind = at["chunk_id"], at["text"], at["doc_id"], at["source"], at["kind"]
    i_meta, i_idents, i_ts, i_timestamp, i_version = (
        at["metadata"],
        at["idents"],
        at["ts"],
        at["timestamp"],
        at["version"],
    )
    tags = [(k, at[k]) for k in tag_keys]
    generation_of = _Generations()
    out: list[StoredChunk | None] = []
    for key, row in rows:
        if not row or row[i_chunk] is None:
            out.append(None)
            continue
        try:
            metadata = json.loads(_str(row[i_meta])) if row[i_meta] is not None else {}
        except ValueError:
            metadata = {}
        ts = _float_or_none(row[i_ts])
        idents = row[i_idents]
        out.append(
            StoredChunk(
                chunk_id=_str(row[i_chunk]),
                text="" if row[i_text] is None else _str(row[i_text]),
                doc_id="" if row[i_doc] is None else _str(row[i_doc]),
                source="" if row[i_source] is None else _str(row[i_source]),
                kind="" if row[i_kind] is None else _str(row[i_kind]),
                metadata=metadata if isinstance(metadata, dict) else {},
                tags={k: _str(row[i]) for k, i in tags if row[i] is not None},
                idents=tuple(_str(idents).split()) if idents is not None else (),
                timestamp=ts if ts is not None else _float_or_none(row[i_timestamp]),
                version=_int_or_none(row[i_version]),
                generation=generation_of(key),
            )
        )
    return out
