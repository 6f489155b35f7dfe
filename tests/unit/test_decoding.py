"""Event decoding: valid events become items, everything else a DLQ record with a reason."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from consumers.decoding import dead_letter, decode_records, dlq_body
from consumers.queries import guess_query_id, parse_request, scope_of, to_spec
from consumers.requests import ErrorBody, ErrorReply
from memory.errors import InvalidRequest
from memory.filters import BASE_FILTER_KEYS


@dataclass
class Rec:
    value: bytes | None
    topic: str = "memory.documents"
    partition: int = 0
    offset: int = 7
    key: bytes | None = b"k"
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp: int | None = None  # the Kafka record's, in ms


def doc(**over: object) -> bytes:
    base: dict[str, object] = {
        "event_id": "e1",
        "op": "upsert",
        "doc_id": "d1",
        "version": 3,
        "content": "hello",
        "metadata": {"environment": "production", "service": "billing-service"},
    }
    base.update(over)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


def decode(value: bytes | None, kind: str = "document", limit: int = 1024 * 1024):
    return decode_records([Rec(value)], kind=kind, filter_keys=BASE_FILTER_KEYS, max_content_bytes=limit)


def test_valid_document_becomes_an_item() -> None:
    """A valid upsert keeps its fields and turns filterable metadata into tags."""
    (good,), dead = decode(doc())
    assert dead == []
    item = good.item
    assert (item.op, item.doc_id, item.version, item.content, item.source) == ("upsert", "d1", 3, "hello", "d1")
    assert item.tags == {"environment": "production", "service": "billing-service"}
    assert (good.topic, good.partition, good.offset) == ("memory.documents", 0, 7)


def test_valid_transcript_becomes_an_unversioned_item() -> None:
    """A transcript turn has a stable doc id per (agent, session, turn) and no version."""
    raw = json.dumps(
        {
            "event_id": "e",
            "agent_id": "planner-7",
            "session_id": "s1",
            "turn": 12,
            "role": "assistant",
            "content": "checked the pool",
        }
    ).encode()
    (good,), dead = decode(raw, kind="transcript")
    assert dead == []
    assert good.item.doc_id == "transcript:planner-7/s1/12"
    assert good.item.version is None
    assert good.item.tags["agent_id"] == "planner-7" and good.item.kind == "transcript"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "empty message body"),
        (b"", "empty message body"),
        (b"{not json", "Invalid JSON"),
        (b"\xff\xfe\x00garbage", "not valid UTF-8"),
        (b"[1, 2]", "should be an object"),
        (doc(version="3"), "version"),
        (doc(version=-1), "version"),
        (doc(version=2**64), "version"),
        (doc(op="patch"), "op"),
        (doc(doc_id=...), "doc_id"),
        (doc(doc_id=""), "doc_id"),
        (doc(event_id=...), "event_id"),
        (doc(content=""), "content is empty"),
        (doc(content="   "), "content is empty"),
        (doc(content=...), "an upsert needs content"),
        (doc(content=5), "content"),
        (doc(metadata={"a": {"nested": 1}}), "metadata"),
        (doc(metadata={"a": [1, 2]}), "metadata"),
        (doc(metadata="x"), "metadata"),
        (doc(content="x").replace(b'"metadata": {', b'"metadata": {"n": NaN, '), "not a finite number"),
        (doc(content="x").replace(b'"metadata": {', b'"metadata": {"n": -Infinity, '), "not a finite number"),
        (doc(doc_id="transcript:planner-7/s1/12"), "may not start with"),
        (doc(doc_id="community:c0-4a9febc087"), "may not start with"),
        (doc(content="x" * 2000), "content larger than 1024 bytes"),
        (doc(timestamp="yesterday"), "timestamp"),
        (doc(doc_id="nul\x00doc"), "doc_id"),  # RediSearch reads keys up to a NUL
        # a field spelt nearly as a missing one: refused, not ignored with what it carried
        (doc(content="x").replace(b'"metadata"', b'"metdata"'), "unknown field 'metdata': did you mean 'metadata'?"),
        (doc(content="x").replace(b'"version"', b'"verison"'), "'verison' is no field: did you mean 'version'?"),
        # cut short, too: a producer's own fields extend a name (timestamp_ms), never cut one
        (doc(content="x").replace(b'"metadata"', b'"metadat"'), "unknown field 'metadat': did you mean 'metadata'?"),
        (doc(content="x").replace(b'"metadata"', b'"sourc": "s", "metadata"'), "'sourc': did you mean 'source'?"),
    ],
)
def test_invalid_documents_are_dead_lettered_with_a_reason(value: bytes | None, reason: str) -> None:
    """Each bad event yields one DLQ record naming the problem and carrying the original bytes."""
    good, (dead,) = decode(value, limit=1024)
    assert good == []
    assert reason in dead.reason
    assert base64.b64decode(dead.original_b64) == (value or b"")
    assert (dead.topic, dead.partition, dead.offset, dead.error_code) == ("memory.documents", 0, 7, "invalid_event")


def test_a_bad_record_does_not_stop_the_rest_of_the_batch() -> None:
    """Valid records around an invalid one are all decoded, in order."""
    recs = [Rec(doc(doc_id="a")), Rec(b"junk"), Rec(doc(doc_id="b"))]
    good, dead = decode_records(recs, kind="document", filter_keys=BASE_FILTER_KEYS, max_content_bytes=10_000)
    assert [g.item.doc_id for g in good] == ["a", "b"] and len(dead) == 1


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"{", "Invalid JSON"),
        (b'{"query_id": "q", "search_text": "x", "top_k": "5"}', "top_k"),
        (b'{"query_id": "q"}', "search_text"),
        (b'{"query_id": "q", "search_text": "x", "bogus": 1}', "bogus"),
        (b'{"query_id": "q", "search_text": "x", "metadata_filter": {"service": {"a": 1}}}', "metadata_filter"),
        (b'{"query_id": "q", "search_text": "x", "hybrid_params": {"dense_weight": -1}}', "dense_weight"),
        (b'{"query_id": "q", "search_text": "x", "time_range": {"since": "yesterday"}}', "since"),
        (b'{"query_id": "q", "search_text": "x", "time_range": {"after": "2026-11-01T00:00:00Z"}}', "after"),
        (
            b'{"query_id": "q", "search_text": "x", "time_range": '
            b'{"since": "2026-11-02T00:00:00Z", "until": "2026-11-01T00:00:00Z"}}',
            "since is after",
        ),
    ],
)
def test_bad_requests_are_invalid_request(raw: bytes, fragment: str) -> None:
    """Malformed or schema-invalid requests raise InvalidRequest with the reason."""
    with pytest.raises(InvalidRequest, match=fragment):
        parse_request(raw)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"query_id": "q", "search_text": "x", "topk": 5}', "topk: unknown field: did you mean 'top_k'?"),
        (
            b'{"query_id": "q", "search_text": "x", "hybrid_params": {"dense_wieght": 1}}',
            "hybrid_params.dense_wieght: unknown field: did you mean 'dense_weight'?",
        ),
        (b'{"query_id": "q", "search_text": "x", "bogus": 1}', "bogus: unknown field"),
        (
            b'{"query_id": "q", "search_text": "x", "time_range": '
            b'{"since": "2026-11-02T00:00:00Z", "until": "2026-11-01T00:00:00Z"}}',
            "time_range: time_range.since is after time_range.until",
        ),
    ],
)
def test_a_requests_reason_names_the_field_meant_and_no_library_prefix(raw: bytes, reason: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_request(raw)
    assert str(caught.value).startswith(reason), str(caught.value)
    assert "Value error" not in str(caught.value)


def test_content_within_the_limit_is_taken_however_json_escapes_it() -> None:
    """CJK text of 99 KB under a 100 KB limit is 198 KB as ASCII-escaped JSON (each character
    one \\uXXXX): it is within the limit and decodes; content over it is refused."""
    text = "漢" * 33_000  # 99,000 bytes of UTF-8
    escaped = doc(content=text)  # json.dumps escapes non-ASCII by default
    assert len(escaped) > 100_000 + 64 * 1024
    (good,), dead = decode(escaped, limit=100_000)
    assert dead == [] and good.item.content == text
    _, (over,) = decode(doc(content=text + "漢" * 1000), limit=100_000)
    assert "content larger than 100000 bytes" in over.reason


def test_guess_query_id() -> None:
    """The query_id of a failed request is echoed when it can be read."""
    assert guess_query_id(b'{"query_id": "q9", "top_k": "x"}') == "q9"
    assert guess_query_id(b"{") is None
    assert guess_query_id(b'{"query_id": 5}') is None
    # nesting deep enough for a RecursionError is as unreadable as bad JSON
    assert guess_query_id(b'{"query_id": "q", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}") is None
    # a lone surrogate, escaped: no reply can carry it, and an error reply holding it would
    # fail to serialize, leaving the asker with nothing; the reply goes out without the id
    raw = b'{"query_id": "\\ud800", "search_text": "hi"}'
    assert guess_query_id(raw) is None
    with pytest.raises(InvalidRequest):
        parse_request(raw)
    ErrorReply(query_id=guess_query_id(raw), error=ErrorBody(code="invalid_request", message="m")).model_dump_json()


def test_scope_label_never_raises() -> None:
    """The metrics label of any request body: its scope, or 'invalid'."""
    assert scope_of(b'{"scope": "all"}') == "all"
    assert scope_of(b"{}") == "chunks"
    assert scope_of(b'{"scope": ["chunks"]}') == "invalid"  # unhashable: once a crash with no reply
    assert scope_of(b'{"scope": {"a": 1}}') == "invalid"
    assert scope_of(b"[" * 100_000 + b"]" * 100_000) == "invalid"
    assert scope_of(b"\xff") == "invalid"


def transcript(agent_id: str, session_id: str) -> bytes:
    return json.dumps(
        {"event_id": "e", "agent_id": agent_id, "session_id": session_id, "turn": 1, "content": "hi"}
    ).encode()


def test_transcript_ids_with_slashes_stay_distinct() -> None:
    """(ops/east, s1) and (ops, east/s1) are two sessions; ids without '/' or '%' keep their form."""
    ids = {
        decode(transcript(a, s), kind="transcript")[0][0].item.doc_id
        for a, s in [("ops/east", "s1"), ("ops", "east/s1")]
    }
    assert len(ids) == 2
    assert decode(transcript("ops%2Feast", "s1"), kind="transcript")[0][0].item.doc_id not in ids
    assert decode(transcript("planner-7", "s1"), kind="transcript")[0][0].item.doc_id == "transcript:planner-7/s1/1"
    # and their sources, which a `source` filter matches, as well
    sources = {
        decode(transcript(a, s), kind="transcript")[0][0].item.source
        for a, s in [("ops/east", "s1"), ("ops", "east/s1")]
    }
    assert sources == {"ops%2Feast/s1", "ops/east%2Fs1"}
    assert decode(transcript("planner-7", "s1"), kind="transcript")[0][0].item.source == "planner-7/s1"


def test_a_delete_may_carry_blank_content() -> None:
    """Content is required for upserts only; a delete's is ignored."""
    (good,), dead = decode(doc(op="delete", content=""))
    assert dead == [] and good.item.op == "delete"


def test_a_dead_letter_keeps_the_original_key_bytes() -> None:
    """A key that is not UTF-8 is base64 in the body, and the record is published under the raw bytes."""
    rec = Rec(b"junk", key=b"\xff\xfedoc")
    dead = dead_letter(rec, "bad", "invalid_event")
    assert dead.key == base64.b64encode(b"\xff\xfedoc").decode() and dead.raw_key == b"\xff\xfedoc"


def test_a_dead_letter_too_large_for_kafka_leaves_the_original_out() -> None:
    """Both copies first, then the base64 copy only, then neither: the record always fits."""
    value = doc(content="x" * 250_000, version="3")  # invalid (a string version), ~250 kB
    (dead,) = decode_records([Rec(value)], kind="document", filter_keys=BASE_FILTER_KEYS, max_content_bytes=10**7)[1]
    body, key = dlq_body(dead, 10**7)
    full = json.loads(body)
    assert full["original_text"] and base64.b64decode(full["original_b64"]) == value and not full["original_truncated"]
    assert key == b"k"
    b64_only = json.loads(dlq_body(dead, 400_000)[0])
    assert b64_only["original_text"] is None and base64.b64decode(b64_only["original_b64"]) == value
    bare, key = dlq_body(dead, 100_000)
    assert len(bare) + len(key or b"") <= 100_000
    record = json.loads(bare)
    assert record["original_truncated"] and record["original_b64"] == "" and record["original_size"] == len(value)
    assert (record["topic"], record["offset"], record["error_code"]) == ("memory.documents", 7, "invalid_event")
    assert record["key"] == "k" and key == b"k"  # the key fits: kept


def test_a_huge_key_or_headers_never_push_a_dead_letter_past_the_limit() -> None:
    """The key travels twice and invalid UTF-8 headers grow ~3x: they go last, but they go."""
    for rec in (
        Rec(b"junk", key=b"k" * 600_000),
        Rec(b"junk", headers=[("h", b"\xff" * 400_000)]),
    ):
        dead = dead_letter(rec, "bad", "invalid_event")
        body, key = dlq_body(dead, 900_000)
        assert len(body) + len(key or b"") <= 900_000
        record = json.loads(body)
        assert record["original_truncated"] and key is None and record["key"] is None and record["headers"] == {}


def test_a_reason_quoting_huge_input_never_keeps_a_dead_letter_from_fitting() -> None:
    """A 2 MB metadata key is named cut short in the reason, and the reason is itself cut: quoted
    whole, the dead letter would never fit its record, its publish would fail forever and the
    partition would never commit again."""
    big_key = "k" * 2_000_000
    value = json.dumps(
        {"event_id": "e", "op": "upsert", "doc_id": "d", "version": 1, "content": "x", "metadata": {big_key: 1}}
    ).encode()
    (dead,) = decode_records([Rec(value)], kind="document", filter_keys=BASE_FILTER_KEYS, max_content_bytes=10**7)[1]
    assert "2000000 characters" in dead.reason and len(dead.reason) < 1000
    body, key = dlq_body(dead, 1_000_000)
    assert len(body) + len(key or b"") <= 1_000_000
    long = dead_letter(Rec(b"junk"), "x" * 5_000_000, "poison")
    assert len(long.reason) < 2100 and long.reason.endswith("more characters cut)")
    body, key = dlq_body(long, 2_000)  # a DLQ limit of a few KB: the reason goes too
    assert len(body) + len(key or b"") <= 2_000


def test_a_time_range_becomes_epoch_bounds_in_the_spec() -> None:
    """ISO 8601 bounds become epoch seconds (a time without a zone is UTC); an end left out stays open."""
    req = parse_request(
        b'{"query_id": "q", "search_text": "x", "time_range": {"since": "2026-11-01T00:00:00+01:00", '
        b'"until": "2026-11-02T00:00:00"}}'
    )
    spec = to_spec(req)
    assert spec.since == datetime(2026, 10, 31, 23, tzinfo=UTC).timestamp()
    assert spec.until == datetime(2026, 11, 2, tzinfo=UTC).timestamp()
    open_end = to_spec(
        parse_request(b'{"query_id": "q", "search_text": "x", "time_range": {"since": "2026-11-01T00:00:00Z"}}')
    )
    assert open_end.since == datetime(2026, 11, 1, tzinfo=UTC).timestamp() and open_end.until is None
    assert to_spec(parse_request(b'{"query_id": "q", "search_text": "x"}')).since is None
    # An age or a day's name is the clients' shorthand: the wire names what to send instead.
    for shorthand in ("7d", "yesterday", "2026-12-01"):
        raw = json.dumps({"query_id": "q", "search_text": "x", "time_range": {"since": shorthand}}).encode()
        with pytest.raises(InvalidRequest, match=f"time_range.since: '{shorthand}' is the clients' shorthand"):
            parse_request(raw)


@pytest.mark.parametrize("text", ["\u0000", "\u200b\u0001", " \u0000\t"])
def test_a_search_text_with_no_words_is_refused(text: str) -> None:
    """Only whitespace, controls or format characters: answered with an error, not with
    whatever the vector leg finds nearest to nothing."""
    raw = json.dumps({"query_id": "q", "search_text": text}).encode()
    with pytest.raises(InvalidRequest, match="search_text has no words"):
        parse_request(raw)
    for said in ("?", "\U0001fae8"):  # punctuation, an emoji newer than the Unicode database: asked
        assert parse_request(json.dumps({"query_id": "q", "search_text": said}).encode()).search_text == said


def test_a_forget_on_the_transcripts_topic_becomes_a_forget_item() -> None:
    """``"op": "forget"`` names a session, or with ``all_sessions`` every session of an agent:
    the item holds the turn ids' common prefix, ids encoded as turns encode them, and the tags
    they carry. Anything that could widen a forget by mistake is dead-lettered instead."""

    def rec(body: dict[str, object]) -> Rec:
        return Rec(json.dumps(body).encode(), offset=len(recs))

    recs: list[Rec] = []
    for body in [
        {"event_id": "f1", "op": "forget", "agent_id": "ops/east", "session_id": "s1"},
        {"event_id": "f2", "op": "forget", "agent_id": "planner", "all_sessions": True},
        {"event_id": "f3", "op": "forget", "agent_id": "planner"},  # no scope
        {"event_id": "f4", "op": "forget", "agent_id": "planner", "session_id": None},  # null
        {"event_id": "f5", "op": "forget", "agent_id": "planner", "sessionId": "s1"},  # misspelt
        {"event_id": "f6", "op": "forget", "agent_id": "p", "session_id": "s", "all_sessions": True},
        {"event_id": "f7", "op": "forget"},
    ]:
        recs.append(rec(body))
    good, dead = decode_records(recs, kind="transcript", filter_keys=BASE_FILTER_KEYS, max_content_bytes=10_000)
    one, agent = (g.item for g in good)
    assert one.op == "forget" and one.doc_id == "transcript:ops%2Feast/s1/" and one.version is None
    assert one.tags == {"agent_id": "ops/east", "session_id": "s1", "kind": "transcript"}
    assert agent.doc_id == "transcript:planner/" and "session_id" not in agent.tags
    assert [d.offset for d in dead] == [2, 3, 4, 5, 6] and {d.error_code for d in dead} == {"invalid_event"}
    assert "all_sessions" in dead[0].reason and "sessionId" in dead[2].reason and "agent_id" in dead[4].reason
    assert "does neither" in dead[0].reason and "not both" in dead[3].reason
    # a turn's id starts with its session's prefix, and with no other session's
    turn = rec({"event_id": "t", "agent_id": "ops/east", "session_id": "s1", "turn": 3, "content": "x"})
    item = decode_records([turn], kind="transcript", filter_keys=BASE_FILTER_KEYS, max_content_bytes=10_000)[0][0].item
    assert item.doc_id.startswith(one.doc_id) and not item.doc_id.startswith("transcript:ops/")


@pytest.mark.parametrize(
    "fields",
    [
        {"agent_id": "ag\x00ent", "session_id": "s1", "turn": 1, "content": "x"},
        {"agent_id": "agent", "session_id": "s\x001", "turn": 1, "content": "x"},
        {"op": "forget", "agent_id": "ag\x00ent", "session_id": "s1"},
        {"op": "forget", "agent_id": "agent", "session_id": "s\x001"},
    ],
)
def test_a_nul_in_an_agent_or_session_id_is_dead_lettered(fields: dict[str, object]) -> None:
    """Such a turn would be indexed but never found (RediSearch reads a key up to a NUL), and a
    forget of it would delete nothing. Refused with the field named."""
    raw = json.dumps({"event_id": "e", **fields}).encode()
    good, (dead,) = decode(raw, kind="transcript")
    assert good == [] and ("agent_id" in dead.reason or "session_id" in dead.reason)


def test_a_turn_sent_as_an_upsert_is_a_turn_and_as_a_delete_a_dead_letter() -> None:
    """Turns never had an op: "upsert" was ignored and still is; another ("delete") would be
    stored as the turn its writer meant to remove, and is dead-lettered instead."""
    body = {"event_id": "t", "op": "upsert", "agent_id": "a", "session_id": "s", "turn": 1, "content": "x"}
    deleting = {**body, "op": "delete"}
    good, dead = decode_records(
        [Rec(json.dumps(b).encode(), offset=n) for n, b in enumerate((body, deleting))],
        kind="transcript",
        filter_keys=BASE_FILTER_KEYS,
        max_content_bytes=100,
    )
    assert [g.item.op for g in good] == ["upsert"] and good[0].item.doc_id == "transcript:a/s/1"
    assert [d.offset for d in dead] == [1] and "unknown op 'delete'" in dead[0].reason


def test_a_forget_of_one_turn_names_the_turn_and_its_sessions_tags() -> None:
    """The item's doc id is the turn's (ids encoded as turns encode them); its tags are its
    session's, which ``memory.forgets`` lists and narrows to the turn's number."""
    body = {"event_id": "f", "op": "forget", "agent_id": "ops/east", "session_id": "s1", "turn": 12}
    (g,), dead = decode_records(
        [Rec(json.dumps(body).encode())], kind="transcript", filter_keys=BASE_FILTER_KEYS, max_content_bytes=100
    )
    assert dead == [] and (g.item.op, g.item.doc_id) == ("forget", "transcript:ops%2Feast/s1/12")
    assert g.item.tags == {"agent_id": "ops/east", "session_id": "s1", "kind": "transcript"}


def test_an_event_without_a_timestamp_is_dated_by_its_kafka_record() -> None:
    """So that a replay dates it as the first delivery did (not at the time of the replay)."""
    body = {"event_id": "t", "agent_id": "a", "session_id": "s", "turn": 1, "content": "x"}
    record = Rec(json.dumps(body).encode(), timestamp=1_790_000_000_123)
    (g,), _ = decode_records([record], kind="transcript", filter_keys=BASE_FILTER_KEYS, max_content_bytes=100)
    assert g.item.timestamp == 1_790_000_000.123
    doc = {"event_id": "d", "op": "upsert", "doc_id": "x", "version": 1, "content": "y"}
    record = Rec(json.dumps(doc).encode(), timestamp=1_790_000_000_000)
    (g,), _ = decode_records([record], kind="document", filter_keys=BASE_FILTER_KEYS, max_content_bytes=100)
    assert g.item.timestamp == 1_790_000_000.0


def test_a_timestamp_ahead_of_its_record_is_dead_lettered_whatever_the_clock_says() -> None:
    """A timestamp is when a memory was recorded: one far ahead of its record's time is refused
    with the gap named, judged against the record so that a replay years later decides the same,
    and a few seconds of clock drift between hosts pass."""
    record_ms = 1_790_000_000_000  # 2026-09-21T14:13:20Z
    turn = {"event_id": "t", "agent_id": "a", "session_id": "s", "turn": 1, "content": "x"}
    late = {**turn, "timestamp": "2026-09-21T16:13:20"}  # naive local time of UTC+2, read as UTC
    (dead,) = decode_records(
        [Rec(json.dumps(late).encode(), topic="memory.transcripts", timestamp=record_ms)],
        kind="transcript",
        filter_keys=BASE_FILTER_KEYS,
        max_content_bytes=100,
    )[1]
    assert dead.error_code == "invalid_event"
    assert "2.0 h (7200 s) after its Kafka record's time" in dead.reason and "at most 300 s ahead" in dead.reason
    drift = {**turn, "timestamp": "2026-09-21T14:14:20Z"}  # 60 s ahead
    (good,), _ = decode_records(
        [Rec(json.dumps(drift).encode(), topic="memory.transcripts", timestamp=record_ms)],
        kind="transcript",
        filter_keys=BASE_FILTER_KEYS,
        max_content_bytes=100,
    )
    assert good.item.timestamp == 1_790_000_060.0
    far = doc(timestamp="2027-09-21T14:13:20Z")
    args = {"kind": "document", "filter_keys": BASE_FILTER_KEYS, "max_content_bytes": 100}
    (dead,) = decode_records([Rec(far, timestamp=record_ms)], **args)[1]  # type: ignore[arg-type]
    assert "365.0 d (31536000 s) after its Kafka record's time" in dead.reason
    (good,), _ = decode_records([Rec(far, timestamp=record_ms)], max_future_s=366 * 86_400, **args)  # type: ignore[arg-type]
    assert good.item.timestamp == datetime(2027, 9, 21, 14, 13, 20, tzinfo=UTC).timestamp()
    # Without a record time the daemon's clock is the reference.
    (dead,) = decode(doc(timestamp=(datetime.now(UTC) + timedelta(hours=1)).isoformat()))[1]
    assert "after the daemon's clock" in dead.reason
    (good,), _ = decode(doc(timestamp=(datetime.now(UTC) - timedelta(days=400)).isoformat()))
    assert good.item.timestamp < datetime.now(UTC).timestamp()


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"b": 1}, "metadata['a'] is an object: metadata values are strings, numbers or booleans"),
        ([1, 2], "metadata['a'] is an array"),
        (None, "metadata['a'] is null"),
        ("x" * 5000, "metadata['a'] is 5000 characters long: at most 4096"),
    ],
)
def test_a_metadata_value_of_another_type_is_named_in_one_reason(value: object, says: str) -> None:
    """Not the four failures of trying each allowed type (str, int, float, bool) in turn."""
    body = {"event_id": "e", "op": "upsert", "doc_id": "d", "version": 1, "content": "x", "metadata": {"a": value}}
    _, dead = decode_records(
        [Rec(json.dumps(body).encode(), offset=0)],
        kind="document",
        filter_keys=BASE_FILTER_KEYS,
        max_content_bytes=10_000,
    )
    assert len(dead) == 1 and says in dead[0].reason and "constrained-str" not in dead[0].reason, dead[0].reason


def test_a_forget_of_one_turn_without_its_session_is_refused() -> None:
    """Every session's turn 3 is no scope a forget can name: it would widen the forget."""
    from consumers.events import ForgetEvent

    with pytest.raises(ValueError, match="a forget of one turn names its session_id too"):
        ForgetEvent(event_id="f", op="forget", agent_id="a", all_sessions=True, turn=3)


def test_an_unknown_field_unlike_any_missing_one_is_ignored() -> None:
    """A producer's own field (``trace_id``), or one a later contract adds, is read past: only
    a near spelling of a field the event lacks is taken for a mistake."""
    body = json.loads(doc(content="x"))
    good, dead = decode(json.dumps({**body, "trace_id": "t-1", "meta": {"a": 1}}).encode(), limit=1024)
    assert dead == [] and len(good) == 1
    # "metadata" is there: a second, near spelling beside it is the producer's own field
    good, dead = decode(json.dumps({**body, "metadatas": {"a": 1}}).encode(), limit=1024)
    assert dead == [] and len(good) == 1
    # a field extended is the producer's own, the field it extends missing or not
    extended = {k: v for k, v in body.items() if k != "source"} | {"timestamp_ms": 1, "source_id": "s"}
    good, dead = decode(json.dumps(extended).encode(), limit=1024)
    assert dead == [] and len(good) == 1
    # and a timestamp is read as one (a check before validation made every ISO string fail)
    good, dead = decode(json.dumps({**body, "timestamp": "2026-12-05T21:58:45Z", "trace_id": "t"}).encode())
    assert dead == [] and good[0].item.timestamp is not None


def test_a_turn_whose_role_is_cut_short_is_refused() -> None:
    """``rol`` for ``role`` is refused, not read past: the turn would default to the assistant's
    and stop answering the user's "I" and "my" questions."""
    turn = {"event_id": "e", "agent_id": "a", "session_id": "s", "turn": 0, "content": "I love hiking", "rol": "user"}
    raw = json.dumps(turn)
    good, (dead,) = decode(raw.encode(), kind="transcript")
    assert good == [] and "unknown field 'rol': did you mean 'role'?" in dead.reason


def test_max_per_doc_reaches_the_spec_and_a_negative_one_is_refused() -> None:
    """The client's body carries it only when set; the daemon reads it into the search."""
    from consumers.encoding import query_body

    args: dict[str, Any] = dict(
        top_k=5, metadata_filter=None, dense_weight=None, sparse_weight=None, identifier_weight=None,
        recency_weight=None, rrf_k=None, query_id="q", scope=None, since=None, until=None, context_turns=0,
    )  # fmt: skip
    assert "max_per_doc" not in query_body("x", **args)
    body = query_body("x", **args, max_per_doc=1)
    assert to_spec(parse_request(json.dumps(body).encode())).max_per_doc == 1
    assert to_spec(parse_request(json.dumps(query_body("x", **args)).encode())).max_per_doc is None
    with pytest.raises(InvalidRequest, match="max_per_doc"):
        parse_request(json.dumps({**body, "max_per_doc": -1}).encode())


def test_an_event_under_another_key_than_its_own_is_applied_and_marked() -> None:
    """A document's key is its doc_id, a turn's or a forget's its session's (an agent-wide
    forget's, the agent's): any other key, or none, is marked for the warning."""
    turn = json.dumps({"event_id": "e", "agent_id": "a", "session_id": "s", "turn": 1, "content": "x"}).encode()
    forget = json.dumps({"event_id": "f", "op": "forget", "agent_id": "a", "all_sessions": True}).encode()
    cases = [
        (Rec(doc(), key=b"d1"), "document", None),
        (Rec(doc(), key=b"tenant-a"), "document", "tenant-a"),
        (Rec(doc(), key=None), "document", ""),
        (Rec(turn, key=b"a/s"), "transcript", None),
        (Rec(turn, key=b"a"), "transcript", "a"),
        (Rec(forget, key=b"a"), "transcript", None),
    ]
    for rec, kind, apart in cases:
        (good,), dead = decode_records([rec], kind=kind, filter_keys=BASE_FILTER_KEYS, max_content_bytes=1024)
        assert (dead, good.keyed_apart) == ([], apart), rec
