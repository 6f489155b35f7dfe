"""Lookup by id: the get request's rules and its reply (pure)."""

from __future__ import annotations

import json
import random
import re

import pytest

from consumers.queries import parse_request, scope_of
from consumers.reply_fit import _escaped_sizes, fit, fit_get_reply
from consumers.requests import EarlierVersion, GetItem, GetReply, GetRequest, RecentReply
from memory.errors import InvalidRequest


def raw(**over: object) -> bytes:
    return json.dumps({"query_id": "g", "op": "get", **over}).encode()


def test_a_get_is_told_from_a_search_by_its_op() -> None:
    """ "op": "get" parses as a lookup (turns named by where they were said); anything else as a search."""
    req = parse_request(raw(doc_ids=["a", "a"], turns=[{"agent_id": "x/y", "session_id": "s", "turn": 2}]))
    assert isinstance(req, GetRequest)
    assert req.wanted() == ["a", "transcript:x%2Fy/s/2"]
    assert scope_of(raw(doc_ids=["a"])) == "get"
    assert not isinstance(parse_request(b'{"query_id": "q", "search_text": "x"}'), GetRequest)


@pytest.mark.parametrize(
    ("over", "fragment"),
    [
        ({}, "1..100"),
        ({"doc_ids": [f"d{n}" for n in range(101)]}, "1..100"),
        ({"doc_ids": [""]}, "doc_ids"),
        ({"doc_ids": "a"}, "doc_ids"),
        ({"turns": [{"agent_id": "a", "session_id": "s", "turn": -1}]}, "turn"),
        ({"doc_ids": ["a"], "search_text": "x"}, "search_text"),
    ],
)
def test_bad_gets_are_refused_with_the_reason(over: dict[str, object], fragment: str) -> None:
    """No ids, too many, bad ids or turns, or a search's field: an invalid request naming the problem."""
    with pytest.raises(InvalidRequest, match=fragment.replace(".", r"\.")):
        parse_request(raw(**over))


def size(reply: GetReply) -> int:
    return len(json.dumps(reply.model_dump(mode="json")))


def test_a_get_reply_too_large_for_one_record_keeps_every_item_and_cuts_the_long_contents() -> None:
    """Every item stays: the contents are cut to one length, the longest that fits, so short
    ones stay whole and long ones share the rest, each saying so; none is left off."""
    contents = ["short one", "x" * 20_000, "é" * 40 + "medium " * 30, "y" * 9_000, ""]
    items = [GetItem(doc_id=f"d{n}", status="found", content=c) for n, c in enumerate(contents)]
    items.append(GetItem(doc_id="gone", status="not_found"))
    reply = GetReply(query_id="g", items=items, took_ms=1.0)
    fitted = fit_get_reply(reply, 8_000)
    assert size(fitted) <= 8_000 and not fitted.truncated
    assert [i.doc_id for i in fitted.items] == [i.doc_id for i in items]
    kept = [i.content for i in fitted.items]
    assert kept[0] == contents[0] and kept[2] == contents[2] and kept[4] == "" and kept[5] is None
    assert len(kept[1] or "") == len(kept[3] or "") > 3_000  # the two long ones share the rest alike
    assert [i.content_truncated for i in fitted.items] == [False, True, False, True, False, False]
    assert contents[1].startswith(kept[1] or "-") and contents[3].startswith(kept[3] or "-")
    # The longest cut that fits: one character more each would not.
    n = len(kept[1] or "")
    padded = [*contents, ""]  # the item not found has no content
    more = [
        i.model_copy(update={"content": c[: n + 1]}) if len(c) > n else i for i, c in zip(items, padded, strict=True)
    ]
    assert size(fitted.model_copy(update={"items": more})) > 8_000
    assert fit_get_reply(reply, 100_000) == reply  # what fits is left alone


def test_items_are_left_off_only_when_their_other_fields_do_not_fit() -> None:
    meta = {"note": "m" * 900}
    items = [GetItem(doc_id=f"d{n}", status="found", content="x" * 1000, metadata=meta) for n in range(10)]
    fitted = fit_get_reply(GetReply(query_id="g", items=items, took_ms=1.0), 4000)
    assert 0 < len(fitted.items) < 10 and fitted.truncated and size(fitted) <= 4000
    assert [i.doc_id for i in fitted.items] == [f"d{n}" for n in range(len(fitted.items))]
    whole = fit_get_reply(GetReply(query_id="g", items=items[:1], took_ms=1.0), 4000)
    assert not whole.truncated and len(whole.items) == 1


def test_recent_turns_too_large_for_one_record_keep_the_newest() -> None:
    """A recent read is oldest first: cut to fit, it drops its oldest turns, not its newest."""
    items = [GetItem(doc_id=f"t{n}", status="found", content="x" * 1000) for n in range(10)]
    fitted = fit_get_reply(RecentReply(query_id="r", items=items, took_ms=1.0), 4000)
    assert fitted.truncated and 0 < len(fitted.items) < 10 and fitted.items[-1].doc_id == "t9"
    assert [i.doc_id for i in fitted.items] == [f"t{n}" for n in range(10 - len(fitted.items), 10)]
    assert parse_request(b'{"query_id": "r", "op": "recent", "agent_id": "a"}').limit == 20  # type: ignore[union-attr]
    assert scope_of(b'{"query_id": "r", "op": "recent", "agent_id": "a"}') == "recent"


def test_the_newest_turn_too_large_alone_keeps_the_start_of_its_content() -> None:
    """A recent read's one turn left (the newest) is cut, not dropped: the reply fits, keeps
    the start of the content, and both flags say so; an ASCII cut wastes little."""
    items = [GetItem(doc_id=f"t{n}", status="found", content="é" * 2000 + f"{n}" * 9000) for n in range(3)]
    fitted = fit_get_reply(RecentReply(query_id="r", items=items, took_ms=1.0), 8000)
    assert len(fitted.items) == 1 and fitted.truncated and fitted.items[0].content_truncated
    kept = fitted.items[0]
    assert kept.doc_id == "t2" and kept.content and (items[2].content or "").startswith(kept.content)
    assert size(fitted) <= 8000
    for reply in (GetReply, RecentReply):
        ascii_only = fit_get_reply(
            reply(query_id="r", items=[GetItem(doc_id="d", status="found", content="x" * 9000)], took_ms=1.0), 8000
        )
        assert 7900 < size(ascii_only) <= 8000
        assert ascii_only.items[0].content_truncated and not ascii_only.truncated  # no item was left off
        assert not fit_get_reply(reply(query_id="r", items=items[:1], took_ms=1.0), 100_000).items[0].content_truncated


def test_a_cut_content_is_the_same_whatever_follows_what_was_read() -> None:
    """A lookup may read only as much of long documents as any cut keeps (``Lookups.lookup``):
    the cut of contents longer than that is the same as the cut of those contents read whole."""
    long = "é" * 3000 + "x" * 20_000
    other = 'ab"c\n\x7f' * 2000
    for budget, reads in ((8000, (9000, 8001, 12_345)), (30_000, (16_000, 20_000))):
        for read in reads:
            cuts = [
                fit_get_reply(
                    GetReply(
                        query_id="r",
                        items=[GetItem(doc_id=f"d{i}", status="found", content=c) for i, c in enumerate(contents)],
                        took_ms=1.0,
                    ),
                    budget,
                )
                for contents in ([long, "short", other], [long[:read], "short", other[:read]])
            ]
            assert cuts[0] == cuts[1], (budget, read)


def test_the_escaped_size_of_each_prefix_is_what_json_takes() -> None:
    """Every ASCII and Latin-1 character, a lone surrogate, and characters past the Basic
    Multilingual Plane, in a shuffled order."""
    points = [*range(0x180), 0x2028, 0xD800, 0xDFFF, 0xFFFF, 0x10000, 0x1F600, 0x10FFFF]
    text = "".join(chr(p) for p in random.Random(7).sample(points * 3, 3 * len(points)))
    sizes = _escaped_sizes(text)
    assert [int(n) for n in sizes] == [len(json.dumps(text[:k])) - 2 for k in range(len(text) + 1)]


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"doc_ids": ["a", "b"], "content_offset": 10}, "read one item"),
        ({"doc_ids": ["a"], "turns": [{"agent_id": "a", "session_id": "s", "turn": 1}], "version": 2}, "read one"),
        ({"turns": [{"agent_id": "a", "session_id": "s", "turn": 1}], "version": 2}, "a turn has none"),
        ({"doc_ids": ["transcript:a/s/1"], "version": 0}, "a turn has none"),
        ({"doc_ids": ["a"], "version": 2, "history": True}, "ask for history without it"),
        ({"doc_ids": ["a"], "content_offset": -1}, "content_offset"),
        ({"doc_ids": ["a"], "version": "2"}, "version"),
    ],
)
def test_reading_on_names_one_item(over: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        parse_request(raw(**over))
    req = parse_request(raw(doc_ids=["a"], content_offset=5, version=2))
    assert isinstance(req, GetRequest) and (req.content_offset, req.version) == (5, 2)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('"' + "x" * 600 + '"', "metadata_filter['team']: values are 1..512 characters; one is 600"),
        ("5", "metadata_filter['team']: values are strings or lists of strings, not int"),
        ('["a", {}]', "metadata_filter['team']: values are strings or lists of strings, not dict"),
        (
            '{"ne": "a"}',
            "metadata_filter['team']: an object's one key is 'not' (values none of which may match), not 'ne'",
        ),
        ('{"not": 5}', "metadata_filter['team']['not']: values are strings or lists of strings, not int"),
        ('{"not": ["a", ""]}', "metadata_filter['team']['not']: values are 1..512 characters; one is 0"),
    ],
)
def test_a_bad_filter_value_is_named_in_one_reason(value: str, says: str) -> None:
    """Not the failure of each shape a value may take (a string, or a list of strings)."""
    for op in ('"search_text": "x"', '"op": "recent", "agent_id": "a"', '"op": "get", "doc_ids": ["d"]'):
        body = f'{{"query_id": "q", {op}, "metadata_filter": {{"team": {value}}}}}'.encode()
        with pytest.raises(InvalidRequest) as refused:
            parse_request(body)
        assert says in str(refused.value) and "list[" not in str(refused.value), refused.value


def test_an_exclusion_is_a_filter_value() -> None:
    """``{"not": value or values}`` parses for a search, ``get`` and ``recent`` alike."""
    for op in ('"search_text": "x"', '"op": "recent", "agent_id": "a"', '"op": "get", "doc_ids": ["d"]'):
        flt = '{"team": {"not": ["a", "b"]}, "env": {"not": "prod"}, "svc": "s"}'
        req = parse_request(f'{{"query_id": "q", {op}, "metadata_filter": {flt}}}'.encode())
        assert req.metadata_filter == {"team": {"not": ["a", "b"]}, "env": {"not": "prod"}, "svc": "s"}


@pytest.mark.parametrize(("op", "shown"), [('"search"', "'search'"), ('["get"]', "of type list"), ("7", "of type int")])
def test_an_unknown_op_names_the_ops_there_are(op: str, shown: str) -> None:
    with pytest.raises(
        InvalidRequest, match=f"unknown op {re.escape(shown)}: a request is a search .* get, recent or list"
    ):
        parse_request(f'{{"query_id": "q", "op": {op}, "search_text": "x"}}'.encode())


def test_earlier_versions_go_first_oldest_of_the_largest_first_when_a_reply_is_too_large() -> None:
    def earlier(v: int, size: int) -> EarlierVersion:
        return EarlierVersion(version=v, content=f"v{v} " + "x" * size, source="d", metadata={})

    small = GetItem(doc_id="small", status="found", content="now", history=[earlier(v, 100) for v in (3, 2, 1)])
    large = GetItem(doc_id="large", status="found", content="now", history=[earlier(v, 4000) for v in (3, 2, 1)])
    reply = GetReply(query_id="g", items=[large, small], took_ms=1.0)
    fitted = fit_get_reply(reply, 6_000)
    assert len(json.dumps(fitted.model_dump(mode="json"))) <= 6_000
    kept_large, kept_small = fitted.items
    # Every item stays; the large one's oldest versions lose their contents (their numbers and
    # times stay, to be read on their own), the small one keeps all of its.
    assert not fitted.truncated and [i.content for i in fitted.items] == ["now", "now"]
    assert [v.version for v in kept_large.history or []] == [3, 2, 1] and kept_large.history_truncated
    assert [v.content_truncated for v in kept_large.history or []] == [False, True, True]
    assert [v.content for v in kept_large.history or []][1:] == ["", ""]
    assert [v.version for v in kept_small.history or []] == [3, 2, 1] and not kept_small.history_truncated
    assert not any(v.content_truncated for v in kept_small.history or [])
    assert fit_get_reply(reply, 100_000) == reply  # what fits is left alone
    # Past every version's content, every version goes, then the contents are cut.
    tight = fit_get_reply(reply, 540)
    assert size(tight) <= 540 and [i.history for i in tight.items] == [[], []] and not tight.truncated
    assert [i.content for i in tight.items] == ["now", "now"]


def test_earlier_versions_go_before_any_content_is_cut() -> None:
    """The contents asked for come first: the kept items' versions go before their contents are cut."""
    earlier = EarlierVersion(version=1, content="v1 " * 1000, source="s", metadata={}, timestamp=None, until=None)
    med = GetItem(doc_id="med", status="found", version=2, content="v2 " * 1000, history=[earlier])
    big = GetItem(doc_id="big", status="found", version=1, content="x" * 20_000)
    fitted = fit_get_reply(GetReply(query_id="g", items=[med, big], took_ms=1.0), 10_000)
    assert [i.doc_id for i in fitted.items] == ["med", "big"] and not fitted.truncated
    (emptied,) = fitted.items[0].history or []
    assert (emptied.version, emptied.content, emptied.content_truncated) == (1, "", True)
    assert fitted.items[0].history_truncated
    assert fitted.items[0].content == med.content and not fitted.items[0].content_truncated
    assert fitted.items[1].content_truncated and len(fitted.items[1].content or "") > 6_000
    # With room for the versions and every content, nothing goes.
    assert fit_get_reply(GetReply(query_id="g", items=[med], took_ms=1.0), 10_000).items[0].history == [earlier]


def test_a_reply_is_cut_the_same_however_long_it_took() -> None:
    item = GetItem(doc_id="d", status="found", content="é" * 3000 + "x" * 20_000)
    cuts = [fit(GetReply(query_id="g", items=[item], took_ms=t), 8000) for t in (0.9, 12.345, 123456.789)]
    assert len({c.items[0].content for c in cuts}) == 1  # type: ignore[union-attr]
    assert [c.took_ms for c in cuts] == [0.9, 12.345, 123456.789]
    assert all(len(json.dumps(c.model_dump(mode="json"))) <= 8000 for c in cuts)
