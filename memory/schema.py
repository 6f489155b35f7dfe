"""The Redis index schema as data (pure): one TAG per filterable key, BM25 text, HNSW vector."""

from __future__ import annotations

from typing import Any

from memory.config import IndexConfig
from memory.filters import TAG_SEPARATOR, hash_field

# Re-exported: the key layout lives in memory.keys, and callers that import these from here keep working.
from memory.keys import chunk_prefix
from memory.keys import generation_of as generation_of
from memory.keys import key_root as key_root
from memory.keys import physical_name as physical_name

#: The furthest a search or aggregate may page: RediSearch refuses an offset past it.
MAX_SEARCH_OFFSET = 1_000_000


def as_str(value: Any) -> str:
    """A Redis reply value as text (bytes decoded)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def index_schema(cfg: IndexConfig, *, dims: int, generation: int) -> dict[str, Any]:
    """A redisvl ``IndexSchema`` dict for the chunk hashes of one index generation.

    ``stopwords: []`` (``STOPWORDS 0``) is deliberate: stopwords are dropped from chunks and
    queries by ``memory.text`` instead, and with the default list this RediSearch crashes
    on an OR group led by two stopwords.
    """
    fields: list[dict[str, Any]] = [
        # BM25 terms of the chunk, analyzed by memory.text (stopwords dropped, Snowball
        # stems) and so NOSTEM here; the raw ``text`` stays in the hash, unindexed, for
        # replies. RediSearch's own stemming scores a word's exact and stemmed entries
        # separately (0.648 nDCG@10 on SciFact against 0.682 for these terms).
        {"name": "terms", "type": "text", "attrs": {"weight": 1.0, "no_stem": True}},
        # Normalized exact identifiers of the chunk (memory.identifiers), unstemmed: the
        # identifier leg ranks them with BM25 among themselves.
        {"name": "idents", "type": "text", "attrs": {"weight": 1.0, "no_stem": True}},
        {
            "name": "vector",
            "type": "vector",
            "attrs": {
                "algorithm": "hnsw",
                "dims": dims,
                "distance_metric": "cosine",
                "datatype": "float32",
                "m": cfg.hnsw_m,
                "ef_construction": cfg.hnsw_ef_construction,
                "ef_runtime": cfg.hnsw_ef_runtime,
            },
        },
        # What the model read for this vector (memory.index.reuse): an edit's unchanged chunks
        # find their vectors by it instead of embedding them again.
        {"name": "vkey", "type": "tag", "attrs": {"case_sensitive": True}},
        {"name": "version", "type": "numeric"},
        {"name": "timestamp", "type": "numeric", "attrs": {"sortable": True}},
    ]
    # The tenant is a TAG like the filter keys, but no request can name it: it comes from
    # the topic a request arrived on and is always part of the query.
    for key in ("tenant", *cfg.filter_keys):
        fields.append({"name": key, "type": "tag", "attrs": {"separator": TAG_SEPARATOR, "case_sensitive": True}})
        # The same value hashed into a NUMERIC field: text legs filter on it without
        # changing BM25 scores (a TAG clause is scored; a numeric range is not).
        fields.append({"name": hash_field(key), "type": "numeric"})
    return {
        "index": {
            "name": physical_name(cfg.name, generation),
            "prefix": chunk_prefix(cfg.name, generation),
            "key_separator": ":",
            "storage_type": "hash",
            "stopwords": [],
        },
        "fields": fields,
    }


def info_attributes(info: Any) -> dict[str, dict[str, Any]]:
    """FT.INFO attributes as name -> {type, dim?}, whatever shape the client returns them in
    (flat lists by default; maps with ``legacy_responses=False``; bytes keys over raw RESP3)."""
    out: dict[str, dict[str, Any]] = {}
    for raw in info_field(info, "attributes") or []:
        if isinstance(raw, dict):
            d = {as_str(k).lower(): as_str(v) if isinstance(v, bytes) else v for k, v in raw.items()}
        else:
            items = [as_str(x) if isinstance(x, bytes) else x for x in raw]
            d = {str(items[i]).lower(): items[i + 1] for i in range(0, len(items) - 1, 2)}
        name = str(d.get("attribute") or d.get("identifier"))
        out[name] = {"type": str(d.get("type", "")).lower(), "dim": d.get("dim")}
    return out


def filter_keys_of(attributes: dict[str, dict[str, Any]]) -> tuple[str, ...]:
    """The filter keys an index was built with, in its schema's order, from its FT.INFO
    attributes (:func:`info_attributes`): each TAG field with its hashed twin, but the tenant
    (pure)."""
    return tuple(
        name
        for name, attr in attributes.items()
        if name != "tenant" and attr["type"] == "tag" and hash_field(name) in attributes
    )


def info_index_name(info: Any) -> str:
    """The physical index an FT.INFO reply describes (through an alias: the one it points at)."""
    got = info_field(info, "index_name")
    return as_str(got) if got is not None else ""


def info_field(info: Any, name: str) -> Any:
    """One field of an FT.INFO reply as redis-py parses it (a dict); None if it has none."""
    if isinstance(info, dict):
        for k, v in info.items():
            if as_str(k) == name:
                return v
    return None


def compare_schema(expected: dict[str, Any], actual: dict[str, dict[str, Any]]) -> list[str]:
    """What differs between the schema the settings want and the index in Redis (pure)."""
    problems = []
    for field in expected["fields"]:
        name, typ = field["name"], field["type"]
        have = actual.get(name)
        if have is None:
            problems.append(f"field {name!r} ({typ}) is missing")
        elif have["type"] != typ:
            problems.append(f"field {name!r} is {have['type']}, expected {typ}")
        elif typ == "vector" and have.get("dim") is not None and int(have["dim"]) != int(field["attrs"]["dims"]):
            problems.append(f"vector field has {have['dim']} dims, the model gives {field['attrs']['dims']}")
    return problems
