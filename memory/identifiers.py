"""Exact identifiers in text (pure): what the identifier leg matches on.

Ops text is full of near-identical identifiers (``ERR_CONN_RESET_4F2A`` vs ``…_4F2B``,
SQLSTATE ``42P01`` vs ``42P07``, ``ECONNRESET`` vs ``ECONNREFUSED``, ``INC-4411``). BM25
stems and splits them and dense vectors blur them; this leg matches them whole. Each
identifier is normalized to one RediSearch term (``[a-z0-9]``, lowercased, separators
dropped) so a chunk's identifiers can live in a NOSTEM text field.

Separators are insignificant (as PEP 503 treats ``-``, ``_`` and ``.`` in package names):
``SHP-2``, ``SHP2`` and ``shp_2`` are one identifier, as are ``INC-4411`` and ``INC4411``
or ``ERR-CONN-RESET`` and ``ERR_CONN_RESET``. Keeping them (``shp_2``) missed documents
that write the other form; on SciFact dropping them took the identifier leg's cost from
-0.0051 to -0.0045 nDCG@10 (hyphens only; see ``identifier_ranks``).

Upper-case words and numbers joined by hyphens are one identifier, and the pieces inside
one are not identifiers of their own. Before analyzer version 2, ``ERR-CONN-RESET`` gave
``err``, ``conn`` and ``reset`` (and never ``errconnreset``, so it did not match
``ERR_CONN_RESET``), ``ABC-123`` added an HTTP status ``123``, and ``CVE-2024-3094`` gave
``cve2024``.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from memory.fusion import competition_ranks
from memory.text import MAX_TERM_BYTES, STOPWORDS

_PATTERNS = [
    re.compile(r"\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b"),  # ERR_CONN_RESET_4F2A, max_connections
    re.compile(r"\bE[A-Z][A-Z0-9]{1,}\b"),  # errno names: ECONNRESET, EPIPE
    re.compile(r"\b[A-Z][A-Z0-9]{3,}\b(?!-[0-9])"),  # upper-case names: SIGTERM, NOAUTH, WRONGTYPE
    re.compile(r"\b(?=[0-9A-Z]*[0-9])(?=[0-9A-Z]*[A-Z])[0-9A-Z]{4,12}\b"),  # 42P01, 4F2A, 0A000-like
    re.compile(r"\b[0-9][0-9A-Z]{4}\b"),  # SQLSTATE classes: 23505, 08006, 2200F
    re.compile(r"\b[1-5][0-9]{2}\b"),  # HTTP status codes
    re.compile(r"\b[A-Z][A-Z0-9]{1,9}-[0-9]{1,9}\b"),  # tickets and deploys: INC-4411, DEPLOY-77
    re.compile(r"\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+\b"),  # CamelCase: PoolTimeoutError
    # Lower-case hex with letters and digits, as git prints commits and objects: a3f9c2e.
    # Up to 64 (a SHA-256), with or without 0x; not a number in e-notation (1e10000).
    re.compile(r"\b(?:0x)?(?![0-9]*e[0-9]+\b)(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,64}\b"),
]
# Upper-case words and numbers joined by hyphens: ERR-CONN-RESET, ABC-123, CVE-2024-3094,
# HLA-DRB1. Lower-case ones stay words (e-mail, state-of-the-art, db-01): BM25 joins those.
# The match ends before a lower-case tail ("IL-6-induced" gives IL-6), and never inside a
# word ("ABC-123abc" is none).
_HYPHENATED = re.compile(r"(?<![\w-])[A-Z0-9][A-Z0-9_]*(?:-[A-Z0-9_]+)+(?!\w)")
# A file name alone, with an extension of source, config or logs: http.py, db.toml. Neither
# this nor _PATH lets two repeats compete for the same characters, which would take over a
# second on 16,000 characters of "a-a-…" (on the event loop): each reads in one pass.
_FILE_NAME = re.compile(
    r"(?<![\w./-])[\w-]+\."
    r"(?:py|pyi|js|mjs|ts|tsx|jsx|go|rs|java|kt|rb|php|cs|cpp|cc|hpp|swift|scala|sh|sql|proto|"
    r"toml|ya?ml|json|ini|cfg|conf|env|lock|md|rst|txt|csv|log|tf|gradle|xml|html|css)\b(?![\w/])"
)
# File paths ending in a file name (config/db.toml, /var/log/app.log, src/server/http.py): the
# path is one identifier and its file name another, so "http.py" finds "src/server/http.py".
# The extension is lower case, and of one letter only c or h: "mg/kg.The" (a missing space)
# and "e.g./i.e." are no files.
_PATH = re.compile(r"(?<![\w./~-])(?:~/|\.{1,2}/|/)?(?:[\w.-]+/)+[\w-]+\.(?:[a-z][a-z0-9]{1,7}|[ch])\b")
# Function calls (db.pool.acquire(): a dotted name, kept when "(" follows it. Not a lookahead
# in the pattern: a failed "(?=\()" backtracked through the dotted name from every segment's
# start, quadratic on "a.a.a…" (1.5 s for 16k characters of query text, on the event loop).
_DOTTED = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_NON_TERM = re.compile(r"[^a-z0-9]+")
# Upper-case words that label identifiers rather than being one.
_NOT_IDENTIFIERS = (
    frozenset(
        "http https sqlstate json yaml xml html post get put patch delete head null true false none "
        "note todo fixme warn warning info error debug fatal critical errno signal".split()
    )
    | STOPWORDS
)  # WITH, THIS, not(: no identifiers, and an OR led by stopwords can crash RediSearch


def normalize_identifier(raw: str) -> str:
    """One RediSearch term per identifier: lowercase letters and digits, separators dropped."""
    return _NON_TERM.sub("", raw.lower())


def _hyphenated(text: str) -> list[tuple[int, int]]:
    """Spans of the hyphen-joined identifiers of ``text``, in order, not overlapping.

    One needs a letter (``2024-01-15`` is a date) and must not start with a label
    (``HTTP-504`` stays ``http504`` and ``504``, as before). A single letter is no label, even
    one that is a stopword alone: ``T-1001`` is a ticket, as ``B-12`` is a vitamin.
    """
    spans = []
    for m in _HYPHENATED.finditer(text):
        raw = m.group(0)
        label = normalize_identifier(raw.split("-", 1)[0])
        if any(c.isalpha() for c in raw) and (len(label) == 1 or label not in _NOT_IDENTIFIERS):
            spans.append(m.span())
    return spans


def _matches(text: str) -> Iterable[str]:
    spans = _hyphenated(text)
    starts = [s for s, _ in spans]
    for s, e in spans:
        yield text[s:e]
    for pattern in _PATTERNS:
        for m in pattern.finditer(text):
            # A piece of a hyphen-joined identifier is not one: the "123" of ABC-123 is no
            # HTTP status, and ERR-CONN-RESET names no "conn".
            i = bisect.bisect_right(starts, m.start()) - 1
            if i >= 0 and m.end() <= spans[i][1]:
                continue
            yield m.group(0)
    for m in _DOTTED.finditer(text):
        if text.startswith("(", m.end()):
            yield m.group(0)
    yield from _files(text)


def _files(text: str) -> Iterable[str]:
    for m in _FILE_NAME.finditer(text):
        yield m.group(0)
    for m in _PATH.finditer(text):
        yield m.group(0)
        yield m.group(0).rsplit("/", 1)[1]


def identifiers(text: str, *, limit: int = 256) -> list[str]:
    """Distinct normalized identifiers of ``text``, in first-seen order, at most ``limit``.

    Each is cut to ``MAX_TERM_BYTES`` (as RediSearch cuts what it indexes); stopwords are
    never identifiers.
    """
    return _terms(_matches(text), limit)


def _terms(raws: Iterable[str], limit: int) -> list[str]:
    """Distinct normalized terms of matched identifiers, in order, at most ``limit``."""
    seen: dict[str, None] = {}
    for raw in raws:
        term = normalize_identifier(raw)[:MAX_TERM_BYTES]  # ASCII: bytes are characters
        if len(term) >= 3 and term not in seen and term not in _NOT_IDENTIFIERS:
            seen[term] = None
            if len(seen) >= limit:
                break
    return list(seen)


# A token of a query as an asker may type an identifier: letters and digits, maybe joined by
# "-", "_" or ".", whatever their case ("err-conn-reset-4f2a", "Err_Conn_Reset_4f2a", "42p01").
# Letters and digits of at least this many characters, or in three or more pieces: shorter
# ones are mostly words of science and speech typed with a digit (il-6, cd8, p53, covid-19),
# which matched every chunk naming them in upper case and cost SciFact 0.006 nDCG@10.
_QUERY_MIN_CHARS = 8
_QUERY_TOKEN = re.compile(r"(?<![\w.-])[A-Za-z0-9]+(?:[-_.][A-Za-z0-9]+)*(?![\w-])")


def query_identifiers(text: str, *, limit: int = 32) -> list[str]:
    """The identifiers a query names: those ``identifiers`` finds, then its tokens that look
    like one in any case: letters with digits, long or in three or more pieces.

    Documents' identifiers are found by how they are written (upper case, underscores,
    CamelCase), but an asker may type ``err-conn-reset-4f2a`` or ``errconnreset4f2a`` for
    ``ERR_CONN_RESET_4F2A``, which neither BM25 (``err_conn_reset_4f2a`` is its one term)
    nor the document-side shapes would match. Being generous here costs little: a query
    identifier only matches chunks that hold that very identifier, but short ones are words
    as often (see ``_QUERY_MIN_CHARS``). Plain words stay out (``errconnreset`` could be any
    word): BM25 matches one-word identifiers in any case, and ``inc-4411`` as ``inc4411``.
    """
    found = dict.fromkeys(identifiers(text, limit=limit))
    for m in _QUERY_TOKEN.finditer(text):
        if len(found) >= limit:
            break
        token = m.group(0)
        term = normalize_identifier(token)[:MAX_TERM_BYTES]
        mixed = any(c.isdigit() for c in term) and any(c.isalpha() for c in term)
        pieces = sum(c in "-_." for c in token) + 1
        if mixed and (len(term) >= _QUERY_MIN_CHARS or pieces >= 3):
            found.setdefault(term, None)
    return list(found)[:limit]


def identifier_ranks(hits: Sequence[tuple[str, Iterable[str]]], wanted: Collection[str]) -> dict[str, int]:
    """Ranks of the identifier leg's hits: by how many of the query's identifiers each names.

    Hits naming equally many tie (competition ranking: 1, 1, 3), so a query naming one
    identifier gives every chunk that holds it rank 1 and leaves their order to the other
    legs. Ranking hits by BM25 over their ``idents`` field instead ordered them by how few
    other identifiers they hold, which says nothing about the query. On SciFact (gene names
    such as AIRE, PTEN, MDA5 in 76 of 300 queries), against RRF k=60 without the leg: that
    order cost -0.0073 nDCG@10, tied ranks -0.0052 (-0.0045 with separator-insensitive
    identifiers); MRR@10 on look-alike identifiers stays 0.998 (bench/identifiers.py). Mean
    ranks for ties (-0.0059) and ordering ties by the other legs (-0.0061) did no better.

    Args:
        hits: ``(id, identifiers the hit holds)`` in the order the engine returned them.
        wanted: the query's normalized identifiers.

    Returns:
        id -> 1-based rank; a hit naming none of ``wanted`` ranks after every hit that does.
    """
    want = set(wanted)
    counts: dict[str, float] = {}
    for hit_id, held in hits:
        counts.setdefault(hit_id, len(want.intersection(held)))
    return competition_ranks(counts)


@functools.lru_cache(maxsize=1024)
def _value_identifiers(values: str) -> tuple[str, ...]:
    return tuple(identifiers(values, limit=_METADATA_IDENTIFIERS))


#: Most identifiers a chunk takes from its metadata (its ticket, session or incident ids).
_METADATA_IDENTIFIERS = 32


def with_metadata_identifiers(idents: str, metadata: Mapping[str, Any], names: Sequence[str] = ()) -> str:
    """A chunk's ``idents``, then the identifiers its metadata's text values name that its
    text does not: a turn of session ``INC-4411`` or a doc with ``ticket: T-1002`` is found
    by that id, though its text never writes it. ``names``: a document's id and source, whose
    file path and name are its own identifiers too (``src/server/http.py``, ``http.py``)."""
    # Not the agent's id: every turn of the agent would tie at the identifier leg's first rank
    # for a question naming it, where the speaker list already lifts the agent's own turns.
    values = [v for k, v in metadata.items() if k != "agent_id"]
    texts = [v for v in values if isinstance(v, str)]
    texts += [x for v in values if isinstance(v, list) for x in v if isinstance(x, str)]
    named = _name_identifiers("\n".join(names)) if names else ()
    if not texts and not named:
        return idents
    # One value a line: an identifier never runs from one value into the next.
    own = set(idents.split())
    found = (*_value_identifiers("\n".join(texts)), *named) if texts else named
    extra = [t for t in dict.fromkeys(found) if t not in own]
    return " ".join([idents, *extra]) if idents and extra else idents or " ".join(extra)


@functools.lru_cache(maxsize=1024)
def _name_identifiers(names: str) -> tuple[str, ...]:
    """The file paths and names in a document's id and source (nothing else they hold: a
    numeric id would tie every chunk of its doc at the first rank for a question naming a
    number)."""
    return tuple(_terms(_files(names), _METADATA_IDENTIFIERS))
