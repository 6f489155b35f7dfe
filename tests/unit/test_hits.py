"""A leg's raw FT.SEARCH reply read as LegHits, and hydrated rows read as StoredChunks (pure)."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest

from memory import keys
from memory.index.codec import _RETURN_FIELDS, _stored
from memory.index.hits import LegHit, leg_fields, leg_hits, whole_chunks

TAGS = ("tenant", "kind", "environment")
KEY = "agentmem:g3:chunk:default:wiki/a.md_p0"
FIELDS = {
    "chunk_id": "wiki/a.md_p0",
    "doc_id": "wiki/a.md",
    "kind": "document",
    "ts": "1700000000.123456",
    "timestamp": "1700000000.12",
    "version": "4",
    "idents": "errconnreset4f2a cve20243094",
    "tenant": "default",
    "environment": "production ",
    "speaker": "user|caroline",
}
EXPECTED = LegHit(
    key=KEY,
    chunk_id="wiki/a.md_p0",
    kind="document",
    tags={"tenant": "default", "kind": "document", "environment": "production "},
    idents=("errconnreset4f2a", "cve20243094"),
    timestamp=1700000000.123456,
    version=4,
    generation=3,
    speaker="user|caroline",
)


def resp3(raw: bool) -> dict[Any, Any]:
    enc = (lambda s: s.encode()) if raw else (lambda s: s)
    return {
        enc("total_results"): 1,
        enc("results"): [
            {
                enc("id"): enc(KEY),
                enc("extra_attributes"): {enc(k): enc(v) for k, v in FIELDS.items()},
                enc("values"): [],
            }
        ],
    }


def test_every_reply_shape_reads_alike() -> None:
    resp2 = [1, KEY.encode(), [x.encode() for kv in FIELDS.items() for x in kv]]
    for reply in (resp3(raw=True), resp3(raw=False), resp2):
        assert leg_hits(reply, TAGS) == [EXPECTED]


def test_missing_fields_read_as_the_codec_reads_them() -> None:
    # No ts (a chunk written before it existed): the indexed timestamp; no version: None.
    fields = {k: v for k, v in FIELDS.items() if k not in ("ts", "version", "idents", "environment", "speaker")}
    reply = {
        b"results": [{b"id": KEY.encode(), b"extra_attributes": {k.encode(): v.encode() for k, v in fields.items()}}]
    }
    (hit,) = leg_hits(reply, TAGS)
    assert (hit.timestamp, hit.version, hit.idents, hit.speaker) == (1700000000.12, None, (), "")
    assert hit.tags == {"tenant": "default", "kind": "document"}
    assert leg_hits({b"results": []}, TAGS) == [] and leg_hits([0], TAGS) == []


def test_a_leg_asks_for_its_fields_once() -> None:
    # The ids and the tenant come from the key: never asked for.
    assert leg_fields(("tenant", "kind", "environment")) == (
        "kind",
        "ts",
        "timestamp",
        "version",
        "speaker",
        "environment",
    )
    assert "idents" in leg_fields(("tenant",), idents=True)


def shapes(key: str, attrs: dict[str, str]) -> list[Any]:
    """The same hit as each reply shape spells it: RESP3 raw and decoded, RESP2."""
    return [
        {b"results": [{b"id": key.encode(), b"extra_attributes": {k.encode(): v.encode() for k, v in attrs.items()}}]},
        {"results": [{"id": key, "extra_attributes": dict(attrs)}]},
        [1, key.encode(), [x.encode() for kv in attrs.items() for x in kv]],
    ]


def test_ids_and_tenant_come_from_the_key_exactly() -> None:
    """Whatever a doc id holds (colons, ``_p``, the key's own words), the key gives it back,
    with its tenant and generation, as the stored fields would, in every reply shape."""
    for tenant in ("default", "acme-1", "t_p2"):
        for doc_id in ("wiki/a.md", "a:b:c", "x_p3", "agentmem:g1:chunk:t:d_p0", "planner/s1#4", "ü"):
            cid = f"{doc_id}_p2"
            key = keys.chunk_key("agentmem", 12, tenant, cid)
            for reply in shapes(key, {"kind": "document", "chunk_id": cid, "tenant": tenant}):
                (hit,) = leg_hits(reply, ("tenant",))
                assert (hit.generation, hit.tags, hit.chunk_id, hit.doc_id) == (12, {"tenant": tenant}, cid, doc_id)


def test_no_key_is_made_for_a_tenant_that_could_not_be_read_back() -> None:
    for tenant in ("a:b", ":", ""):
        with pytest.raises(ValueError, match="cannot lead a key"):
            keys.chunk_key("agentmem", 1, tenant, "d_p0")
        with pytest.raises(ValueError, match="cannot lead a key"):
            keys.check_tenant(tenant)
    assert keys.check_tenant("acme_1") == "acme_1"


def test_a_hit_that_is_no_stored_chunk_fails_the_tenant_check() -> None:
    """A key of no chunk, or a hit whose hash came back with no fields (deleted since the
    engine found it), carries no tenant: the re-check against the request's drops it."""
    good = keys.chunk_key("agentmem", 3, "default", "d_p0")
    for reply in shapes("elsewhere", {"kind": "document"}):
        (hit,) = leg_hits(reply, TAGS)
        assert (hit.generation, hit.chunk_id, hit.tags) == (None, "", {"kind": "document"})
    for reply in shapes(good, {}):
        (hit,) = leg_hits(reply, TAGS)
        assert (hit.chunk_id, hit.tags) == ("d_p0", {})
    # After a chunk's key, a key of the same prefix with no tenant part is no chunk's either.
    reply = {b"results": [{b"id": k.encode(), b"extra_attributes": {b"kind": b"x"}} for k in (good, good[:-5])]}
    assert [(h.chunk_id, h.tags) for h in leg_hits(reply, ("tenant",))] == [("d_p0", {"tenant": "default"}), ("", {})]


def test_hydrated_rows_read_as_search_hits_do() -> None:
    fields = tuple(dict.fromkeys((*_RETURN_FIELDS, *TAGS)))
    full = {**FIELDS, "text": "ünïcödé text", "source": "wiki/a.md", "metadata": json.dumps({"n": 1, "s": "é"})}
    rows = [
        {f: full.get(f) for f in fields},
        {f: full.get(f) for f in fields} | {"metadata": "not json", "text": None, "ts": None},
        {f: full.get(f) for f in fields} | {"metadata": "[1, 2]", "version": "x"},
    ]
    for row in rows:
        raw = [None if row[f] is None else row[f].encode() for f in fields]
        # What a search hit holding the same fields gives (absent fields are not attributes).
        doc = types.SimpleNamespace(id=KEY, **{f: v for f, v in zip(fields, raw, strict=True) if v is not None})
        assert whole_chunks([(KEY, raw)], fields, TAGS) == [_stored(doc, TAGS)]
    assert whole_chunks([(KEY, [None] * len(fields)), (KEY, [])], fields, TAGS) == [None, None]
