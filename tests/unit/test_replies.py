"""The reply_partition header: parsed (pure), and checked against a topic's partition count."""

from __future__ import annotations

import json
import re

import pytest

from consumers.error_replies import REPLY_CODES, reply_code
from consumers.errors import TenantErased
from consumers.replies import (
    PartitionCounts,
    UnknownReplyTopic,
    check_reply_to,
    default_reply_topic,
    parse_reply_partition,
    reply_partition,
)
from consumers.reply_fit import fit_reply
from consumers.requests import QueryReply, ResultItem
from memory.errors import BackendUnavailable, EmbedderError, InvalidRequest, MemdError, NotFound, QueryRefused
from memory.index import IndexError_, QuerySyntaxError


@pytest.mark.parametrize(
    ("headers", "want"),
    [
        (None, None),
        ([], None),
        ([("reply_to", b"memory.replies")], None),
        ([("reply_partition", b"0")], 0),
        ([("reply_partition", b" 12 ")], 12),
        ([("reply_to", b"x"), ("reply_partition", b"3")], 3),
    ],
)
def test_parses_a_partition_number(headers: list[tuple[str, bytes]] | None, want: int | None) -> None:
    assert parse_reply_partition(headers) == want


@pytest.mark.parametrize("value", [b"", b"-1", b"1.0", b"one", b"\xff\xfe", b"\xd9\xa3", b"9" * 10, b"1 2"])
def test_garbage_is_an_invalid_request(value: bytes) -> None:
    with pytest.raises(InvalidRequest, match="reply_partition header"):
        parse_reply_partition([("reply_partition", value)])


class _Counts(PartitionCounts):
    """A topic's partition count as the broker would say it, first stale, then refreshed."""

    def __init__(self, cached: int, fresh: int) -> None:
        super().__init__("unused:9092")
        self.cached, self.fresh, self.asked = cached, fresh, 0

    async def count(self, topic: str, *, refresh: bool = False) -> int:
        self.asked += 1
        return self.fresh if refresh else self.cached


async def test_no_header_asks_nothing() -> None:
    counts = _Counts(2, 2)
    assert await reply_partition([("reply_to", b"r")], "r", counts) is None and counts.asked == 0


async def test_a_partition_beyond_the_cached_count_is_looked_up_again() -> None:
    assert await reply_partition([("reply_partition", b"3")], "r", _Counts(cached=2, fresh=4)) == 3
    with pytest.raises(InvalidRequest, match="has 2 partition"):
        await reply_partition([("reply_partition", b"2")], "r", _Counts(cached=2, fresh=2))
    counts = _Counts(cached=4, fresh=4)
    assert await reply_partition([("reply_partition", b"1")], "r", counts) == 1 and counts.asked == 1


INPUTS = ("memory.documents", "memory.transcripts", "memory.requests", "memory.dlq")


def test_the_default_reply_topic_is_per_tenant_in_topic_tenancy() -> None:
    """A shared default would hand one tenant's chunks to every reader of it."""
    assert default_reply_topic("memory.replies", "single", "default") == "memory.replies"
    assert default_reply_topic("memory.replies", "topic", "acme") == "memory.replies.acme"
    assert default_reply_topic("memory.replies", "topic", None) == "memory.replies"


@pytest.mark.parametrize(
    "topic", ["memory.documents", "memory.requests", "memory.dlq", "memory.transcripts.acme", "bad name", "", "a" * 250]
)
def test_replies_never_go_to_inputs_or_invalid_names(topic: str) -> None:
    """A reply published to an input would be read back as an event, a request or a dead letter."""
    with pytest.raises(UnknownReplyTopic):
        check_reply_to(topic, INPUTS)


@pytest.mark.parametrize("topic", ["memory.replies", "memory.replies.acme", "agent-7.replies", "memory.documentsX"])
def test_other_valid_topics_may_take_replies(topic: str) -> None:
    """Only the inputs and their tenant topics are refused; any other valid name is the asker's choice."""
    assert check_reply_to(topic, INPUTS) is None
    with pytest.raises(UnknownReplyTopic, match="input topics"):  # the same name is refused once it is an input
        check_reply_to(topic, [*INPUTS, topic])


@pytest.mark.parametrize(
    ("topic", "allowed"),
    [
        ("memory.replies.acme", True),
        ("memory.replies.acme.agent-7", True),
        ("agent-7.replies", True),  # outside the namespace: the deployment's to name and protect
        ("memory.replies.evil", False),
        ("memory.replies.evil.x", False),
        ("memory.replies.acmecorp", False),  # a tenant whose name starts with this one's
        ("memory.replies.acmecorp.x", False),
        ("memory.replies", True),  # the shared one: an operator's client for every tenant reads it
    ],
)
def test_in_topic_tenancy_replies_never_go_to_another_tenants_reply_topics(topic: str, allowed: bool) -> None:
    """A tenant's reply_to may not name another tenant's reply topic, which the daemon, writing
    with its own credentials, would fill (4.5 MB from 280 bytes of requests)."""
    if allowed:
        assert check_reply_to(topic, INPUTS, own="memory.replies.acme", replies="memory.replies") is None
    else:
        with pytest.raises(UnknownReplyTopic, match="another tenant's reply topic"):
            check_reply_to(topic, INPUTS, own="memory.replies.acme", replies="memory.replies")
    # A record of no tenant (the bare topic, which the daemon reads in topic tenancy): its
    # reply goes under no tenant's topic, the shared one and outside ones only.
    shared = topic in ("memory.replies", "agent-7.replies")
    if shared:
        assert check_reply_to(topic, INPUTS, own=None, replies="memory.replies") is None
    else:
        with pytest.raises(UnknownReplyTopic, match="is a tenant's reply topic"):
            check_reply_to(topic, INPUTS, own=None, replies="memory.replies")


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (InvalidRequest("top_k"), "invalid_request"),
        (BackendUnavailable("redis down"), "unavailable"),
        (NotFound("index 'agentmem' has no generation yet"), "unavailable"),
        (IndexError_("redis error during text search: no such index"), "unavailable"),
        (QuerySyntaxError("redis could not parse the query during text search: Syntax error"), "internal"),
        (EmbedderError("query embedding failed"), "unavailable"),
        (QueryRefused("this query crashed the embedding worker: refused"), "invalid_request"),
        (TenantErased("acme"), "tenant_erased"),
        (MemdError("something else"), "internal"),
    ],
)
def test_error_replies_carry_only_the_contracts_codes(exc: MemdError, code: str) -> None:
    """Askers switch on the contract's codes; internal error types never leak into replies."""
    assert reply_code(exc) == code and code in REPLY_CODES


def test_tenant_topic_subscriptions_match_only_their_own_topics() -> None:
    """The pattern the client matches topics with takes the base's dots literally, and the bare
    topic too (its records are refused with a reason, not left unread)."""
    from faststream._internal.utils.path import Address
    from faststream.kafka.subscriber.usecase import KAFKA_ADDRESS_SYNTAX

    from consumers.routers import tenant_pattern

    address = Address(tenant_pattern("memory.requests"), KAFKA_ADDRESS_SYNTAX).broker_address
    assert re.match(address, "memory.requests.acme")
    assert re.match(address, "memory.requests")
    assert not re.match(address, "memoryXrequestsYz")
    assert not re.match(address, "memory.requests-x")
    assert not re.match(address, "memory.requestsXacme")
    assert not re.match(address, "memory.replies.acme")


def _reply(sizes: list[int]) -> QueryReply:
    items = [
        ResultItem(
            chunk_id=f"d{i}_p0",
            rrf_score=1.0 / (i + 1),
            text="é" * size,  # escaped by json.dumps: 6 bytes each
            source="s",
            doc_id=f"d{i}",
            kind="document",
            metadata={},
            ranks={"bm25": i + 1},
        )
        for i, size in enumerate(sizes)
    ]
    return QueryReply(query_id="q", total_retrieved=len(items), results=items, took_ms=1.0)


@pytest.mark.parametrize(
    ("sizes", "max_bytes", "kept"),
    [
        ([10, 10, 10], 100_000, 3),  # fits: returned as it is
        ([5_000, 5_000, 5_000, 5_000], 40_000, 1),  # each ~30 KB as JSON: only the best fits
        ([100, 100, 20_000, 100], 40_000, 2),  # one huge result: it and what follows it go
        ([50_000], 40_000, 0),  # nothing fits: an empty, truncated reply
    ],
)
def test_a_reply_too_big_keeps_the_best_results_that_fit(sizes: list[int], max_bytes: int, kept: int) -> None:
    """Results are left off the end, never the best first, until the JSON fits; ``truncated``
    and ``total_retrieved`` say what was kept."""
    reply = _reply(sizes)
    fitted = fit_reply(reply, max_bytes)
    assert [r.chunk_id for r in fitted.results] == [r.chunk_id for r in reply.results[:kept]]
    assert fitted.total_retrieved == kept
    assert fitted.truncated == (kept < len(sizes))
    assert len(json.dumps(fitted.model_dump(mode="json"))) <= max_bytes


def test_a_reply_whose_sections_make_it_too_big_is_cut_too() -> None:
    """The bound that skips encoding counts each result's section: results whose texts fit but
    whose long sections do not are cut, never published over the limit."""
    reply = _reply([10] * 20)
    reply = reply.model_copy(update={"results": [r.model_copy(update={"section": "é" * 300}) for r in reply.results]})
    fitted = fit_reply(reply, 30_000)
    assert fitted.truncated and len(json.dumps(fitted.model_dump(mode="json"))) <= 30_000


def _with_context(n: int, turns: int, chars: int) -> QueryReply:
    from consumers.requests import ContextTurn

    reply = _reply([50] * n)
    around = [
        ContextTurn(doc_id=f"transcript:a/s/{t}", turn=t, role="user", text="x" * chars, timestamp=None)
        for t in range(turns)
    ]
    return reply.model_copy(update={"results": [r.model_copy(update={"context": around}) for r in reply.results]})


def test_results_whose_context_does_not_fit_are_kept_without_it() -> None:
    """A reply whose results fit but whose context turns do not keeps the results, the first
    ones with their context while it fits and the rest without it, and says it was cut."""
    reply = _with_context(10, turns=4, chars=5_000)  # each result ~20 KB with its context
    fitted = fit_reply(reply, 50_000)
    assert [r.chunk_id for r in fitted.results] == [r.chunk_id for r in reply.results]
    assert [r.context is not None for r in fitted.results][:2] == [True, True]
    assert fitted.results[-1].context is None and fitted.truncated
    assert len(json.dumps(fitted.model_dump(mode="json"))) <= 50_000


@pytest.fixture
def encoded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of what ``consumers.reply_fit`` encodes to JSON while the test runs."""
    import consumers.reply_fit as reply_fit

    sizes: list[int] = []
    real = json.dumps

    def counting(obj: object) -> str:
        out = real(obj)
        sizes.append(len(out))
        return out

    monkeypatch.setattr(reply_fit, "json", type("Json", (), {"dumps": staticmethod(counting)}))
    return sizes


def test_fitting_encodes_about_what_it_keeps_not_the_reply_again_for_each_result_left_off(encoded: list[int]) -> None:
    """30 results with 100 KB of context each, fitted to 100 KB: what is encoded to decide is
    within a few times the budget (encoding the whole reply again after each result left off
    was 30 times the reply, and held the event loop for seconds at real sizes)."""
    fitted = fit_reply(_with_context(30, turns=5, chars=20_000), 100_000)
    assert fitted.truncated and fitted.results
    assert sum(encoded) <= 3 * 100_000
    assert len(json.dumps(fitted.model_dump(mode="json"))) <= 100_000


def test_a_get_of_large_items_encodes_each_once(encoded: list[int]) -> None:
    """Eight items of 200 KB fitted to 500 KB: the reply is encoded whole once (to see whether
    earlier versions must go), each item once to size it and the cut reply once, not the whole
    reply again for each length tried; every item is kept, each cut to the same length."""
    from consumers.reply_fit import fit_get_reply
    from consumers.requests import GetItem, GetReply

    items = [GetItem(doc_id=f"d{i}", status="found", content="x" * 200_000) for i in range(8)]
    fitted = fit_get_reply(GetReply(query_id="q", items=items, took_ms=1.0), 500_000)
    assert [i.doc_id for i in fitted.items] == [f"d{i}" for i in range(8)] and not fitted.truncated
    assert all(i.content_truncated for i in fitted.items) and len({i.content for i in fitted.items}) == 1
    assert sum(encoded) <= 8 * 200_000 + 2 * 500_000


def test_results_come_before_their_context() -> None:
    """100 results whose context turns would each take 120 KB, fitted to 900 KB: every result
    is kept, and the first ones carry their context with the room left (context first left
    57 of them out)."""
    fitted = fit_reply(_with_context(100, turns=2, chars=60_000), 900_000)
    assert fitted.total_retrieved == 100 and fitted.truncated
    with_context = [r.context is not None for r in fitted.results]
    assert with_context[:5] == [True] * 5 and not any(with_context[10:])
    assert with_context == sorted(with_context, reverse=True)  # the best results get it
    assert len(json.dumps(fitted.model_dump(mode="json"))) <= 900_000
