"""A stored chunk's filter fields set again from its stored metadata (a reindex's carry-over
under new filter keys) are the fields ingestion would have written."""

from __future__ import annotations

import json

from consumers.events import DocumentEvent, TranscriptEvent
from memory.filters import BASE_FILTER_KEYS, hash_field, value_hash
from memory.index.codec import _refielded, _respoken

KEYS = (*BASE_FILTER_KEYS, "user_id", "role")


def _stored(tags: dict[str, str], metadata: dict[str, object], own: dict[str, str]) -> dict[bytes, bytes]:
    """A chunk hash as HGETALL returns it: bytes keys and values."""
    fields: dict[str, object] = {"text": "t", "metadata": json.dumps(metadata, sort_keys=True), **own}
    for key, value in tags.items():
        fields[key] = value
        fields[hash_field(key)] = value_hash(value)
    return {k.encode(): str(v).encode() for k, v in fields.items()}


def _fields(mapping: dict[bytes | str, object]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else str(v))
        for k, v in mapping.items()
    }


def test_a_turn_and_a_doc_get_the_tags_ingestion_gives_them_under_the_new_keys() -> None:
    turn = TranscriptEvent(
        event_id="e",
        agent_id="planner",
        session_id="s1",
        turn=3,
        role="assistant",
        content="x",
        metadata={"user_id": "u1", "role": "ignored: the turn's own role wins", "environment": "prod"},
    )
    doc = DocumentEvent(
        event_id="d",
        op="upsert",
        doc_id="wiki/a",
        version=1,
        content="x",
        metadata={"user_id": "u2", "flag": True, "service": "billing"},
    )
    for event in (turn, doc):
        before = event.to_item(BASE_FILTER_KEYS)
        after = event.to_item(KEYS)
        own = {"tenant": "default", "kind": before.kind, "doc_id": before.doc_id, "source": before.source}
        refielded = _fields(_refielded(_stored(before.tags, before.metadata, own), KEYS))
        expected = _fields(_stored(after.tags, after.metadata, own))
        assert refielded == expected
    assert turn.to_item(KEYS).tags["role"] == "assistant" and turn.to_item(KEYS).tags["user_id"] == "u1"


def test_keys_no_longer_filterable_lose_their_fields_and_a_hash_without_metadata_is_kept() -> None:
    """A key's value comes from the metadata or not at all: a stale one, or one of a key no
    longer filterable, is dropped, as a replay would not write it; the chunk's own tags stay;
    a chunk stored without its metadata keeps the fields it has."""
    own = {"kind": "document", "doc_id": "d", "source": "d"}
    stale = _stored({"user_id": "old", "service": "billing", "tenant": "t", **own}, {"environment": "prod"}, {})
    out = _fields(_refielded(stale, KEYS))
    assert "user_id" not in out and hash_field("user_id") not in out and "service" not in out
    assert out["environment"] == "prod" and out[hash_field("environment")] == str(value_hash("prod"))
    assert {k: out[k] for k in ("tenant", *own)} == {"tenant": "t", **own}
    narrowed = _fields(_refielded(stale, ("environment",)))
    assert "user_id" not in narrowed and "service" not in narrowed and narrowed["environment"] == "prod"
    bare = {b"text": b"t", b"service": b"billing"}
    assert _refielded(bare, KEYS) == bare


def test_a_carried_turn_is_said_by_whom_ingestion_says_now() -> None:
    """The speaker field is written again from the turn's first chunk, role and agent (an
    assistant turn is its agent's); a document's hashes are left as they are."""
    turn = TranscriptEvent(event_id="e", agent_id="planner-7", session_id="s", turn=1, content="Bob: raised it.")
    item = turn.to_item(BASE_FILTER_KEYS)
    meta = json.dumps(item.metadata, sort_keys=True)
    chunks = [
        {b"kind": b"transcript", b"position": b"1", b"text": b"later text", b"metadata": meta.encode()},
        {
            b"kind": b"transcript",
            b"position": b"0",
            b"text": b"Bob: raised it.",
            b"metadata": meta.encode(),
            b"speaker": b"assistant|bob",
        },
    ]
    assert [h["speaker"] for h in _respoken(chunks)] == ["assistant|bob|planner 7"] * 2
    doc = [{b"kind": b"document", b"text": b"Bob: x", b"metadata": b"{}"}]
    assert _respoken(doc) == doc
