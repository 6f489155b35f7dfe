"""Identifier extraction for the exact-identifier leg (pure)."""

from __future__ import annotations

import pytest

from memory.identifiers import identifier_ranks, identifiers, normalize_identifier, query_identifiers


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("failed with ERR_CONN_RESET_4F2A", ["errconnreset4f2a"]),
        ("SQLSTATE 42P01 undefined table", ["42p01"]),
        ("unique violation 23505", ["23505"]),
        ("socket ECONNRESET then ECONNREFUSED", ["econnreset", "econnrefused"]),
        ("HTTP 504 gateway timeout", ["504"]),
        ("see INC-4411 and DEPLOY-77", ["inc4411", "deploy77"]),
        ("raised PoolTimeoutError", ["pooltimeouterror"]),
        ("call db.pool.acquire() now", ["dbpoolacquire"]),
        ("raise max_connections", ["maxconnections"]),
        ("plain words only, 12 of them", []),
        ("reverted a3f9c2e, then 5e7d1b9c0a", ["a3f9c2e", "5e7d1b9c0a"]),
        ("edit config/db.toml, then src/server/http.py", ["configdbtoml", "dbtoml", "srcserverhttppy", "httppy"]),
        ("see /var/log/app.log and ../lib/x.go and ./run.sh", ["varlogapplog", "applog", "libxgo", "xgo", "runsh"]),
        ("open README.md and db.toml", ["readme", "readmemd", "dbtoml"]),
        # no file: a ratio, a unit, an abbreviation, hex without digits or without letters
        ("and/or 5 mg/kg, 24/7, e.g. 3.5/2.1; deadbeef added 1234567", []),
        # nor a missing space after a full stop, nor e-notation
        ("5 mg/kg.The dose, CD4/CD8.In mice, e.g./i.e. both; 1e10000", []),
        ("digest " + "a1" * 32 + " at 0x7ffe12ab", ["a1" * 32, "0x7ffe12ab"]),
    ],
)
def test_identifiers(text: str, found: list[str]) -> None:
    """Each identifier kind is found whole and normalized to one term."""
    assert identifiers(text) == found


def test_normalize_and_limit() -> None:
    """Separators are dropped, so spellings of one identifier agree; the number per text is bounded."""
    assert normalize_identifier("INC-4411") == normalize_identifier("INC4411") == "inc4411"
    assert normalize_identifier("ERR-CONN_RESET") == normalize_identifier("err_conn.reset") == "errconnreset"
    assert len(identifiers(" ".join(f"ERR_{i}" for i in range(1000)), limit=10)) == 10


def test_stopwords_are_never_identifiers() -> None:
    """Upper-case stopwords and stopword calls are not identifiers: an OR group led by
    stopwords can crash a RediSearch index that keeps its default stopword list."""
    assert identifiers("THIS THAT hip( WITH INTO not(x) SIGTERM") == ["sigterm", "hip"]


def test_calls_and_long_identifiers() -> None:
    """A dotted name counts as a call only when "(" follows it; identifiers are cut to the
    128 bytes RediSearch indexes."""
    assert identifiers("ab.cd.ef gh.ij( kl.mn (") == ["ghij"]
    assert identifiers("ERR_" + "X" * 200) == [("err" + "x" * 200)[:128]]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        # one identifier, not its pieces (analyzer 1 gave err, conn, reset)
        ("failed with ERR-CONN-RESET twice", ["errconnreset"]),
        ("ERR_CONN-RESET too", ["errconnreset"]),
        ("then ERR-CONN-RESET-4F2A", ["errconnreset4f2a"]),
        # no HTTP status inside a ticket (analyzer 1 added 123 and 404)
        ("ABC-123 broke", ["abc123"]),
        ("a DEPLOY-404 run", ["deploy404"]),
        # the whole id, not its first two parts (analyzer 1 gave cve2024)
        ("CVE-2024-3094 in xz", ["cve20243094"]),
        ("the HLA-DRB1 allele", ["hladrb1"]),
        # a lower-case tail ends it; a word glued on makes it none
        ("IL-6-induced fever", ["il6"]),
        ("ABC-123abc", []),
        # a date is no identifier; a label in front keeps the status code
        ("on 2024-01-15", []),
        ("HTTP-504 again", ["504", "http504"]),
        # a single letter is no label, even a stopword alone ("t", "a")
        ("ticket T-1001 reopened", ["t1001"]),
        ("the A-380 and S-100", ["a380", "s100"]),
        ("Plan A-1 or T-cells", []),
        # lower-case compounds stay words
        ("the billing-service on db-01.prod sent e-mail", []),
    ],
)
def test_hyphen_joined_identifiers_are_one(text: str, found: list[str]) -> None:
    """Upper-case words and numbers joined by hyphens are one identifier, as the same name
    written with underscores is, and the pieces inside one are none."""
    assert identifiers(text) == found


def test_hyphen_and_underscore_spellings_agree() -> None:
    """A query naming the hyphen form finds a chunk that wrote the underscore form, and back."""
    assert identifiers("ERR-CONN-RESET") == identifiers("ERR_CONN_RESET") == ["errconnreset"]


def test_upper_case_names_but_not_labels() -> None:
    """SIGTERM-like names are identifiers; labels such as HTTP or SQLSTATE are not."""
    assert identifiers("the worker got SIGTERM then NOAUTH over HTTP") == ["sigterm", "noauth"]


@pytest.mark.parametrize(
    ("hits", "wanted", "ranks"),
    [
        # one identifier: every chunk holding it ties at rank 1, whatever else it holds
        ([("a", ["x", "q", "r"]), ("b", ["x"])], ["x"], {"a": 1, "b": 1}),
        # more of the query's identifiers rank first; equal counts tie (competition ranking)
        (
            [("a", ["x"]), ("b", ["x", "y"]), ("c", ["y"]), ("d", ["x", "y"])],
            ["x", "y"],
            {"a": 3, "b": 1, "c": 3, "d": 1},
        ),
        # a hit naming none of them (it cannot happen through the engine) ranks last
        ([("a", []), ("b", ["x"])], ["x"], {"a": 2, "b": 1}),
        # a repeated hit keeps its first entry
        ([("a", ["x"]), ("a", [])], ["x"], {"a": 1}),
        ([], ["x"], {}),
    ],
)
def test_identifier_ranks_tie_hits_naming_as_many_identifiers(hits, wanted, ranks) -> None:
    """Identifier-leg hits rank by how many query identifiers they name, ties sharing a rank."""
    assert identifier_ranks(hits, wanted) == ranks


@pytest.mark.parametrize(
    ("query", "found"),
    [
        # typed in lower case, an identifier must still be read as one (dense off, nothing else finds it)
        ("err-conn-reset-4f2a", ["errconnreset4f2a"]),
        ("errconnreset4f2a", ["errconnreset4f2a"]),
        ("Err-Conn-Reset-4f2a", ["errconnreset4f2a"]),
        ("what failed in deploy-2024-77?", ["deploy202477"]),
        ("ERR_CONN_RESET_4F2A again", ["errconnreset4f2a"]),  # what identifiers() finds comes first
        # plain words, dates, numbers, short mixes (words of science as often: il-6, p53), or
        # stopword pieces are no identifiers
        ("errconnreset and timeouts", []),
        ("why il-6, p53 and cd8?", []),
        ("2024-01-15 e.g. a.m. it's", []),
        ("(is|an|hip)", []),
    ],
)
def test_query_identifiers_take_identifier_shaped_tokens_in_any_case(query: str, found: list[str]) -> None:
    assert query_identifiers(query) == found


def test_query_identifiers_agree_with_the_documents_spelling() -> None:
    for doc, query in (
        ("ERR_CONN_RESET_4F2A", "err-conn-reset-4f2a"),
        ("DEPLOY-2024-77", "deploy-2024-77"),
        ("PoolTimeoutError2", "pooltimeouterror2"),
    ):
        assert set(identifiers(doc)) & set(query_identifiers(query)), (doc, query)


def test_a_chunk_takes_the_identifiers_its_metadata_names() -> None:
    """A ticket or session id in the metadata is an identifier of the chunk, once, after its text's."""
    from memory.identifiers import with_metadata_identifiers

    metadata = {"ticket": "T-1002", "session_id": "INC-4411", "turn": 3, "tags": ["RF-88231", "billing"], "x": "t1001"}
    assert with_metadata_identifiers("t1001 err42", metadata) == "t1001 err42 t1002 inc4411 rf88231"
    assert with_metadata_identifiers("", {"service": "billing", "env": "production"}) == ""
    assert with_metadata_identifiers("", {"agent_id": "PLANNER-7", "session_id": "INC-4411"}) == "inc4411"
    assert with_metadata_identifiers("", {"a": "ABC", "b": "-9999"}) == ""  # never joined into one (ABC-9999)


def test_a_copied_chunk_analyzed_again_keeps_its_metadata_identifiers() -> None:
    """A reindex across an analysis change analyzes stored hashes again: the ids their metadata
    names are among the new ``idents``, as ingestion writes them."""
    import json as _json

    from memory.index.codec import _reanalyzed

    stored = {b"text": b"The refund lands on Friday.", b"metadata": _json.dumps({"ticket": "T-1002"}).encode()}
    assert _reanalyzed(stored)["idents"].split() == ["t1002"]


def test_a_documents_file_path_and_name_are_its_identifiers() -> None:
    """A doc named by a file path is found by the path and by the file name, though its text
    never writes them; a name that is no file (a number, an id) adds nothing."""
    from memory.identifiers import with_metadata_identifiers
    from memory.index.codec import _reanalyzed

    names = ("src/server/http.py", "src/server/http.py")
    assert with_metadata_identifiers("routeconflicterror", {}, names) == "routeconflicterror srcserverhttppy httppy"
    assert with_metadata_identifiers("", {"ticket": "T-1002"}, ("runbooks/db.md",)) == "t1002 runbooksdbmd dbmd"
    assert with_metadata_identifiers("", {}, ("4983", "doc_8832")) == ""
    stored = {b"text": b"Routes are parsed here.", b"kind": b"document", b"doc_id": b"src/http.py", b"source": b"x"}
    assert _reanalyzed(stored)["idents"].split() == ["srchttppy", "httppy"]
    turn = {b"text": b"Routes are parsed here.", b"kind": b"transcript", b"doc_id": b"src/http.py"}
    assert _reanalyzed(turn)["idents"] == ""
