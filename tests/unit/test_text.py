"""Query tokenizing, stopwords and escaping for RediSearch."""

from __future__ import annotations

import pytest

from memory.text import bm25_query, escape_tag, escape_term, query_terms, tokenize


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("HTTP 504 gateway timeout", ["http", "504", "gateway", "timeout"]),
        ("ERR_CONN_RESET_4F2A occurred", ["err_conn_reset_4f2a", "occurred"]),
        ("billing-service", ["billing", "service"]),
        ("properties. (see) [x]", ["properties", "see", "x"]),
        ("@service:{x} | *", ["service", "x"]),
        ("-foo \"bar\" 'baz'", ["foo", "bar", "baz"]),
        ("café naïve", ["café", "naïve"]),
        ("tab\tnew\nline\u00a0nbsp", ["tab", "new", "line", "nbsp"]),
        ("", []),
        ("!!! ??? ...", []),
    ],
)
def test_tokenize_splits_like_redisearch(text: str, tokens: list[str]) -> None:
    """Every ASCII punctuation mark but underscore separates terms; text is lowercased."""
    assert tokenize(text) == tokens


def test_query_terms_drop_stopwords_and_duplicates() -> None:
    """Stopwords go (the index keeps none), repeats collapse, order is kept."""
    assert query_terms("is an hip the hip HIP of pool") == ["hip", "pool"]


def test_query_terms_are_bounded() -> None:
    """A huge query is cut to max_terms terms."""
    assert len(query_terms(" ".join(f"w{i}" for i in range(500)), max_terms=64)) == 64


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        ("billing-service", r"billing\-service"),
        ("a b", r"a\ b"),
        ("x} | @kind:{transcript", r"x\}\ \|\ \@kind\:\{transcript"),
        ("*", r"\*"),
        ("wiki/infra.md", r"wiki\/infra\.md"),
        ("plain_1", "plain_1"),
    ],
)
def test_escape_tag_makes_syntax_literal(value: str, escaped: str) -> None:
    """Every non-alphanumeric ASCII character of a TAG value is backslash-escaped."""
    assert escape_tag(value) == escaped


def test_bm25_query_is_an_or_of_escaped_terms() -> None:
    """The BM25 leg ORs terms on the text field."""
    assert bm25_query(["http", "504"]) == "@text:(http|504)"
    assert escape_term("a.b") == r"a\.b"
    with pytest.raises(ValueError):
        bm25_query([])


def test_bm25_query_distributes_a_filter_into_each_term() -> None:
    """A filter is repeated inside each term's group, never wrapped around the OR."""
    assert bm25_query(["a", "b"], within="@h_t:[1 1]") == "(@text:a @h_t:[1 1]) | (@text:b @h_t:[1 1])"
    assert bm25_query(["x.y"], field="idents", within="*") == r"@idents:(x\.y)"
