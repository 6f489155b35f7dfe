"""The ``list`` request op: its rules, its reply's fitting, and the filter expression (pure)."""

from __future__ import annotations

import json

import pytest

from consumers.queries import parse_request, scope_of
from consumers.reply_fit import fit_list_reply
from consumers.requests import ListReply, ListRequest
from memory.errors import InvalidRequest
from memory.index.listings import expression_string


def raw(**over: object) -> bytes:
    return json.dumps({"query_id": "l", "op": "list", **over}).encode()


def test_a_list_is_told_by_its_op_with_defaults() -> None:
    req = parse_request(raw())
    assert isinstance(req, ListRequest)
    assert (req.field, req.source_prefix, req.limit, req.offset) == ("doc_id", "", 100, 0)
    assert scope_of(raw()) == "list"


@pytest.mark.parametrize(
    ("over", "fragment"),
    [
        ({"field": "metadata"}, "field"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"offset": -1}, "offset"),
        ({"source_prefix": "a\x00"}, "source_prefix"),
        ({"metadata_filter": {"service": "x"}}, "metadata_filter"),
    ],
)
def test_bad_lists_are_refused_with_the_reason(over: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidRequest, match=fragment):
        parse_request(raw(**over))


def test_a_list_reply_too_large_is_cut_and_says_so() -> None:
    reply = ListReply(query_id="l", values=[f"{n:04d}" + "x" * 1000 for n in range(1000)], took_ms=1.0)
    fitted = fit_list_reply(reply, 100_000)
    assert fitted.truncated and 0 < len(fitted.values) < 1000
    assert fitted.values == reply.values[: len(fitted.values)]
    assert len(json.dumps(fitted.model_dump(mode="json"))) <= 100_000
    assert fit_list_reply(ListReply(query_id="l", values=["a"], took_ms=1.0), 1000).truncated is False


def test_expression_strings_quote_backslashes_and_quotes() -> None:
    assert expression_string('a"b\\c') == '"a\\"b\\\\c"'
