"""A dead letter's event corrected (`dlq replay --with`) or moved to its tenant (`--tenant`): pure."""

from __future__ import annotations

import json

import pytest

from daemon.dlq_replay import Replay, corrected, destination, keyed_as, original_of, replay_of
from daemon.explore.dlq import dead_letter
from memory.errors import InvalidRequest


@pytest.mark.parametrize(
    ("event", "key"),
    [
        ({"op": "upsert", "doc_id": "kb/a.md", "version": 1, "content": "x"}, "kb/a.md"),
        ({"agent_id": "planner", "session_id": "s1", "turn": 3, "role": "user", "content": "x"}, "planner/s1"),
        ({"op": "forget", "agent_id": "planner"}, "planner"),
        (["not", "an", "event"], None),
    ],
)
def test_an_event_is_keyed_as_the_contract_keys_it(event: object, key: str | None) -> None:
    assert keyed_as(json.dumps(event).encode()) == key
    assert keyed_as(b"{not json") is None


def test_a_corrected_event_keeps_its_key_or_is_refused() -> None:
    """Sent under the original's key, an event of another document would not keep its own
    key's order with that document's other writes."""
    original = Replay(topic="memory.documents", key="kb/a.md", value=b"{}")
    fixed = json.dumps({"op": "upsert", "doc_id": "kb/a.md", "version": 1, "content": "short"}).encode()
    assert corrected(original, fixed) == Replay("memory.documents", "kb/a.md", fixed)
    assert corrected(original, b"{not json").value == b"{not json"  # the daemon judges it
    with pytest.raises(InvalidRequest, match=r"keyed 'kb/b\.md'"):
        corrected(original, json.dumps({"op": "upsert", "doc_id": "kb/b.md", "version": 1}).encode())


def test_an_event_of_a_bare_topic_goes_to_the_tenant_named() -> None:
    """``dlq replay --tenant``: only an event published where no tenant is named moves, and
    only in topic tenancy; a tenant's own dead letter goes back to that tenant."""
    inputs = ("memory.documents", "memory.transcripts")
    bare = Replay(topic="memory.documents", key="kb/a.md", value=b"{}")
    assert destination(bare, "acme", inputs, "topic") == Replay("memory.documents.acme", "kb/a.md", b"{}")
    cut = Replay(topic="memory.documents.a.b", key="kb/a.md", value=b"{}")
    assert destination(cut, "acme", inputs, "topic").topic == "memory.documents.acme"
    with pytest.raises(InvalidRequest, match="names its tenant already"):
        destination(Replay("memory.documents.globex", "kb/a.md", b"{}"), "acme", inputs, "topic")
    with pytest.raises(InvalidRequest, match="needs AGENTMEM_CONSUMER__TENANCY=topic"):
        destination(bare, "acme", inputs, "single")
    with pytest.raises(InvalidRequest, match="is not"):
        destination(bare, "a.b", inputs, "topic")
    # Without --tenant: back to its own topic, unless that names no tenant (refused again there).
    assert destination(bare, None, inputs, "single") == bare
    assert destination(Replay("memory.documents.globex", "k", b"{}"), None, inputs, "topic").topic.endswith("globex")
    with pytest.raises(InvalidRequest, match="names no tenant"):
        destination(bare, None, inputs, "topic")


def test_an_empty_message_is_shown_empty_not_too_large_and_is_not_sent_again() -> None:
    """An empty record was dead-lettered whole (its bytes: none), not cut for its size."""
    body = {
        "reason": "empty message body", "error_code": "invalid_event", "topic": "memory.documents",
        "partition": 0, "offset": 3, "key": "k", "original_b64": "", "original_text": "", "headers": {},
        "failed_at": "2026-12-07T05:00:00+00:00", "original_size": 0,
    }  # fmt: skip
    letter = dead_letter(0, 9, json.dumps(body).encode(), bases=("memory.documents",), tenancy="single")
    assert (letter.preview, letter.preview_kind, letter.cut, letter.size) == ("", "text", False, 0)
    with pytest.raises(InvalidRequest, match="an empty message: there is nothing to send again"):
        replay_of(json.dumps(body).encode(), b"k", ("memory.documents",))
    assert original_of(json.dumps(body).encode()) == b""  # `dlq original` prints it: nothing
    # A keyless one cannot be sent again as it was, but its original is printed all the same.
    keyless = {**body, "key": None, "original_b64": "//4AYmluYXJ5", "original_size": 9}
    assert original_of(json.dumps(keyless).encode()) == b"\xff\xfe\x00binary"
    with pytest.raises(InvalidRequest, match="no UTF-8 key"):
        replay_of(json.dumps(keyless).encode(), None, ("memory.documents",))
    cut = {**body, "original_size": 5_000_000, "original_truncated": True}
    assert dead_letter(0, 9, json.dumps(cut).encode(), bases=("memory.documents",), tenancy="single").preview_kind == (
        "none"
    )
    with pytest.raises(InvalidRequest, match="too large to keep"):
        replay_of(json.dumps(cut).encode(), b"k", ("memory.documents",))
    with pytest.raises(InvalidRequest, match="too large to keep"):
        original_of(json.dumps(cut).encode())
