"""The chunk hash codec: what a chunk's Redis hash holds, written and read back (pure).

A hash holds the chunk's text, its analyzed ``terms`` and ``idents`` (``memory.text``,
``memory.identifiers``), its context, tags (each also hashed into a NUMERIC field), metadata
as JSON, timestamps and the float32 vector. Reads turn a search hit back into a ``StoredChunk``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from memory import keys
from memory.chunking import join_chunks
from memory.conversation import date_words, matching_terms
from memory.filters import OWN_TAG_KEYS, hash_field, tag_values, value_hash
from memory.identifiers import identifiers, with_metadata_identifiers
from memory.records import ChunkRecord, StoredChunk
from memory.schema import as_str
from memory.speakers import turn_speakers
from memory.text import index_terms

_RETURN_FIELDS = (
    "chunk_id",
    "text",
    "doc_id",
    "source",
    "kind",
    "metadata",
    "idents",
    "timestamp",
    "ts",
    "version",
    "speaker",
    "section",
)

#: Read with a doc's chunks when the doc is read back whole (``memory.chunking.join_chunks``).
JOIN_FIELDS = ("chunk_start", "chunk_gap", "chunk_tail")


@dataclass(frozen=True, slots=True)
class TurnEntry:
    """A stored chunk of a transcript turn: its id, text, context and kind."""

    chunk_id: str
    text: str
    context: str
    context_vec: str
    kind: str
    timestamp: float


@dataclass(frozen=True, slots=True)
class Analysis:
    """A chunk text's BM25 terms and identifiers, as the ``terms`` and ``idents`` fields hold them."""

    terms: str
    idents: str


@functools.lru_cache(maxsize=8192)
def _analyzed(text: str, terms: Callable[[str], str], idents: Callable[[str], list[str]]) -> Analysis:
    # Kept for the texts seen lately: an edit's unchanged chunks (a 200-chunk document's edit
    # spent 0.17 s analyzing texts it had analyzed before). lru_cache is safe across threads;
    # the analyzers are part of the key, so another analysis never answers from this one's.
    return Analysis(terms(text), " ".join(idents(text)))


def _analysis(text: str) -> Analysis:
    return _analyzed(text, index_terms, identifiers)


def analyze(texts: Sequence[str]) -> list[Analysis]:
    """The text analysis of each chunk (pure CPU: ~2.5 ms per 250-token chunk not seen lately).

    Ingestion runs it while the batch is being embedded, so that writing a batch after its
    vectors arrive costs Redis round trips only.
    """
    return [_analysis(t) for t in texts]


def turn_terms(text: str, context: str, timestamp: float) -> str:
    """The ``terms`` of a transcript turn's chunk: its own terms weighted up, the day it was said,
    then its neighbours' (``memory.conversation``)."""
    return matching_terms(_analysis(text).terms, [index_terms(date_words(timestamp)), index_terms(context)])


def doc_terms(own_terms: str, context: str) -> str:
    """The ``terms`` of a document's chunk: its own, then those of the headings it falls under
    (``memory.headings``), once."""
    return f"{own_terms} {index_terms(context)}".strip() if context else own_terms


def analyze_records(chunks: Sequence[ChunkRecord]) -> list[Analysis]:
    """:func:`analyze` for chunk records: a transcript turn's terms also hold its context's, a
    document chunk's its headings', and every chunk's identifiers those of its metadata and a
    document's those of its file name (``with_metadata_identifiers``)."""
    out = analyze([c.text for c in chunks])
    return [
        Analysis(
            turn_terms(c.text, c.context, c.timestamp) if c.kind == "transcript" else doc_terms(a.terms, c.context),
            with_metadata_identifiers(a.idents, c.metadata, (c.doc_id, c.source) if c.kind == "document" else ()),
        )
        for a, c in zip(out, chunks, strict=True)
    ]


def _reanalyzed(mapping: dict[Any, Any]) -> dict[Any, Any]:
    """A stored chunk hash with its ``terms`` and ``idents`` analyzed again from its ``text``."""
    fields = {as_str(k): k for k in mapping}
    if "text" not in fields:
        return mapping
    text = as_str(mapping[fields["text"]])
    analysis = analyze([text])[0]
    out = dict(mapping)
    terms = analysis.terms
    context = as_str(mapping[fields["context"]]) if "context" in fields else ""
    if "kind" in fields and as_str(mapping[fields["kind"]]) == "transcript":
        terms = turn_terms(text, context, float(as_str(mapping[fields["ts"]])) if "ts" in fields else 0.0)
    elif "kind" in fields and as_str(mapping[fields["kind"]]) == "document":
        terms = doc_terms(terms, context)
    out[fields.get("terms", "terms")] = terms
    metadata = _metadata_of(mapping[fields["metadata"]]) if "metadata" in fields else None
    kind = as_str(mapping[fields["kind"]]) if "kind" in fields else ""
    names = tuple(as_str(mapping[fields[k]]) for k in ("doc_id", "source") if k in fields) if kind == "document" else ()
    out[fields.get("idents", "idents")] = with_metadata_identifiers(analysis.idents, metadata or {}, names)
    return out


def _refielded(mapping: dict[Any, Any], filter_keys: Sequence[str]) -> dict[Any, Any]:
    """A stored chunk hash with its filter fields set again from its stored ``metadata`` for
    ``filter_keys``, as ingestion would set them (``memory.filters.tag_values``): a value
    for each key its metadata holds, none for the others (nor for keys no longer
    filterable). A hash without stored metadata keeps the fields it has."""
    fields = {as_str(k): k for k in mapping}
    metadata = _metadata_of(mapping[fields["metadata"]]) if "metadata" in fields else None
    if metadata is None:
        return mapping
    # Every filter field but the chunk's own (a TAG with its hashed twin), of these keys or of
    # keys no longer filterable, goes: a replay writes only those these keys give values.
    kept = {"tenant", *OWN_TAG_KEYS}
    dropped = {f for f in fields if hash_field(f) in fields and f not in kept}
    dropped |= {hash_field(f) for f in dropped}
    out = {k: v for k, v in mapping.items() if as_str(k) not in dropped}
    for key, value in tag_values(metadata, filter_keys).items():
        out[key] = value
        out[hash_field(key)] = value_hash(value)
    return out


def _respoken(hashes: list[dict[Any, Any]]) -> list[dict[Any, Any]]:
    """A turn's stored chunk hashes with the ``speaker`` field ingestion writes now
    (``memory.speakers``), from the turn's first chunk and its stored role and agent; any
    other doc's hashes as they are."""
    if not hashes:
        return hashes
    named = [{as_str(k): v for k, v in h.items()} for h in hashes]
    if any(as_str(n.get("kind", b"")) != "transcript" for n in named):
        return hashes
    first = min(named, key=lambda n: int(as_str(n.get("position", b"0"))))
    metadata = _metadata_of(first.get("metadata", b"{}"))
    if metadata is None:
        return hashes
    field = turn_speakers(as_str(first.get("text", b"")), metadata)
    out = []
    for h in hashes:
        kept = {k: v for k, v in h.items() if as_str(k) != "speaker"}
        if field:
            kept["speaker"] = field
        out.append(kept)
    return out


def _record_mapping(rec: ChunkRecord, vector: np.ndarray, analysis: Analysis) -> dict[str, Any]:
    mapping: dict[str, Any] = {
        "chunk_id": rec.chunk_id,
        "doc_id": rec.doc_id,
        "position": rec.position,
        "text": rec.text,
        "terms": analysis.terms,
        "idents": analysis.idents,
        "context": rec.context,
        "context_vec": rec.context_vec,
        "kind": rec.kind,
        "source": rec.source,
        "version": rec.version,
        "timestamp": rec.timestamp,
        # Not in the schema: RediSearch returns the NUMERIC field rounded to 12 significant
        # digits (10 ms of an epoch timestamp), while this hash field comes back as written.
        "ts": repr(float(rec.timestamp)),
        "metadata": json.dumps(rec.metadata, sort_keys=True),
        "vector": np.asarray(vector, dtype=np.float32).tobytes(),
    }
    if rec.vector_key:
        mapping["vkey"] = rec.vector_key
    if rec.speaker:  # not in the schema: read back with the hit, for the speaker list
        mapping["speaker"] = rec.speaker
    if rec.kind == "document" and rec.context:  # not in the schema either: a result names its section
        mapping["section"] = rec.context
    mapping["chunk_start"] = rec.start  # these not in the schema either: read to join a doc's chunks
    if rec.gap:
        mapping["chunk_gap"] = rec.gap
    if rec.tail:
        mapping["chunk_tail"] = rec.tail
    if rec.fence:
        mapping["chunk_fence"] = rec.fence
    for key, value in {**rec.tags, "tenant": rec.tenant}.items():
        mapping[key] = value
        mapping[hash_field(key)] = value_hash(value)
    return mapping


def _metadata_of(raw: Any) -> dict[str, Any] | None:
    """A stored ``metadata`` field as the object it was written as; None when it is missing or
    is no JSON object."""
    if raw is None:
        return None
    try:
        metadata = json.loads(as_str(raw))
    except ValueError:
        return None
    return metadata if isinstance(metadata, dict) else None


def _stored(doc: Any, tag_keys: Sequence[str]) -> StoredChunk:
    metadata = _metadata_of(getattr(doc, "metadata", "{}")) or {}
    return StoredChunk(
        chunk_id=as_str(getattr(doc, "chunk_id", "")),
        text=as_str(getattr(doc, "text", "")),
        doc_id=as_str(getattr(doc, "doc_id", "")),
        source=as_str(getattr(doc, "source", "")),
        kind=as_str(getattr(doc, "kind", "")),
        metadata=metadata,
        tags={k: as_str(getattr(doc, k)) for k in tag_keys if getattr(doc, k, None) is not None},
        idents=tuple(as_str(getattr(doc, "idents", "")).split()),
        timestamp=_timestamp(doc),
        version=_int_or_none(getattr(doc, "version", None)),
        generation=keys.key_generation(as_str(getattr(doc, "id", ""))),
        speaker=as_str(getattr(doc, "speaker", "") or ""),
        section=as_str(getattr(doc, "section", "") or ""),
        start=_int_or_none(getattr(doc, "chunk_start", None)),
        gap=_text(getattr(doc, "chunk_gap", None)),
        tail=_text(getattr(doc, "chunk_tail", None)),
    )


class _Joinable(Protocol):
    """What a chunk gives to be joined: a stored one, or one about to be written."""

    @property
    def text(self) -> str: ...
    @property
    def start(self) -> int | None: ...
    @property
    def gap(self) -> str: ...
    @property
    def tail(self) -> str: ...


def joined_text(chunks: Sequence[_Joinable]) -> str:
    """A doc's content from its chunks (in position order), exact where they kept their starts."""
    return join_chunks([c.text for c in chunks], [c.start for c in chunks], [c.gap for c in chunks], chunks[-1].tail)


def _text(value: Any) -> str:
    return "" if value is None else as_str(value)


def _timestamp(doc: Any) -> float | None:
    """The exact stored timestamp (``ts``), else the indexed one, rounded by RediSearch (a
    chunk written before ``ts`` existed)."""
    return _exact_or_indexed(getattr(doc, "ts", None), getattr(doc, "timestamp", None))


def hash_timestamp(mapping: Mapping[Any, Any]) -> float | None:
    """A stored chunk hash's time (as read by HGETALL): :func:`_timestamp` of a hash."""
    fields = {as_str(k): v for k, v in mapping.items()}
    return _exact_or_indexed(fields.get("ts"), fields.get("timestamp"))


def _exact_or_indexed(ts: Any, timestamp: Any) -> float | None:
    exact = _float_or_none(ts)
    return exact if exact is not None else _float_or_none(timestamp)


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(as_str(value))
    except ValueError:
        return None


def _float_or_none(value: Any) -> float | None:
    try:
        return None if value is None else float(as_str(value))
    except ValueError:
        return None
