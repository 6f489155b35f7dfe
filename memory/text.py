"""Text analysis for the BM25 leg (both sides) and escaping for RediSearch queries.

One analyzer, :func:`analyze`, turns text into BM25 terms for chunks (the ``terms``
field, written by ``memory.index``) and for queries alike: tokenize the way RediSearch
does (every ASCII punctuation mark except ``_`` separates terms, so
``ERR_CONN_RESET_4F2A`` stays one term while ``billing-service`` becomes ``billing``
and ``service``), drop stopwords, and stem purely alphabetic terms with Snowball English
(``timeouts`` and ``timeout`` both give ``timeout``; ``apoe4``, ``il_6`` and other
identifier-like terms are kept whole). The ``terms`` field is ``NOSTEM`` and queried
``VERBATIM``, so RediSearch adds no analysis of its own.

Why not RediSearch's own stemming: it indexes each word both as written and as a
``+stem`` entry and expands each query word into a union of the two, so a document using
the query's exact word is scored for both entries while one using another form of it
scores once (and each entry has its own IDF). That is not BM25 over stems. Measured on
SciFact (chunks, BM25STD, this RediSearch 2.10): its stemming 0.648 nDCG@10, no stemming
at all 0.646, our Snowball English terms 0.682 (Porter, as Anserini uses: 0.682 too;
stemming every token rather than alphabetic ones only: the same 0.684 with ``idents``).

User text is never sent to RediSearch raw: whatever a term still holds that is not an
ASCII letter or digit is backslash-escaped, so query syntax inside user text
(``@f:{x} | *``, ``-foo``, quotes, braces) is searched as words and can never widen or
leave the filter. That includes ``_``: a lone ``_`` term (``"what does _ mean"``) is a
syntax error to this RediSearch; escaped, it is searched like any term.

Terms are cut to 128 UTF-8 bytes (:data:`MAX_TERM_BYTES`), as RediSearch cuts the tokens it
indexes: uncut, a longer query term never matched the chunk it came from.

Stopwords are removed here rather than by the index: the index is created with
``STOPWORDS 0`` because this RediSearch segfaults on an OR group led by two default
stopwords (``(is|an|hip)``).
"""

from __future__ import annotations

import functools
import re
import string
import threading
import unicodedata
from collections.abc import Iterator

import snowballstemmer

# Lucene's classic English stop set (what BEIR's BM25 baselines use), plus the "s" and "t"
# left over when a possessive or contraction is split at the apostrophe. Measured on SciFact
# with RediSearch's stemming: 0.6545 nDCG@10 vs 0.6522 with a longer list and 0.648 with none.
# With our analysis (the terms field): 0.6928, Lucene's set alone 0.6932, none 0.6948; kept
# anyway, since an OR with "the" or "of" walks nearly every chunk's postings.
STOPWORDS: frozenset[str] = frozenset(
    (
        "a an and are as at be but by for if in into is it no not of on or such that the their "
        "then there these they this to was will with s t"
    ).split()
)

_SEPARATORS = frozenset(set(string.punctuation) - {"_"}) | frozenset(string.whitespace)
_SAFE = re.compile(r"[A-Za-z0-9]")

#: RediSearch indexes at most this many bytes of a token; longer ones are cut.
MAX_TERM_BYTES = 128

#: The version of what the analysis writes into an index: this module's BM25 terms and
#: ``memory.identifiers``' identifiers. Part of every generation's spec, so that after a
#: change to either, daemons refuse a generation analyzed the old way (their queries would
#: no longer match its terms) and ``agentmemd reindex`` re-analyzes rather than copying old
#: chunks over verbatim. ``tests/unit/test_text.py`` holds a digest of the analysis of a
#: fixed text per version: a change to the analysis fails it until this is bumped.
ANALYZER_VERSION = 3
# Words joined by ASCII hyphens: "IL-6", "e-mail", "state-of-the-art", "x-ray-based".
# Anchored at a word start: unanchored, a long run of word characters with no hyphen was
# retried from every position inside it (quadratic: 19 s for one 40,000-character word).
_COMPOUND = re.compile(r"\b\w+(?:-\w+)+")


def _is_separator(ch: str) -> bool:
    return ch in _SEPARATORS or unicodedata.category(ch)[0] in {"Z", "C"}


def tokenize(text: str) -> list[str]:
    """Split text into lowercase terms the way RediSearch's default tokenizer does.

    Args:
        text: any user or document text.

    Returns:
        Terms in order of appearance, lowercased, possibly repeated.
    """
    return list(iter_tokens(text))


def iter_tokens(text: str) -> Iterator[str]:
    """:func:`tokenize`'s terms one at a time, so a reader that needs only the first few
    (a long query's first distinct terms) does not split the rest."""
    return (tok.lower() for tok in _iter_written(text))


def _iter_written(text: str) -> Iterator[str]:
    # The tokens as written: word_parts needs their case.
    current: list[str] = []
    for ch in text:
        if _is_separator(ch):
            if current:
                yield "".join(current)
                current = []
        else:
            current.append(ch)
    if current:
        yield "".join(current)


#: The longest token :func:`word_parts` splits: longer ones are keys, hashes or blobs.
MAX_NAME_CHARS = 64


def word_parts(token: str) -> list[str]:
    """The words inside one token written as code writes names, lowercased: ``max_retries``
    gives ``max`` and ``retries``, ``getUserById`` gives ``get``, ``user``, ``by`` and ``id``,
    ``HTTPServer`` gives ``http`` and ``server``.

    A token splits at ``_`` and where a capitalized word starts inside it (after a lower-case
    letter, or after an upper-case run of two letters or more); never between letters and
    digits, so ``ERR_CONN_RESET_4F2A`` gives ``4f2a`` whole. Acronyms with a lower-case
    letter are no names: ``mRNA``, ``miRNA``, ``RNAs``, ``MSCs`` and ``kappaB`` give nothing.
    Parts of one character are left out (``iPhone`` gives ``phone``). A token with nothing
    to split gives nothing, and so does what is no name: a token longer than
    :data:`MAX_NAME_CHARS`, or one with digits in two parts or more (a JWT's ``eyJhbGciOiJI…``
    would give ``ey``, ``me``, ``ad``, and match every turn that says "me").

    Args:
        token: one token of :func:`_iter_written`, in its written case.

    Returns:
        The parts in order, possibly repeated; empty when the token is one word.
    """
    if "_" not in token and (token.islower() or token.isupper() or token[1:].islower()):
        return []  # the common case, a word in any of its usual cases, costs no walk
    if len(token) > MAX_NAME_CHARS:
        return []
    parts: list[str] = []
    for piece in token.split("_"):
        start = 0
        for i in range(1, len(piece)):
            if _turns_case(piece, i):
                parts.append(piece[start:i].lower())
                start = i
        parts.append(piece[start:].lower())
    if len(parts) == 1 or sum(any(c.isdigit() for c in p) for p in parts) > 1:
        return []  # one word; or a key or hash (digits in its parts), whose pieces are no words
    return [p for p in parts if len(p) > 1]


def _turns_case(word: str, i: int) -> bool:
    # Where a capitalized word starts: after a lower-case letter ("getUser", not the "RNA" of
    # "miRNA"), or after an upper-case run of two or more if two lower-case letters follow
    # ("HTTPServer", not the plural "RNAs" or "MSCs"). Digits never split.
    if not word[i].isupper():
        return False
    after = word[i + 1 : i + 3]
    if word[i - 1].islower():
        return after[:1].islower()
    return i >= 2 and word[i - 1].isupper() and word[i - 2].isupper() and len(after) == 2 and after.islower()


_local = threading.local()


def _stemmer() -> snowballstemmer.stemmer:
    # A Snowball stemmer object keeps state between calls: one per thread.
    st = getattr(_local, "stemmer", None)
    if st is None:
        st = _local.stemmer = snowballstemmer.stemmer("english")
    return st


@functools.lru_cache(maxsize=65536)
def stem(term: str) -> str:
    """Snowball English stem of a lowercase term; terms that are not all letters are kept whole.

    Terms with digits or underscores are identifiers (``apoe4``, ``err_conn_reset_4f2a``,
    ``504``): stemming them could only merge distinct ones.
    """
    return str(_stemmer().stemWord(term)) if term.isalpha() else term


def cap_term(term: str) -> str:
    """``term`` cut to :data:`MAX_TERM_BYTES` UTF-8 bytes, at a character boundary."""
    if len(term) * 4 <= MAX_TERM_BYTES:  # fast path: cannot be over, whatever the characters
        return term
    return term.encode("utf-8")[:MAX_TERM_BYTES].decode("utf-8", "ignore")


def compounds(text: str) -> list[str]:
    """Hyphenated words of a text joined into one lowercase term: ``IL-6`` gives ``il6``.

    Args:
        text: any user or document text.

    Returns:
        One term per hyphenated word, in order of appearance, possibly repeated.
    """
    return list(iter_compounds(text))


def iter_compounds(text: str) -> Iterator[str]:
    """:func:`compounds` one at a time (the regular expression finds each as it is asked for)."""
    return (m.group().replace("-", "").lower() for m in _COMPOUND.finditer(text))


def analyze(text: str) -> list[str]:
    """BM25 terms of a text: tokenized, stopwords dropped, alphabetic terms stemmed.

    Each hyphenated word also yields its parts joined (as Lucene's word-delimiter filter
    does with ``catenateWords``), after all the tokens: ``IL-6`` gives ``il``, ``6`` and
    ``il6``, so it matches ``IL6``, ``e-mail`` matches ``email``, and the whole compound
    counts as one more, rarer, term. Measured on SciFact: 0.6838 -> 0.6927 nDCG@10 (BM25 leg).
    Each name written as code writes one also yields its words (:func:`word_parts`), last:
    ``INTERNAL_SIGNING_KEY`` is found by "internal signing key" and ``maxRetries`` by "max
    retries", while the whole name stays the rarer term that its own spelling matches.

    The same analysis serves chunks (:func:`index_terms`) and queries (:func:`query_terms`),
    so both sides always agree on what a term is.

    Args:
        text: any user or document text.

    Returns:
        Terms in order of appearance, then the joined compounds, then the names' words;
        possibly repeated; each at most :data:`MAX_TERM_BYTES` bytes.
    """
    return list(iter_terms(text))


def iter_terms(text: str) -> Iterator[str]:
    """:func:`analyze`'s terms one at a time, in its order: a reader that needs only the first
    few (a long query's first distinct terms) does not analyze the rest."""
    parts: list[str] = []
    for written in _iter_written(text):
        tok = written.lower()
        if tok not in STOPWORDS:
            yield cap_term(stem(tok))
        parts += word_parts(written)
    yield from (cap_term(stem(c)) for c in iter_compounds(text))
    yield from (cap_term(stem(p)) for p in parts if p not in STOPWORDS)


def index_terms(text: str) -> str:
    """The value of a chunk's ``terms`` field: :func:`analyze` joined by spaces."""
    return " ".join(analyze(text))


def query_terms(text: str, *, max_terms: int = 64) -> list[str]:
    """Distinct analyzed terms of a query, in first-seen order, at most ``max_terms``.

    Repeats collapse: keeping them (as Lucene does, weighting a repeated word more) measured
    +0.001 to +0.003 nDCG@10 on SciFact, within noise, and would let a query grow past
    ``max_terms`` distinct words' worth of work.

    Args:
        text: the user's search text.
        max_terms: a bound on the query's size (and cost).

    Returns:
        Terms for the BM25 leg; empty when nothing searchable remains.
    """
    # Read lazily: a query of thousands of words costs what its first distinct terms cost.
    seen: dict[str, None] = {}
    for term in iter_terms(text):
        if term in seen:
            continue
        seen[term] = None
        if len(seen) >= max_terms:
            break
    return list(seen)


#: The words that make a sentence a question (interrogatives and the auxiliaries that invert
#: with them: "what did", "when does", "how could"), as stems. A query's BM25 terms leave them
#: out (:func:`content_terms`), chunks keep them: in a question they are syntax, not what is
#: sought, yet each still matched every turn that happens to say "did" or "what"
#: (docs/decisions/0028).
QUESTION_WORDS: frozenset[str] = frozenset(
    stem(w)
    for w in (
        "what when where who whom whose which why how do does did has have had were would could should can"
    ).split()
)

#: A question in the first person ("what did I say?") names the one asking, and in the second
#: person the one asked: in a chat's transcript, the ``user`` and the ``assistant`` roles
#: (``memory.speakers``).
ASKER_WORDS = frozenset({"i", "me", "my", "mine", "myself"})
ASKED_WORDS = frozenset({"you", "your", "yours", "yourself"})

#: Those words, and what a contraction leaves of a verb ("I'm", "you've"), as stems: left out
#: of a query's BM25 terms as the question words are. The speaker list reads who they name;
#: as terms they matched nearly every turn a user said ("my"), and ranked "my new phone
#: number" above the offer a question about "my new job" sought (docs/decisions/0067).
#: "mine" stays: it is a noun too.
PERSON_WORDS: frozenset[str] = frozenset(
    stem(w) for w in (*(ASKER_WORDS - {"mine"}), *ASKED_WORDS, "m", "re", "ve", "ll")
)


def content_terms(terms: list[str]) -> list[str]:
    """A query's terms without :data:`QUESTION_WORDS` and :data:`PERSON_WORDS`; where nothing
    else is left, the person words, else all of them (a query of such words alone is still
    searched for them: "what did you do" for "you").

    Args:
        terms: terms from :func:`query_terms`.

    Returns:
        The terms the BM25 leg searches, in order.
    """
    content = [t for t in terms if t not in QUESTION_WORDS]
    return [t for t in content if t not in PERSON_WORDS] or content or terms


def escape_term(term: str) -> str:
    """Backslash-escape every ASCII character of a term that is not a letter or digit."""
    return "".join(ch if _SAFE.match(ch) or ord(ch) > 127 else "\\" + ch for ch in term)


def escape_tag(value: str) -> str:
    """Escape a TAG value so that it matches literally inside ``@field:{...}``.

    Every ASCII character that is not a letter or digit is escaped, whitespace and ``_``
    included: RediSearch would otherwise read ``|``, ``}``, ``*`` or a space as syntax, and
    rejects a lone ``_``. (Control characters cannot be escaped there: ``filters.knn_clause``
    matches values holding them by hash.)
    """
    return "".join(ch if _SAFE.match(ch) or ord(ch) > 127 else "\\" + ch for ch in value)


def bm25_query(terms: list[str], *, field: str = "terms", within: str = "*") -> str:
    """An OR over escaped terms on one TEXT field, optionally restricted by a filter.

    Unfiltered: ``@terms:(http|504|gateway)``. Filtered, the filter is repeated inside each
    term, ``(@terms:http F) | (@terms:504 F) | …``, never wrapped around the OR. Measured on
    SciFact with this RediSearch (2.10), before the ``terms`` field: unfiltered 0.650 nDCG@10, distributed 0.630,
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
