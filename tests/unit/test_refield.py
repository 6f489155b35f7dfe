"""A stored chunk's filter fields set again from its stored metadata (a reindex's carry-over
under new filter keys) are the fields ingestion would have written."""

from __future__ import annotations

import json

from consumers.events import DocumentEvent, TranscriptEvent
from memory.filters import BASE_FILTER_KEYS, hash_field, value_hash
from memory.index.codec import _refielded

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


def test_only_the_new_keys_are_rewritten_and_a_hash_without_metadata_is_kept() -> None:
    """A key's value comes from the metadata or not at all (a stale one is dropped); fields
    of other keys are left as stored, since the new index does not read them; a chunk stored
    without its metadata keeps the fields it has."""
    stale = _stored({"user_id": "old", "service": "billing"}, {"environment": "prod"}, {"kind": "document"})
    out = _fields(_refielded(stale, KEYS))
    assert "user_id" not in out and hash_field("user_id") not in out and "service" not in out
    assert out["environment"] == "prod" and out[hash_field("environment")] == str(value_hash("prod"))
    assert out["kind"] == "document"
    kept = _fields(_refielded(stale, ("environment",)))
    assert kept["user_id"] == "old" and kept["service"] == "billing"
    bare = {b"text": b"t", b"service": b"billing"}
    assert _refielded(bare, KEYS) == bare
