"""What `MemoryClient` refuses before sending: the daemon's own checks of an event (the
contract's models and the content limit), so a bad event fails at the caller instead of going
to the dead letters unseen. Pure: the client is never started."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from consumers.client import MemoryClient
from consumers.config import Topics, event_record_bytes
from consumers.events import DocumentEvent, TranscriptEvent
from daemon.settings import Settings
from memory.errors import InvalidEvent, InvalidRequest


def _client(max_content_bytes: int = 4096) -> MemoryClient:
    return MemoryClient(bootstrap="127.0.0.1:1", max_content_bytes=max_content_bytes)


def test_a_valid_document_is_encoded_as_the_daemon_reads_it() -> None:
    version, value = _client().document_event("docs/a.md", "Ünïcode stays unescaped.", version=7, metadata={"k": 1})
    event = json.loads(value)
    assert version == 7 and event["doc_id"] == "docs/a.md" and event["metadata"] == {"k": 1}
    assert "Ünïcode".encode() in value  # not ASCII-escaped on the wire


@pytest.mark.parametrize(
    ("content", "metadata", "doc_id", "why"),
    [
        ("", {}, "a.md", "content is empty"),
        ("  \n ", {}, "a.md", "content is empty"),
        ("\u200b\ufeff\x00 \u200b", {}, "a.md", "content has no tokens"),  # zero-width, BOM, NUL
        ("x" * 4097, {}, "a.md", "over the 4,096-byte limit"),
        ("é" * 2049, {}, "a.md", "4,098 bytes, over the 4,096-byte limit"),  # UTF-8 bytes, not characters
        ("ok", {"blob": "v" * 4097}, "a.md", r"metadata\['blob'\] is 4097 characters long"),
        ("ok", {f"k{i}": i for i in range(65)}, "a.md", "more than 64 keys"),
        ("ok", {}, "transcript:x/y/1", "doc_id may not start with"),
    ],
)
def test_what_the_daemon_would_dead_letter_is_refused_before_sending(
    content: str, metadata: dict[str, object], doc_id: str, why: str
) -> None:
    with pytest.raises(InvalidEvent, match=why):
        _client().document_event(doc_id, content, metadata=metadata)


def test_a_blank_turn_is_refused_and_a_good_one_passes() -> None:
    client = _client()
    turn = {"event_id": "e", "agent_id": "a", "session_id": "s", "turn": 1, "role": "assistant", "metadata": {}}
    with pytest.raises(InvalidEvent, match="content"):
        client.check_event(TranscriptEvent, {**turn, "content": " "})
    assert json.loads(client.check_event(TranscriptEvent, {**turn, "content": "hi"}))["content"] == "hi"


def test_event_topics_take_records_as_large_as_an_ordinary_event() -> None:
    """Kafka's 1 MiB default is below the 4 MiB content limit: the event topics are created
    with twice the limit (8 MiB, the most some managed Kafka services allow), room for the
    largest ordinary text JSON-escaped plus the most metadata an event may carry."""
    topics = Topics()
    limit = event_record_bytes(4 * 1024 * 1024)
    assert limit == 8 * 1024 * 1024 and event_record_bytes(4096) == 1024 * 1024
    line = 'He said "restart the pool" at 18:02.\n'  # quotes and a newline in every line
    text = line * (4 * 1024 * 1024 // len(line))
    metadata = {f"k{i}": "é" * 4096 for i in range(64)}
    _, value = MemoryClient(bootstrap="127.0.0.1:1").document_event("big.md", text, metadata=metadata)
    assert len(value) <= limit
    assert topics.configs(4 * 1024 * 1024, 3_600_000) == {
        topics.documents: {"max.message.bytes": str(limit), "retention.ms": "-1"},
        topics.transcripts: {"max.message.bytes": str(limit), "retention.ms": "-1"},
        topics.requests: {"retention.ms": "3600000", "segment.ms": "3600000"},
        topics.replies: {"retention.ms": "3600000", "segment.ms": "3600000"},
    }


def test_requests_and_replies_are_kept_only_for_their_retention() -> None:
    """Every reply (up to 100 results) would stay in the broker forever: the requests and
    replies topics are created with a retention of their own, an hour by default, and a
    segment of the same length (Kafka deletes only closed segments)."""
    topics = Topics()
    configs = topics.configs(4096, 120_000)
    for t in (topics.requests, topics.replies):
        assert configs[t] == {"retention.ms": "120000", "segment.ms": "120000"}
    assert topics.dlq not in configs  # dead letters stay for the operators


def test_the_event_topics_keep_the_memorys_log_forever_unless_told() -> None:
    """A reindex with a new model replays the documents and transcripts topics: they are
    created to keep every event (-1) or as long as set, never under an hour."""
    kept = Topics().configs(4096, 120_000, 7 * 86_400_000)
    assert kept[Topics().documents]["retention.ms"] == kept[Topics().transcripts]["retention.ms"] == "604800000"
    assert Settings().topic_event_retention_ms == -1
    with pytest.raises(ValidationError, match="at least 3600000"):
        Settings(topic_event_retention_ms=60_000)


def test_an_event_escaped_past_the_record_limit_is_refused_with_its_size() -> None:
    """Control characters take six bytes each in JSON: such content within the content limit
    can still outgrow the topics' records, and the reason must say so (not "raise the topic
    limit", which is already what the daemon sets)."""
    client = _client(max_content_bytes=600 * 1024)
    with pytest.raises(InvalidEvent, match=r"encodes to [\d,]+ bytes, over the 1,228,800-byte record limit"):
        client.document_event("ctl.md", "x" + "\x01" * (500 * 1024))


def test_text_that_is_no_utf_8_is_refused_not_raised() -> None:
    """An undecodable command-line byte arrives as a lone surrogate: a clear refusal, not a
    UnicodeEncodeError traceback."""
    with pytest.raises(InvalidEvent, match="not sendable as UTF-8"):
        _client().document_event("a.md", "ok", metadata={"k": "\udcff"})


def test_a_filter_on_a_number_or_a_boolean_is_sent_as_its_stored_tag_value() -> None:
    """Metadata may store 5 or true; a filter takes strings: the client writes them as the
    daemon stored them, rather than failing with a TypeError."""
    from consumers.encoding import recent_body

    body = recent_body("a", None, 5, {"team": 5, "flag": True, "any": [1.5, "x", False]}, "q")
    assert body["metadata_filter"] == {"team": "5", "flag": "true", "any": ["1.5", "x", "false"]}


async def test_a_call_for_another_tenant_than_the_clients_own_is_refused_before_it_is_sent() -> None:
    """A daemon in topic tenancy answers a tenant only on its own or the shared reply topic: a
    client of tenant acme asking for globex would wait for a reply that never comes here."""
    from memory.errors import InvalidRequest

    acme = MemoryClient(bootstrap="127.0.0.1:1", tenant="acme")
    with pytest.raises(
        InvalidRequest, match=r"tenant 'globex' is answered on its own reply topic.*memory\.replies\.acme"
    ):
        await acme.query("refunds", tenant="globex")
    with pytest.raises(InvalidRequest, match="tenant 'globex'"):
        await acme.publish_document("kb/a.md", "text", tenant="globex", wait=True)
    assert acme._topic("memory.documents", "globex", answered=False) == "memory.documents.globex"  # no reply awaited
    assert acme._topic("memory.requests", None, answered=True) == "memory.requests.acme"
    operator = MemoryClient(bootstrap="127.0.0.1:1")  # reads the shared reply topic, which any tenant may use
    assert operator._topic("memory.requests", "globex", answered=True) == "memory.requests.globex"


def test_a_time_is_a_datetime_an_iso_string_or_an_age() -> None:
    """Every client surface (the client, CLI, MCP tools, explorer, retriever) reads since/until alike."""
    from datetime import UTC, datetime, timedelta

    from consumers.times import when
    from memory.errors import InvalidRequest

    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    assert when("7d", "since", now=now) == now - timedelta(days=7)
    assert when(" 90m ", "since", now=now) == now - timedelta(minutes=90)
    assert when("2026-11-24T09:00:00Z", "until") == datetime(2026, 11, 24, 9, tzinfo=UTC)
    assert when(now, "since") is now and when(None, "since") is None and when("", "since") is None
    with pytest.raises(InvalidRequest, match=r"until takes an ISO 8601 time .* an age .* yesterday .*'last tuesday'"):
        when("last tuesday", "until")
    # A date alone: the whole day, so since=until=that date is the day, not one instant.
    day = datetime(2026, 12, 5)
    assert when("2026-12-05", "since") == day and when("2026-12-05", "--since") == day
    end = datetime(2026, 12, 5, 23, 59, 59, 999_999)
    assert when("2026-12-05", "until") == end and when("2026-12-05", "--until") == end
    assert when("2026-12-05T00:00", "until") == day and when("2026-12-05", "timestamp") == day
    # Named days are UTC days, taken as their dates are; "now" is the instant.
    late = datetime(2026, 12, 6, 23, 30, tzinfo=UTC)
    assert when("yesterday", "since", now=late) == day and when("Yesterday", "--until", now=late) == end
    assert when("today", "since", now=late) == datetime(2026, 12, 6) and when("now", "until", now=late) == late


@pytest.mark.parametrize("age", ["1000000d", "999999999w"])
def test_an_age_beyond_the_calendar_is_an_invalid_request_not_an_overflow(age: str) -> None:
    from consumers.times import when
    from memory.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="since takes"):
        when(age, "since")


async def test_only_a_call_awaiting_an_answer_for_another_tenant_is_refused() -> None:
    """Through the client's own methods: a waited write, or a forget, for another tenant is
    refused before it is sent; a write that waits for nothing goes to that tenant's topic."""
    from memory.errors import InvalidRequest

    acme = MemoryClient(bootstrap="127.0.0.1:1", tenant="acme")
    sent: list[str] = []

    async def publish(topic: str, _value: bytes, _key: str, **_kw: object) -> None:
        sent.append(topic)

    acme._transport.publish = publish  # type: ignore[method-assign]
    with pytest.raises(InvalidRequest, match="tenant 'globex'"):
        await acme.publish_observation(agent_id="a", session_id="s", turn=0, content="hi", tenant="globex", wait=True)
    with pytest.raises(InvalidRequest, match="tenant 'globex'"):
        await acme.forget(agent_id="a", session_id="s", tenant="globex", wait=True)
    with pytest.raises(InvalidRequest, match="tenant 'globex'"):
        await acme.delete_document("kb/a.md", tenant="globex", wait=True)
    assert sent == []
    await acme.publish_document("kb/a.md", "text", tenant="globex")
    await acme.publish_observation(agent_id="a", session_id="s", turn=0, content="hi", tenant="globex")
    assert sent == ["memory.documents.globex", "memory.transcripts.globex"]


def test_an_event_time_is_a_datetime_or_an_iso_string() -> None:
    """As ``query(since=)`` takes one: an ISO string is read as the time it names (naive:
    UTC); a string that is no time is refused as an event the daemon would refuse, not an
    ``AttributeError`` from deep in the encoding."""
    from consumers.encoding import document_body, turn_body

    said = turn_body("a", "s", 1, "hi", "user", None, "2026-10-20T10:00:00Z")
    assert said["timestamp"] == "2026-10-20T10:00:00+00:00"
    assert document_body("d", "c", 1, None, None, "2026-10-20T10:00:00")["timestamp"] == "2026-10-20T10:00:00+00:00"
    with pytest.raises(InvalidEvent, match="timestamp takes an ISO 8601 time"):
        turn_body("a", "s", 1, "hi", "user", None, "last tuesday")


def test_a_doc_id_too_long_is_the_one_error_said() -> None:
    """Without a source the client sends none (the daemon takes the doc id): a doc id over
    1,024 characters was also reported as a source too long, though none was given."""
    from consumers.client import MemoryClient

    client = MemoryClient(bootstrap="127.0.0.1:1")  # never started: the event is checked here
    with pytest.raises(InvalidEvent) as refused:
        client.document_event("x" * 1100, "hi")
    assert "doc_id" in str(refused.value) and "source" not in str(refused.value)
    _, body = client.document_event("kb/a.md", "hi", version=1)
    assert b"source" not in body


@pytest.mark.parametrize(
    "weight", ["dense_weight", "sparse_weight", "identifier_weight", "recency_weight", "speaker_weight"]
)
def test_a_retriever_with_a_negative_weight_is_refused_when_built(weight: str) -> None:
    """As top_k and context_turns are: at once, not at its first query."""
    pytest.importorskip("langchain_core")
    from consumers.langchain_retriever import MemoryRetriever

    client = MemoryClient(bootstrap="127.0.0.1:1")  # never started: nothing connects
    with pytest.raises(ValidationError, match=weight):
        MemoryRetriever(client=client, **{weight: -1.0})


@pytest.mark.parametrize(
    ("ahead_s", "allowed_s", "refused"), [(3600, 300, True), (60, 300, False), (3600, 7200, False)]
)
def test_a_timestamp_ahead_of_the_clients_clock_is_refused_by_the_daemons_allowance(
    ahead_s: int, allowed_s: float, refused: bool
) -> None:
    """The daemon dead-letters a timestamp more than its max_future_s after the record's time,
    which the producer stamps as it sends: the client refuses it first, by the allowance it is
    given (``memory_client()`` passes the daemon's setting), for documents and turns alike."""
    from datetime import UTC, datetime, timedelta

    from consumers.encoding import document_body, turn_body

    at = datetime.now(UTC) + timedelta(seconds=ahead_s)
    client = MemoryClient(bootstrap="127.0.0.1:1", max_future_s=allowed_s)
    for model, payload in (
        (DocumentEvent, document_body("d", "the ledger closes on the 3rd", 1, None, None, at)),
        (TranscriptEvent, turn_body("a", "s", 1, "see you then", "user", None, at)),
    ):
        if refused:
            with pytest.raises(InvalidEvent, match=r"timestamp .* is 60 min \(3600 s\) after this client.s clock"):
                client.check_event(model, payload)
        else:
            assert json.loads(client.check_event(model, payload))["timestamp"] == at.isoformat()


def test_memory_client_takes_the_daemons_timestamp_allowance() -> None:
    """A daemon configured to take timestamps further ahead is not second-guessed by its clients."""
    from daemon.connections import memory_client

    client = memory_client(Settings(ingest={"max_future_s": 7200}))
    assert client._max_future_s == 7200


@pytest.mark.parametrize(
    ("call", "why"),
    [
        ({"metadata_filter": "environment=staging"}, "metadata_filter takes a mapping.*got str"),
        ({"since": 5}, "since takes a datetime or a string, got int"),
        ({"until": ["2026-01-01"]}, "until takes a datetime or a string, got list"),
    ],
)
def test_a_query_argument_of_the_wrong_type_is_an_invalid_request(call: dict[str, object], why: str) -> None:
    """Not an AttributeError from inside the client: the contract's InvalidRequest, naming the argument."""
    from consumers.encoding import query_body

    args: dict[str, object] = {
        "top_k": 5,
        "metadata_filter": None,
        "dense_weight": None,
        "sparse_weight": None,
        "identifier_weight": None,
        "recency_weight": None,
        "rrf_k": None,
        "query_id": None,
        "scope": None,
        "since": None,
        "until": None,
        "context_turns": 0,
    }
    with pytest.raises(InvalidRequest, match=why):
        query_body("x", **{**args, **call})  # type: ignore[arg-type]


def test_get_of_one_id_asks_for_that_id_not_its_letters() -> None:
    """A string is a sequence of strings: get("facts/a") asked for "f", "a", "c", ... each not found."""
    from consumers.encoding import get_body

    assert get_body("facts/ana/home-city", (), None, "q")["doc_ids"] == ["facts/ana/home-city"]
    assert get_body(["a", "b"], (), None, "q")["doc_ids"] == ["a", "b"]


def test_a_weight_that_is_no_number_is_refused_as_such() -> None:
    """NaN failed the bounds with "should be less than or equal to 1000", which says nothing of it."""
    from consumers.requests import HybridParams

    with pytest.raises(ValidationError, match="finite number"):
        HybridParams.model_validate_json(b'{"recency_weight": NaN}')


async def test_a_client_library_stop_that_ends_cancelled_is_a_failed_stop_not_a_traceback() -> None:
    """With the broker gone, aiokafka's stop could end in its own task's CancelledError, which
    replaced the caller's timeout with a traceback; a cancellation of the close itself still
    goes through."""
    import asyncio

    from consumers.kafka_clients import stop_quietly

    class Stops:
        async def stop(self) -> None:
            inner = asyncio.ensure_future(asyncio.sleep(10))
            inner.cancel()
            await inner  # raises CancelledError, as aiokafka's internal task did

    await stop_quietly(Stops(), "reply consumer")  # type: ignore[arg-type]

    class Hangs:
        async def stop(self) -> None:
            await asyncio.sleep(10)

    closing = asyncio.ensure_future(stop_quietly(Hangs(), "producer"))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing


async def test_a_client_that_knows_the_tenancy_refuses_calls_no_daemon_would_read() -> None:
    """In single tenancy a call for tenant acme went to memory.requests.acme, which no daemon
    reads, and timed out blaming the daemon; in topic tenancy a call for no tenant did the same."""
    from daemon.connections import memory_client

    with pytest.raises(InvalidRequest, match="tenant 'acme' needs AGENTMEM_CONSUMER__TENANCY=topic"):
        memory_client(Settings(consumer={"tenancy": "single"}), tenant="acme")
    single = memory_client(Settings(consumer={"tenancy": "single"}))
    with pytest.raises(InvalidRequest, match="tenant 'acme' needs AGENTMEM_CONSUMER__TENANCY=topic"):
        await single.query("refunds", tenant="acme")
    with pytest.raises(InvalidRequest, match="tenant 'acme' needs"):
        await single.publish_document("kb/a.md", "text", tenant="acme", wait=False)
    # The one tenant of single tenancy is the bare topics'.
    assert single._topic("memory.requests", "default", answered=True) == "memory.requests"
    assert memory_client(Settings(consumer={"tenancy": "single"}), tenant="default").tenant is None
    # ... whose turns are counted once, named or not.
    assert single._tenant_of("default") is None and single._tenant_of(None) is None
    topic = memory_client(Settings(consumer={"tenancy": "topic"}))
    with pytest.raises(InvalidRequest, match="name the tenant"):
        await topic.query("refunds")
    assert topic._topic("memory.requests", "acme", answered=False) == "memory.requests.acme"
    # A client built by hand knows no tenancy and refuses neither.
    assert MemoryClient(bootstrap="127.0.0.1:1")._topic("memory.requests", None, answered=True) == "memory.requests"


async def test_an_empty_query_id_or_text_utf_8_cannot_carry_is_an_invalid_request() -> None:
    """An empty query_id was replaced by a random one, though the wire refuses it; a lone
    surrogate raised UnicodeEncodeError from inside the client."""
    client = _client()
    with pytest.raises(InvalidRequest, match="query_id is empty"):
        await client.query("refunds", query_id="")
    with pytest.raises(InvalidRequest, match="not sendable as UTF-8"):
        await client.query("refunds \ud800")
    with pytest.raises(InvalidRequest, match="not sendable as UTF-8"):
        await client.forget(agent_id="agent-\udcff", all_sessions=True)
