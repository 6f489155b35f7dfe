"""What a search leg returns: ids, the fields fusion and the filter re-check read, no text (pure).

A leg's candidates are twice the results asked for, and most are dropped by fusion: reading
and modelling their text and metadata would make a deep query cost several times a shallow
one ([decision 0027](../../docs/decisions/0027-legs-return-ids-winners-read-whole.md)). So the
legs return these hits, and only the fused winners are read whole (``_Search.hydrate``), by
the codec that reads every other chunk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from memory import keys
from memory.chunking import chunk_doc
from memory.index.codec import _float_or_none, _int_or_none, _text
from memory.records import StoredChunk
from memory.schema import as_str

#: What every leg asks Redis for besides the filter's tags: the time (``ts`` exact,
#: ``timestamp`` for a chunk written before ``ts`` existed), the version (write markers) and
#: the kind (a transcript turn's own leg weights), a turn's speakers (the speaker list,
#: ``memory.speakers``; absent for documents). The chunk id, its doc and the tenant are
#: read from the key (``keys.chunk_key_parts``): each field returned costs Redis and this
#: client a few microseconds per candidate, and a leg at ``top_k`` 50 returns 100.
LEG_FIELDS = ("kind", "ts", "timestamp", "version", "speaker")

#: The tag every leg's hit carries from its key, never asked for.
TENANT = "tenant"


class LegHit(NamedTuple):
    """One candidate of a leg: where it is stored and what fusion and the re-checks read.

    The attribute names are ``StoredChunk``'s, so the same checks (``memory.filters.matches``,
    ``in_time``, the write markers) read either. A tuple: a leg builds up to hundreds per
    query, and a frozen dataclass took four times as long to build.
    """

    key: str
    chunk_id: str
    kind: str
    tags: dict[str, str]  # the filter's keys only (the tenant among them)
    idents: tuple[str, ...]  # only from the identifier leg
    timestamp: float | None
    version: int | None
    generation: int | None
    speaker: str = ""  # a transcript turn's speakers (memory.speakers), for the speaker list

    @property
    def doc_id(self) -> str:
        """The chunk's doc, from its id: read only where a write marker may hide it, and by the explorer."""
        return chunk_doc(self.chunk_id)


def leg_fields(tag_keys: Sequence[str], *, idents: bool = False) -> tuple[str, ...]:
    """The fields a leg asks for: :data:`LEG_FIELDS`, ``idents`` if it ranks by them, and the
    tags it re-checks but the tenant (read from the key)."""
    wanted = (*LEG_FIELDS, *(("idents",) if idents else ()), *tag_keys)
    return tuple(f for f in dict.fromkeys(wanted) if f != TENANT)


class _KeyParts:
    """The generation, tenant and chunk id of each chunk's key, the generation's prefix
    remembered (one leg's keys share it). Another key gives no generation and empty ids: its
    hit fails the tenant's re-check (as does a hit whose hash came back with no fields, gone
    since it was found: see ``leg_hits``)."""

    def __init__(self) -> None:
        self._prefix = ""
        self._generation: int | None = None

    def __call__(self, key: str) -> tuple[int | None, str, str]:
        if not (self._prefix and key.startswith(self._prefix)):
            parts = keys.chunk_key_parts(key)
            if parts is None:
                return None, "", ""
            self._prefix, self._generation = parts[0], parts[1]
        tenant, colon, chunk = key[len(self._prefix) :].partition(":")
        return (self._generation, tenant, chunk) if colon else (None, "", "")


def _hit(
    key: str, get: Any, tags: Sequence[tuple[str, Any]], names: Sequence[Any], parts: _KeyParts, tenant_tag: bool
) -> LegHit:
    # ``names``: the field names as the reply spells them (text from a client that decodes).
    kind, ts, timestamp, version, speaker, idents = (get(n) for n in names)
    generation, tenant, chunk_id = parts(key)
    exact = _float_or_none(ts)
    values = {k: as_str(v) for k, n in tags if (v := get(n)) is not None}
    if tenant_tag and tenant:
        values[TENANT] = tenant
    return LegHit(
        key,
        chunk_id,
        _text(kind),
        values,
        tuple(as_str(idents).split()) if idents is not None else (),
        exact if exact is not None else _float_or_none(timestamp),
        _int_or_none(version),
        generation,
        as_str(speaker) if speaker is not None else "",
    )


def _number(value: bytes | None, kind: type[float] | type[int]) -> Any:
    try:
        return None if value is None else kind(value)
    except ValueError:
        return None


def _raw_hit(key: str, get: Any, tags: Sequence[tuple[str, bytes]], parts: _KeyParts, tenant_tag: bool) -> LegHit:
    # The same reading as _hit, of bytes (what the daemon's connection returns), spelled out:
    # up to 200 hits per query, and the generic reading was half of a leg's client-side CPU.
    ts = _number(get(b"ts"), float)
    idents = get(b"idents")
    speaker = get(b"speaker")
    generation, tenant, chunk_id = parts(key)
    values = {}
    for k, n in tags:  # a loop: a comprehension's own frame cost more than its one or two tags
        if (v := get(n)) is not None:
            values[k] = v.decode()
    if tenant_tag and tenant:
        values[TENANT] = tenant
    return LegHit(
        key,
        chunk_id,
        (get(b"kind") or b"").decode(),
        values,
        tuple(idents.decode().split()) if idents is not None else (),
        ts if ts is not None else _number(get(b"timestamp"), float),
        _number(get(b"version"), int),
        generation,
        speaker.decode() if speaker is not None else "",
    )


def leg_hits(reply: Any, tag_keys: Sequence[str]) -> list[LegHit]:
    """The hits of a raw ``FT.SEARCH`` reply, in its order, as ``codec._stored`` would read them
    (the ids and the tenant from each key, see :data:`LEG_FIELDS`). A hit that came back with
    no fields (its hash deleted since the engine found it) carries no tenant, as it carried
    none when the tenant was read from the hash: the tenant's re-check drops it.

    RESP3 answers a map (``results``: each an ``id`` and its ``extra_attributes``); RESP2 a
    flat list (the total, then each key and its field/value pairs). Names and values come
    back as bytes, or as text from a client that decodes responses.
    """
    parts = _KeyParts()
    fields = (*LEG_FIELDS, "idents")
    asked = [k for k in tag_keys if k != TENANT]
    tenant_tag = TENANT in tag_keys
    if isinstance(reply, Mapping) and b"results" in reply:
        raw_tags = [(k, k.encode()) for k in asked]
        out = []
        for item in reply[b"results"] or ():
            key = item[b"id"].decode()
            attrs = item.get(b"extra_attributes") or {}
            out.append(_raw_hit(key, attrs.get, raw_tags, parts, tenant_tag and bool(attrs)))
        return out
    tags = [(k, k) for k in asked]
    out = []
    if isinstance(reply, Mapping):
        for item in reply.get("results") or ():
            attrs = item.get("extra_attributes") or {}
            out.append(_hit(as_str(item["id"]), attrs.get, tags, fields, parts, tenant_tag and bool(attrs)))
        return out
    items = list(reply or ())[1:]
    for i in range(0, len(items) - 1, 2):
        flat = items[i + 1] or ()
        values = {as_str(flat[j]): flat[j + 1] for j in range(0, len(flat) - 1, 2)}
        out.append(_hit(as_str(items[i]), values.get, tags, fields, parts, tenant_tag and bool(values)))
    return out


def reply_distances(reply: Any) -> list[float]:
    """Each hit's ``vector_distance`` in a raw KNN ``FT.SEARCH`` reply that returned it, in its
    order (``leg_hits``'s shapes); a hit without one counts as the farthest (2, cosine's most)."""
    found: list[Any] = []
    if isinstance(reply, Mapping):
        for item in reply.get(b"results", reply.get("results")) or ():
            attrs = item.get(b"extra_attributes", item.get("extra_attributes")) or {}
            found.append(attrs.get(b"vector_distance", attrs.get("vector_distance")))
    else:
        items = list(reply or ())[1:]
        for i in range(0, len(items) - 1, 2):
            flat = items[i + 1] or ()
            found.append({as_str(flat[j]): flat[j + 1] for j in range(0, len(flat) - 1, 2)}.get("vector_distance"))
    distances = [_float_or_none(d) for d in found]
    return [2.0 if d is None else d for d in distances]


def whole_chunks(
    rows: Sequence[tuple[str, Sequence[Any] | None]], fields: Sequence[str], tag_keys: Sequence[str]
) -> list[StoredChunk | None]:
    """The chunks of ``(key, values of fields)`` rows read back from their hashes (None for a
    row of a hash that is gone), exactly as ``codec._stored`` reads a search hit holding the
    fields that are there: the winners read after fusion are what the legs would have returned."""
    at = {f: i for i, f in enumerate(fields)}
    i_chunk, i_text, i_doc, i_source, i_kind = at["chunk_id"], at["text"], at["doc_id"], at["source"], at["kind"]
    i_meta, i_idents, i_ts, i_timestamp, i_version, i_speaker, i_section = (
        at["metadata"],
        at["idents"],
        at["ts"],
        at["timestamp"],
        at["version"],
        at["speaker"],
        at["section"],
    )
    tags = [(k, at[k]) for k in tag_keys]
    parts = _KeyParts()
    out: list[StoredChunk | None] = []
    for key, raw in rows:
        if not raw or raw[i_chunk] is None:
            out.append(None)
            continue
        # Each value decoded once: the winners' fields are read by name more than once.
        row = [None if v is None else v.decode() if isinstance(v, bytes) else str(v) for v in raw]
        meta = row[i_meta]
        try:
            metadata = json.loads(meta) if meta is not None else {}
        except ValueError:
            metadata = {}
        ts = _float_or_none(row[i_ts])
        idents = row[i_idents]
        out.append(
            StoredChunk(
                chunk_id=row[i_chunk] or "",
                text=row[i_text] or "",
                doc_id=row[i_doc] or "",
                source=row[i_source] or "",
                kind=row[i_kind] or "",
                metadata=metadata if isinstance(metadata, dict) else {},
                tags={k: v for k, i in tags if (v := row[i]) is not None},
                idents=tuple(idents.split()) if idents is not None else (),
                timestamp=ts if ts is not None else _float_or_none(row[i_timestamp]),
                version=_int_or_none(row[i_version]),
                generation=parts(key)[0],
                speaker=row[i_speaker] or "",
                section=row[i_section] or "",
            )
        )
    return out
