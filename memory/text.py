"""Query-side text handling for RediSearch: tokenizing, stopwords and escaping.

User text is never sent to RediSearch raw. The BM25 leg is built from tokens that
mirror how RediSearch tokenizes documents (every ASCII punctuation mark except ``_``
separates terms), so ``ERR_CONN_RESET_4F2A`` stays one term while
``billing-service`` becomes ``billing`` and ``service`` on both sides. Whatever a
token still holds that is not a letter, digit or underscore is backslash-escaped, so
query syntax inside user text (``@f:{x} | *``, ``-foo``, quotes, braces) is searched as
words and can never widen or leave the filter.

Stopwords are removed here rather than by the index: the index is created with
``STOPWORDS 0`` because this RediSearch segfaults on an OR group led by two default
stopwords (``(is|an|hip)``).
"""

from __future__ import annotations

import re
import string
import unicodedata

# Lucene's classic English stop set (what BEIR's BM25 baselines use), plus the "s" and "t"
# left over when a possessive or contraction is split at the apostrophe. Measured on SciFact
# through this Redis: 0.6545 nDCG@10 vs 0.6522 with a longer list and 0.648 with none.
STOPWORDS: frozenset[str] = frozenset(
    (
        "a an and are as at be but by for if in into is it no not of on or such that the their "
        "then there these they this to was will with s t"
    ).split()
)

_SEPARATORS = frozenset(set(string.punctuation) - {"_"}) | frozenset(string.whitespace)
_SAFE = re.compile(r"[A-Za-z0-9_]")


def _is_separator(ch: str) -> bool:
    return ch in _SEPARATORS or unicodedata.category(ch)[0] in {"Z", "C"}


def tokenize(text: str) -> list[str]:
    """Split text into lowercase terms the way RediSearch's default tokenizer does.

    Args:
        text: any user or document text.

    Returns:
        Terms in order of appearance, lowercased, possibly repeated.
    """
    tokens: list[str] = []
    current: list[str] = []
    for ch in text:
        if _is_separator(ch):
            if current:
                tokens.append("".join(current).lower())
                current = []
        else:
            current.append(ch)
    if current:
        tokens.append("".join(current).lower())
    return tokens


def query_terms(text: str, *, max_terms: int = 64) -> list[str]:
    """Distinct, non-stopword terms of a query, in first-seen order, at most ``max_terms``.

    Args:
        text: the user's search text.
        max_terms: a bound on the query's size (and cost).

    Returns:
        Terms for the BM25 leg; empty when nothing searchable remains.
    """
    seen: dict[str, None] = {}
    for tok in tokenize(text):
        if tok in STOPWORDS or tok in seen:
            continue
        seen[tok] = None
        if len(seen) >= max_terms:
            break
    return list(seen)


def escape_term(term: str) -> str:
    """Backslash-escape every character of a term that is not ``[A-Za-z0-9_]`` or non-ASCII."""
    return "".join(ch if _SAFE.match(ch) or ord(ch) > 127 else "\\" + ch for ch in term)


def escape_tag(value: str) -> str:
    """Escape a TAG value so that it matches literally inside ``@field:{...}``.

    Every ASCII character that is not a letter, digit or underscore is escaped,
    whitespace included: RediSearch would otherwise read ``|``, ``}``, ``*`` or a space
    as syntax.
    """
    return "".join(ch if _SAFE.match(ch) or ord(ch) > 127 else "\\" + ch for ch in value)


def bm25_query(terms: list[str], *, field: str = "text", within: str = "*") -> str:
    """An OR over escaped terms on one TEXT field, optionally restricted by a filter.

    Unfiltered: ``@text:(http|504|gateway)``. Filtered, the filter is repeated inside each
    term, ``(@text:http F) | (@text:504 F) | …``, never wrapped around the OR. Measured on
    SciFact with this RediSearch (2.10): unfiltered 0.650 nDCG@10, distributed 0.630,
    wrapped 0.519 (a union nested in an intersection is not scored over all its terms).
    Hence the tenant stays out of this query unless tenants share the index.

    Args:
        terms: terms from :func:`query_terms` (must be non-empty).
        field: the TEXT field to search.
        within: a filter fragment (``"*"`` for none).

    Returns:
        A complete RediSearch query.

    Raises:
        ValueError: if ``terms`` is empty (an empty OR group matches nothing useful).
    """
    if not terms:
        raise ValueError("bm25_query needs at least one term")
    escaped = [escape_term(t) for t in terms]
    if within == "*":
        return f"@{field}:(" + "|".join(escaped) + ")"
    return " | ".join(f"(@{field}:{t} {within})" for t in escaped)
