"""BM25 text analysis (tokenizing, stopwords, stemming) and escaping for RediSearch."""

from __future__ import annotations

import hashlib
import random
import re

import pytest

from memory.identifiers import identifiers
from memory.text import (
    ANALYZER_VERSION,
    MAX_TERM_BYTES,
    analyze,
    bm25_query,
    compounds,
    content_terms,
    escape_tag,
    escape_term,
    index_terms,
    query_terms,
    stem,
    tokenize,
    word_parts,
)


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


def test_query_terms_collapse_forms_of_one_word() -> None:
    """Forms that stem alike are one query term."""
    assert query_terms("Timeouts timeout timed out") == ["timeout", "time", "out"]


@pytest.mark.parametrize(
    ("term", "stemmed"),
    [
        ("timeouts", "timeout"),
        ("connections", "connect"),
        ("running", "run"),
        ("patients", "patient"),
        ("econnrefused", "econnrefus"),  # alphabetic: stemmed, the same on both sides
        ("err_conn_reset_4f2a", "err_conn_reset_4f2a"),  # identifiers are kept whole
        ("apoe4", "apoe4"),
        ("il_6", "il_6"),
        ("504", "504"),
        ("naïve", "naïv"),
    ],
)
def test_stem_alphabetic_terms_only(term: str, stemmed: str) -> None:
    """Snowball English stems words; terms with digits or underscores stay as they are."""
    assert stem(term) == stemmed


@pytest.mark.parametrize(
    ("text", "terms"),
    [
        ("The patient's connections timed out", ["patient", "connect", "time", "out"]),
        (
            "ERR_CONN_RESET_4F2A on billing-service",
            ["err_conn_reset_4f2a", "bill", "servic", "billingservic", "err", "conn", "reset", "4f2a"],
        ),
        ("raise maxRetries", ["rais", "maxretri", "max", "retri"]),
        ("IL-6 and state-of-the-art", ["il", "6", "state", "art", "il6", "stateoftheart"]),
        ("is an the of", []),
        ("", []),
        ("pool pools pool", ["pool", "pool", "pool"]),
    ],
)
def test_analyze_tokenizes_drops_stopwords_and_stems(text: str, terms: list[str]) -> None:
    """analyze keeps repeats (term frequency counts for chunks) and drops stopwords and the possessive s."""
    assert analyze(text) == terms


@pytest.mark.parametrize(
    ("text", "joined"),
    [
        ("IL-6", ["il6"]),
        ("an e-mail, then x-ray-based tests", ["email", "xraybased"]),
        ("foo-bar_baz", ["foobar_baz"]),
        ("-x y- a - b", []),
        ("no hyphens here", []),
    ],
)
def test_compounds_join_hyphenated_words(text: str, joined: list[str]) -> None:
    """A hyphenated word also gives its parts joined; a lone or dangling hyphen gives nothing."""
    assert compounds(text) == joined


def test_compounds_match_the_unanchored_pattern_on_random_text() -> None:
    """Anchoring the pattern at word starts changes no match (it only stops the retries)."""
    rng = random.Random(5)
    alphabet = "ab_9é- .,-"
    unanchored = re.compile(r"\w+(?:-\w+)+")
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert compounds(text) == [m.group().replace("-", "").lower() for m in unanchored.finditer(text)]


def test_one_huge_word_is_analyzed() -> None:
    """A 200,000-character word (one [UNK] token, so one chunk) is analyzed; the unanchored
    pattern needed ~20 s for 40,000 characters and would hold ingestion for minutes here."""
    word = "x" * 200_000
    assert compounds(word) == [] and len(analyze(word)) == 1


def test_chunk_and_query_analysis_agree() -> None:
    """A query word matches a chunk's other form of it: both sides share one analyzer."""
    chunk = set(index_terms("Pool connections were exhausted by retrying clients").split())
    assert set(query_terms("exhausting connection pool retries")) <= chunk
    assert "il6" in query_terms("IL6 levels") and "il6" in index_terms("IL-6 levels")


def test_query_terms_are_bounded() -> None:
    """A huge query is cut to max_terms terms."""
    assert len(query_terms(" ".join(f"w{i}" for i in range(500)), max_terms=64)) == 64


def test_query_terms_are_the_first_distinct_terms_of_the_analysis() -> None:
    """Read lazily, a query's terms are still analyze()'s first distinct ones, compounds last."""
    rng = random.Random(7)
    words = ["IL-6", "e-mail", "the", "Timeouts", "timeout", "ERR_X", "naïve", "x-ray", "of", "504", "a-b-c"]
    for _ in range(300):
        text = " ".join(rng.choice(words) for _ in range(rng.randrange(0, 30)))
        for cap in (1, 3, 8, 64):
            expected = list(dict.fromkeys(analyze(text)))[:cap]
            assert query_terms(text, max_terms=cap) == expected, (text, cap)


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        ("billing-service", r"billing\-service"),
        ("a b", r"a\ b"),
        ("x} | @kind:{transcript", r"x\}\ \|\ \@kind\:\{transcript"),
        ("*", r"\*"),
        ("wiki/infra.md", r"wiki\/infra\.md"),
        ("plain_1", r"plain\_1"),
        ("_", r"\_"),
        ("plain1", "plain1"),
    ],
)
def test_escape_tag_makes_syntax_literal(value: str, escaped: str) -> None:
    """Every non-alphanumeric ASCII character of a TAG value is backslash-escaped."""
    assert escape_tag(value) == escaped


def test_bm25_query_is_an_or_of_escaped_terms() -> None:
    """The BM25 leg ORs terms on the analyzed terms field."""
    assert bm25_query(["http", "504"]) == "@terms:(http|504)"
    assert escape_term("a.b") == r"a\.b"
    assert escape_term("_") == r"\_"  # a lone "_" is a syntax error to RediSearch unescaped
    with pytest.raises(ValueError):
        bm25_query([])


def test_bm25_query_distributes_a_filter_into_each_term() -> None:
    """A filter is repeated inside each term's group, never wrapped around the OR."""
    assert bm25_query(["a", "b"], within="@h_t:[1 1]") == "(@terms:a @h_t:[1 1]) | (@terms:b @h_t:[1 1])"
    assert bm25_query(["x.y"], field="idents", within="*") == r"@idents:(x\.y)"


def test_terms_are_cut_to_what_redisearch_indexes() -> None:
    """Terms longer than 128 UTF-8 bytes are cut there (at a character boundary), on both
    sides, since RediSearch indexes only that much of a token."""
    assert query_terms("q" * 300) == ["q" * MAX_TERM_BYTES]
    assert index_terms("q" * 300) == "q" * MAX_TERM_BYTES
    (umlauts,) = query_terms("ü" * 100)
    assert umlauts == "ü" * 64 and len(umlauts.encode()) == MAX_TERM_BYTES
    (odd,) = query_terms("x" + "ü" * 100)  # 129 bytes: the cut may not split a character
    assert odd == "x" + "ü" * 63


# What the analysis of _ANALYZED gives, per ANALYZER_VERSION. Generations record the version
# they were analyzed with; a change to the analysis that keeps the version would mix two
# analyses in one index (and let reindex copy old chunks verbatim into a new generation).
# (Version 1's digest, f9627197eaccb0cb, was of the texts without the last line. Version 2:
# upper-case words joined by hyphens are one identifier, and their pieces none. Version 3:
# names written as code writes them also give their words.)
_ANALYZER_DIGESTS = {2: "57bd2374cbc3ae96", 3: "ce202c2433902d1b"}
_ANALYZED = [
    "ERR_CONN_RESET_4F2A: the billing-service lost db-01.prod; SQLSTATE 42P01, ECONNRESET, INC-4411.",
    "Runbook's steps: raise pool_size, restart pgbouncer (max_connections) and retry the e-mail x-ray-based jobs.",
    "Timeouts and timed out workers: HTTP 504 from api.v2.fetch_user(); see SHP-2 / shp_2 / DEPLOY-77.",
    "Ünïcödé naïve café résumé 東京 — en\u2013dash “quotes” \u2018single\u2019 … what does _ mean?",
    "x" * 300 + " IL-6 apoe4 state-of-the-art it's don't",
    "ERR-CONN-RESET on ABC-123 (CVE-2024-3094), HTTP-504, HLA-DRB1, IL-6-induced, 2024-01-15.",
]


def _analysis_digest() -> str:
    parts = [f"{index_terms(t)}|{' '.join(identifiers(t))}|{' '.join(query_terms(t))}" for t in _ANALYZED]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def test_a_change_to_the_analysis_bumps_the_analyzer_version() -> None:
    assert _ANALYZER_DIGESTS.get(ANALYZER_VERSION) == _analysis_digest(), (
        f"the analysis changed: bump memory.text.ANALYZER_VERSION and record {_analysis_digest()!r} for it"
    )


@pytest.mark.parametrize(
    ("token", "parts"),
    [
        ("max_retries", ["max", "retries"]),
        ("INTERNAL_SIGNING_KEY", ["internal", "signing", "key"]),
        ("getUserById", ["get", "user", "by", "id"]),
        ("HTTPServer", ["http", "server"]),
        ("ERR_CONN_RESET_4F2A", ["err", "conn", "reset", "4f2a"]),
        ("JSONDecodeError", ["json", "decode", "error"]),
        ("iPhone", ["phone"]),
        ("__init__", ["init"]),
        ("snake_case_1", ["snake", "case"]),
        ("x_y", []),
        ("Hello", []),
        ("API", []),
        ("apoe4", []),
        ("user2Id", []),
        ("Ünïcödé", []),
        # acronyms with a lower-case letter are no names
        ("mRNA", []),
        ("miRNA", []),
        ("RNAs", []),
        ("MSCs", []),
        ("kappaB", []),
        ("HbA1c", []),
        ("ÜberWagen", ["über", "wagen"]),
        # keys and blobs are no names
        ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9", []),
        ("ERR_" + "X" * 200, []),
        ("sha256_hmac_v1", []),
        ("user_service_v2", ["user", "service", "v2"]),
    ],
)
def test_word_parts_split_names_at_underscores_and_case_turns(token: str, parts: list[str]) -> None:
    """A name splits at ``_`` and where a capitalized word starts, never between letters and
    digits; a part of one letter is dropped, and a plain word or an acronym has no parts."""
    assert word_parts(token) == parts


def test_a_name_is_found_by_its_words_and_by_itself() -> None:
    """ "internal signing key" shares every term with a chunk naming INTERNAL_SIGNING_KEY; the
    name itself keeps a term of its own, so its exact spelling is the rarer match."""
    chunk = set(analyze("Rotate INTERNAL_SIGNING_KEY and set maxRetries=5 in config.yaml"))
    assert set(content_terms(query_terms("where is the internal signing key?"))) <= chunk
    assert set(query_terms("max retries")) <= chunk
    assert "internal_signing_key" in chunk and "maxretri" in chunk
    assert query_terms("internal_signing_key")[0] == "internal_signing_key"


def test_content_terms_leave_question_words_out() -> None:
    """Interrogatives and auxiliaries go from a query's BM25 terms; alone, they stay."""
    assert content_terms(query_terms("When did Caroline go to the support group?")) == [
        "carolin",
        "go",
        "support",
        "group",
    ]
    assert content_terms(query_terms("Why does it fail? How could it?")) == ["fail"]
    assert content_terms(query_terms("what did you do")) == ["you"]
    assert content_terms(query_terms("what did")) == ["what", "did"]
    # First and second person words go too: the speaker list reads whom they name.
    assert content_terms(query_terms("what is my new job?")) == ["new", "job"]
    assert content_terms(query_terms("I'm sure you've told me where I live")) == ["sure", "told", "live"]
    # Chunks keep them: only the query side leaves them out.
    assert "what" in index_terms("what did the planner decide")
