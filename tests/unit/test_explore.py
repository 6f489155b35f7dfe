"""The explorer's pure parts: tokens, the loopback rule, page keys, previews, escaping, rendering."""

from __future__ import annotations

import base64
import dataclasses
import json

import pytest
from pydantic import ValidationError

from daemon.dlq_marks import ReplayMark, letter_id
from daemon.explore.access import OPERATOR, Access, Principal, bearer, duplicate_tokens, explorer_refusal, is_loopback
from daemon.explore.dlq import DeadLetter, dead_letter, erased_letter, hex_lines, preview, tenant_of
from daemon.explore.html import esc, url
from daemon.explore.views_ask import parse_filters, results_html
from daemon.explore.views_dlq import dlq_body
from daemon.explore.views_graph import communities_svg, stale_chart
from daemon.explore.views_memory import document_body, turns_body
from daemon.settings import Settings
from graph.communities import Community
from graph.stale_queue import StaleItem
from memory.errors import InvalidRequest
from memory.index import ChunkPage, LegHit, PageKey, next_key
from memory.index.history import Version
from memory.records import StoredChunk
from memory.search_results import SearchHit, SearchOutcome, leg_order
from memory.tenants import Erasure

HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)> & \"quoted\""
ACCESS = Access(token="op", tenant_tokens={"acme": "ta", "globex": "tg"})


@pytest.mark.parametrize(
    ("access", "header", "cookie", "want"),
    [
        (Access(), None, None, OPERATOR),  # no token configured: open, as before
        (Access(), "Bearer anything", None, OPERATOR),
        (ACCESS, None, None, None),
        (ACCESS, "Bearer op", None, OPERATOR),
        (ACCESS, "bearer op", None, OPERATOR),  # the scheme is case-insensitive
        (ACCESS, "Bearer ta", None, Principal("acme")),
        (ACCESS, "Bearer tg", None, Principal("globex")),
        (ACCESS, "Bearer wrong", None, None),
        (ACCESS, "Basic op", None, None),
        (ACCESS, "Bearer", None, None),
        (ACCESS, None, "ta", Principal("acme")),  # the login cookie
        (ACCESS, "Bearer wrong", "ta", None),  # a header, when sent, is the one read
        (ACCESS, "Bearer opx", None, None),
        (Access(tenant_tokens={"acme": "ta"}), None, None, None),  # a tenant's token alone also closes it
        (Access(tenant_tokens={"acme": ""}), None, None, OPERATOR),  # an empty token is none
    ],
)
def test_identify(access: Access, header: str | None, cookie: str | None, want: Principal | None) -> None:
    """Each header or cookie names the principal its token belongs to, or none."""
    assert access.identify(header, cookie) == want


def test_a_tenant_principal_sees_only_its_tenant() -> None:
    """The operator sees every tenant; a tenant's principal its own."""
    assert OPERATOR.sees("acme") and OPERATOR.sees("globex")
    assert Principal("acme").sees("acme") and not Principal("acme").sees("globex")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("", False),
        ("::", False),
        ("10.0.0.5", False),
        ("example.internal", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    """Only loopback addresses (and ``localhost``) count as reachable from this machine only."""
    assert is_loopback(host) is loopback


def test_the_explorer_is_refused_beyond_loopback_without_a_token() -> None:
    """A public bind address needs a token for the explorer; loopback or a token is enough."""
    assert explorer_refusal("0.0.0.0", Access()) is not None
    assert explorer_refusal("127.0.0.1", Access()) is None
    assert explorer_refusal("0.0.0.0", Access(token="t")) is None


def test_bearer() -> None:
    """Only a Bearer header gives a token."""
    assert bearer("Bearer  abc ") == "abc" and bearer("Token abc") == "" and bearer(None) == ""


def test_tokens_shared_between_principals_are_refused() -> None:
    """A token that would name two principals is a settings error."""
    assert duplicate_tokens("op", {"a": "x", "b": "x", "c": "op", "d": ""}) == ["b", "c"]
    with pytest.raises(ValidationError, match="another's"):
        Settings(http_token="op", http_tenant_tokens={"acme": "op"})
    s = Settings(http_token="sekret-op-17", http_tenant_tokens={"acme": "sekret-acme-91"})
    assert s.http_access().identify("Bearer sekret-acme-91") == Principal("acme")
    assert "sekret" not in repr(s) and "sekret" not in s.model_dump_json()
    # An empty tenant token could never log in: said at start, not found out at the login form.
    with pytest.raises(ValidationError, match="the token of acme is empty") as refused:
        Settings(http_tenant_tokens={"acme": " ", "globex": "sekret-globex-3"})
    with pytest.raises(ValidationError) as shared:
        Settings(http_token="sekret-op-17", http_tenant_tokens={"acme": "sekret-op-17"})
    assert "sekret" not in str(refused.value) + str(shared.value)  # an error prints no token


def test_tenant_tokens_come_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """``AGENTMEM_HTTP_TENANT_TOKENS`` is a JSON object of tenant -> token."""
    monkeypatch.setenv("AGENTMEM_HTTP_TENANT_TOKENS", json.dumps({"acme": "ta"}))
    monkeypatch.setenv("AGENTMEM_HTTP_TOKEN", "op")
    assert Settings().http_access() == Access(token="op", tenant_tokens={"acme": "ta"})


@pytest.mark.parametrize(
    ("stamps", "start", "more", "want"),
    [
        ([], None, True, None),
        ([5.0, 4.0], None, False, None),  # the last page
        ([5.0, 4.0, 4.0], None, True, PageKey(4.0, 2)),
        ([5.0, 4.0], PageKey(5.0, 3), True, PageKey(4.0, 1)),
        ([4.0, 4.0], PageKey(4.0, 3), True, PageKey(4.0, 5)),  # a page of one stamp: those skipped count too
        ([1.0, 2.0, 3.0], PageKey(1.0, 0), True, PageKey(3.0, 1)),  # ascending
    ],
)
def test_next_key(stamps: list[float], start: PageKey | None, more: bool, want: PageKey | None) -> None:
    """The next page starts at the last stamp, past the chunks of that stamp already shown."""
    assert next_key(stamps, start, more=more) == want


@pytest.mark.parametrize(
    ("raw", "limit", "want"),
    [
        (b"plain text", 100, ("plain text", "text", False)),
        ("héllo".encode(), 2, ("h", "text", True)),  # a character the cut split is dropped
        (b"abcdef", 3, ("abc", "text", True)),
        (b"\xff\xfeA", 100, ("0000  " + "ff fe 41".ljust(47) + "  |..A|", "hex", False)),
        (b"a\x00b", 100, ("0000  " + "61 00 62".ljust(47) + "  |a.b|", "hex", False)),  # a control character
        (b"line\n\ttab\r\n", 100, ("line\n\ttab\r\n", "text", False)),
        (b"", 10, ("", "text", False)),
    ],
)
def test_preview(raw: bytes, limit: int, want: tuple[str, str, bool]) -> None:
    """Original bytes are shown as text when UTF-8, else as hex with their printable ASCII."""
    assert preview(raw, limit) == want


def test_hex_lines_show_every_byte() -> None:
    """Sixteen bytes a line, offset first; what is not printable ASCII shows as a dot."""
    lines = hex_lines(bytes(range(20))).splitlines()
    assert len(lines) == 2 and lines[1].startswith("0010  10 11 12 13") and lines[1].endswith("|....|")


def test_dead_letters_are_read_leniently_with_their_tenant() -> None:
    """A DLQ record names its original's tenant; a value that is no DLQ record still shows, as bytes."""
    body = {
        "reason": "bad",
        "error_code": "invalid_event",
        "topic": "memory.documents.acme",
        "partition": 1,
        "offset": 7,
        "original_b64": base64.b64encode(b"<script>").decode(),
        "failed_at": "2026-01-01T00:00:00+00:00",
        "attempts": 2,
        "original_size": 8,
    }
    bases = ("memory.documents", "memory.transcripts", "memory.requests")
    d = dead_letter(0, 3, json.dumps(body).encode(), bases=bases, tenancy="topic")
    assert (d.tenant, d.original_partition, d.original_offset, d.preview, d.preview_kind) == (
        "acme",
        1,
        7,
        "<script>",
        "text",
    )
    junk = dead_letter(0, 4, b"\x00\x01", bases=bases, tenancy="topic")
    assert junk.tenant is None and junk.preview_kind == "hex"
    assert tenant_of("memory.documents", bases, "single") == "default"
    assert tenant_of("memory.documentsx.acme", bases, "topic") is None


def _chunk(text: str, chunk_id: str = "transcript:a/s/0_p0", kind: str = "transcript") -> StoredChunk:
    return StoredChunk(
        chunk_id=chunk_id,
        text=text,
        doc_id=chunk_id.rsplit("_p", 1)[0],
        source="",
        kind=kind,
        metadata={"role": HOSTILE},
        tags={"tenant": "acme"},
        timestamp=1_700_000_000.0,
        version=1,
    )


def test_memory_views_escape_everything_from_memory() -> None:
    """A turn's text, role and ids show as text: no tag of theirs reaches the page."""
    page = ChunkPage([_chunk(HOSTILE)], PageKey(1.0, 1))
    out = turns_body(page, {"tenant": "acme", "agent": "<a>", "session": "s"})
    out += document_body("acme", "<doc>", [_chunk(HOSTILE)])
    assert "<script" not in out and "<img" not in out and "<doc>" not in out and "<a>" not in out
    assert esc(HOSTILE) in out and 'id="next-page"' in out and "agent=%3Ca%3E" in out


def test_control_characters_show_as_their_pictures() -> None:
    """A NUL (from a query's ``?q=`` or a stored text) is not written into the page raw."""
    assert esc("a\x00b\x1b[31m\x7f") == "a\u2400b\u241b[31m\u2421"
    assert esc("tab\tline\nend\r") == "tab\tline\nend\r"
    out = document_body("acme", "doc\x00", [_chunk("text\x00")])
    assert "\x00" not in out and "\u2400" in out


def test_urls_are_encoded_and_escaped() -> None:
    """Query parameters are URL-encoded, and the whole URL escaped for an attribute."""
    assert url("/explore/x", a='"><b>', b=None, c="") == "/explore/x?a=%22%3E%3Cb%3E"


def test_results_show_each_legs_rank_and_its_own_list() -> None:
    """Each result shows its rank in every leg (a dash where a leg missed it); each leg's own list marks the winners."""
    hits = [
        SearchHit(chunk=_chunk("first", "d1_p0", "document"), score=0.2, ranks={"sparse": 2, "dense": 1}),
        SearchHit(chunk=_chunk(HOSTILE, "d2_p0", "document"), score=0.1, ranks={"sparse": 1}),
    ]
    cand = {c: LegHit(f"k:{c}", c, "document", {}, (), None, 1, 1) for c in ("d1_p0", "d2_p0", "d3_p0")}
    outcome = SearchOutcome(
        hits=hits,
        took_ms=1.0,
        ranked={"sparse": ["d2_p0", "d1_p0"], "dense": ["d1_p0", "d3_p0"]},
        candidates=cand,
    )
    out = results_html(outcome, {"sparse": 1.0, "dense": 1.0}, 10, {"d3_p0": "<i>leg only</i>"}, "acme", {})
    assert 'id="leg-sparse"' in out and 'id="leg-dense"' in out and "not in the results" in out
    assert "&lt;i&gt;leg only&lt;/i&gt;" in out and "<script" not in out
    second = out.split('id="results"')[1].split("<tr>")[3]
    assert '<span class="num">1</span>' in second and "&ndash;" in second


def test_a_result_shows_the_repeats_folded_into_it_and_the_legs_say_where_they_went() -> None:
    """A folded candidate is not "not in the results": its leg list says which result it repeats."""
    copy = _chunk("first", "d3_p0", "document")
    hit = SearchHit(chunk=_chunk("first", "d1_p0", "document"), score=0.2, ranks={"dense": 1}, repeats=(copy,))
    hit = dataclasses.replace(hit, repeat_count=1)
    cand = {c: LegHit(f"k:{c}", c, "document", {}, (), None, 1, 1) for c in ("d1_p0", "d3_p0")}
    outcome = SearchOutcome(hits=[hit], took_ms=1.0, ranked={"dense": ["d1_p0", "d3_p0"]}, candidates=cand)
    out = results_html(outcome, {"dense": 1.0}, 10, {}, "acme", {})
    assert "the same text in 1 more" in out and "repeats #1" in out and "not in the results" not in out


def test_leg_order_reads_lists_and_tied_ranks() -> None:
    """A list leg ranks by position; a leg of tied ranks by rank, then id."""
    assert leg_order(["b", "a"]) == [("b", 1), ("a", 2)]
    assert leg_order({"b": 1, "a": 1, "c": 3}) == [("a", 1), ("b", 1), ("c", 3)]


def test_communities_picture_marks_the_stale_and_escapes_ids() -> None:
    """Each community is a link sized by its members; stale ones are marked and say why in their title."""
    comms = [Community("c<1>", 0, frozenset({"a", "b", "c"})), Community("c2", 0, frozenset({"d"}))]
    item = StaleItem("c<1>", 0, 1.0, 2.0, 3, ["doc<x>"])
    out = communities_svg(comms, {"c<1>": item}, "acme")
    assert out.count("<circle") == 2 and out.count('class="community stale"') == 1
    assert "c&lt;1&gt;" in out and "doc&lt;x&gt;" in out and "<x>" not in out
    assert "collecting" in stale_chart([(1.0, 2)], 5.0)
    chart = stale_chart([(1.0, 2), (2.0, 5), (3.0, 1)], 3.0)
    assert "<polyline" in chart and ">5<" in chart and "1 now" in chart


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("", {}),
        ("env=prod", {"env": "prod"}),
        ("env = prod\n\nservice=a=b", {"env": "prod", "service": "a=b"}),
        ("env=a\nenv=b\nenv=c", {"env": ["a", "b", "c"]}),
        ("env != prod\nservice!=a\nservice! = b", {"env": {"not": "prod"}, "service": {"not": ["a", "b"]}}),
    ],
)
def test_parse_filters(text: str, want: dict[str, object]) -> None:
    """``key=value`` lines make a metadata filter; a repeated key takes any of its values, and
    ``key!=value`` none of them."""
    assert parse_filters(text) == want


def test_parse_filters_refuses_a_line_without_a_value() -> None:
    """A line with no ``=`` is an error, not a silent drop."""
    with pytest.raises(InvalidRequest, match="key=value or key!=value, not 'env'"):
        parse_filters("env")
    with pytest.raises(InvalidRequest, match="both = and !="):
        parse_filters("env=a\nenv!=b")


def test_a_community_page_says_why_it_is_stale_and_shows_its_summary_escaped() -> None:
    """A stale community names the documents that made it so; its summary and members show as text."""
    from daemon.explore.views_graph import community_body

    comm = Community("c1", 0, frozenset({"k1", "k2"}), parent="p<0>")
    item = StaleItem("c1", 0, 90.0, 95.0, 2, ["runbooks/<x>.md"])
    summary = {"text": "<b>summary</b>", "model": "extractive", "written_at": 50.0}
    out = community_body("acme", comm, "c1", summary, {"k1": ("<Alice>", "person")}, item, True, 100.0)
    assert 'class="stale"' in out and "stale for 10 s, 2 changes" in out and "runbooks/&lt;x&gt;.md</a>" in out
    assert "&lt;b&gt;summary&lt;/b&gt;" in out and "&lt;Alice&gt;" in out and "<b>" not in out
    # k2 is no node any more (every document naming it was deleted or forgotten): not listed
    assert ">k1<" in out and "k2" not in out
    written = community_body("acme", comm, "c1", summary, {"k1": ("Alice", "person")}, None, False, 100.0)
    assert "fresh: its summary covers its members" in written and "1 members" in written
    unsummarized = community_body("acme", comm, "c1", None, {"k1": ("Alice", "person")}, None, False, 100.0)
    assert "not summarized yet" in unsummarized and "fresh" not in unsummarized
    # Every member gone (each document naming them deleted): never "fresh", and no member count.
    gone = community_body("acme", comm, "c1", summary, {}, None, False, 100.0)
    assert "gone: every member was deleted or forgotten" in gone and "fresh" not in gone and "0 members" in gone
    assert "does not exist" in community_body("acme", None, "c9", None, {}, None, False, 100.0)
    failing = StaleItem("c1", 0, 90.0, 95.0, 2, [], attempts=2, last_error="LlmFailed: <timeout>")
    page = community_body("acme", comm, "c1", summary, {"k1": ("Alice", "person")}, failing, True, 100.0)
    assert "its summary failed 2 time(s): LlmFailed: &lt;timeout&gt;" in page


def test_a_document_page_shows_its_version_and_a_turn_none() -> None:
    """A document's page names its stored version; a turn's says it has none (turns are unversioned)."""
    doc = _chunk("text", chunk_id="guide.md_p0", kind="document")
    assert "unversioned" not in document_body("acme", "guide.md", [doc])
    assert "<td>1</td>" in document_body("acme", "guide.md", [doc])
    assert "unversioned" in document_body("acme", "transcript:a/s/0", [_chunk("hi")])


def test_a_document_page_shows_its_earlier_versions_escaped() -> None:
    doc = _chunk("Ana lives in Berlin.", chunk_id="facts/ana_p0", kind="document")
    past = [Version(3, HOSTILE, "facts/ana", {"team": "<b>"}, 1_700_000_000.0, 1_700_086_400.0)]
    page = document_body("acme", "facts/ana", [doc], past)
    assert "Earlier versions" in page and esc(HOSTILE) in page and "<script" not in page and "<b>" not in page
    assert "2023-11-14" in page and "2023-11-15" in page  # from, until
    assert "none kept" in document_body("acme", "facts/ana", [doc])
    assert "Earlier versions" not in document_body("acme", "transcript:a/s/0", [_chunk("hi")])


def test_a_stale_community_says_what_marked_it() -> None:
    """The docs whose changes marked it, or, with none (a recompute made it), that: never an
    empty "caused by" beside "0 changes"."""
    from graph.stale_queue import RECOMPUTE_CAUSE

    new = StaleItem("c0-1", 0, 1.0, 1.0, 0, [])
    marked = StaleItem("c0-2", 0, 1.0, 2.0, 7, [f"d{i}" for i in range(9)])
    assert new.cause() == RECOMPUTE_CAUSE
    assert marked.cause() == "d0, d1, d2, d3, d4" and marked.cause(limit=2) == "d0, d1"


def test_an_erased_tenants_dead_letters_from_before_its_erasure_are_never_shown() -> None:
    """Erased and not started anew: every dead letter of it is hidden. Started anew: only those
    from before the erasure (or of an unknown time); another tenant's always show."""

    def letter(tenant: str, failed_at: str) -> DeadLetter:
        return DeadLetter(0, 0, tenant, "bad", "invalid_event", "t", 0, 0, failed_at, 1, 3, "{x", "text", False)

    at = 1_780_000_000.0  # 2026-05-28T20:26:40Z
    before, after = "2026-05-28T20:26:39+00:00", "2026-05-28T20:26:41+00:00"
    gone = {"acme": Erasure(at=at, restored=False)}
    anew = {"acme": Erasure(at=at, restored=True)}
    assert erased_letter(letter("acme", after), gone) and erased_letter(letter("acme", before), gone)
    assert erased_letter(letter("acme", before), anew) and not erased_letter(letter("acme", after), anew)
    assert erased_letter(letter("acme", "not a time"), anew)
    assert not erased_letter(letter("globex", before), gone)


def test_the_dlq_page_counts_the_dead_letters_of_erased_tenants_it_leaves_out() -> None:
    """Its count then agrees with the DLQ's own (the status page, doctor), as `dlq list` says."""
    assert 'id="dlq-hidden"' not in dlq_body([], topic="memory.dlq", limit=20)
    body = dlq_body([], topic="memory.dlq", limit=20, hidden=3)
    assert "3 dead letter(s) of erased tenants not shown" in body


def test_the_dlq_page_says_which_dead_letters_were_sent_again() -> None:
    """``dlq replay``'s mark shows beside its letter: when, where to, what its ack said."""
    letter = DeadLetter(
        1, 42, "default", "bad", "invalid_event", "memory.documents", 0, 7, "t", 1, 3, "{x", "text", False
    )
    other = dataclasses.replace(letter, offset=43)
    mark = ReplayMark(at=1_780_000_000.0, to="memory.documents", said="indexed <1 chunk>", letter=letter_id(letter))
    body = dlq_body([letter, other], topic="memory.dlq", limit=20, marks={"memory.dlq:1:42": mark})
    assert body.count('class="dlq-replayed"') == 1
    assert "2026-05-28T20:26:40+00:00 to memory.documents: indexed &lt;1 chunk&gt;" in body


def test_a_long_documents_page_shows_a_page_of_its_chunks_and_links_the_next() -> None:
    """A page of a document of 250 chunks shows the chunks read for it with a link to the
    next; the last page links back to the first and shows no earlier versions again; a page
    past the end says how many there are; a long earlier version is shown up to VERSION_CHARS."""
    from daemon.explore.views_memory import VERSION_CHARS

    chunks = [_chunk(f"part {n}", chunk_id=f"big.md_p{n}", kind="document") for n in range(250)]
    past = [Version(1, "y" * (VERSION_CHARS + 500), "big.md", {}, 1_700_000_000.0, 1_700_086_400.0)]
    first = document_body("acme", "big.md", chunks[:100], past, offset=0, total=250)
    assert "part 99<" in first and "<td>250</td>" in first
    assert "offset=100" in first and "first page" not in first
    assert "Earlier versions" in first and "(500 more characters)" in first
    last = document_body("acme", "big.md", chunks[200:], offset=200, total=250)
    assert "part 249<" in last and "next page" not in last and "first page" in last
    assert "Earlier versions" not in last
    past_end = document_body("acme", "big.md", [], offset=300, total=250)
    assert "no chunk from 300: big.md has 250" in past_end and "first page" in past_end


async def test_only_a_few_pages_are_read_and_rendered_at_once() -> None:
    """Six pages asked at once run two at a time (``concurrent_pages``): the others wait their
    turn instead of sharing the event loop with every tenant's queries all together."""
    import asyncio
    from types import SimpleNamespace
    from typing import Any

    from aiohttp import web

    from daemon.explore.access import Access
    from daemon.explore.config import ExploreConfig
    from daemon.explore.routes import Explorer

    reads: Any = SimpleNamespace(settings=SimpleNamespace(explore=ExploreConfig(concurrent_pages=2)))
    explorer = Explorer(reads=reads, access=Access(token="", tenant_tokens={}))
    running = peak = 0
    release = asyncio.Event()

    async def page(_request: web.Request) -> web.Response:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1
        return web.Response(text="ok")

    guarded = explorer._guarded(page)
    asked = [asyncio.create_task(guarded(Any)) for _ in range(6)]  # type: ignore[arg-type]
    for _ in range(20):
        await asyncio.sleep(0)
    assert running == 2
    release.set()
    assert [r.text for r in await asyncio.gather(*asked)] == ["ok"] * 6 and peak == 2


async def test_an_erased_tenant_is_listed_as_erased_not_as_empty() -> None:
    """The tenants page says when a tenant was erased (not "0 0 0", which reads as a tenant
    that never wrote); one started anew is counted again; nothing of an erased one is read."""
    import types
    from typing import Any, cast

    from daemon.explore.reads import MemoryReads
    from daemon.explore.views_memory import tenants_body
    from memory.tenants import Erasure

    counted: list[str] = []

    async def count_where(where: dict[str, str]) -> int:
        counted.append(where["tenant"])
        return 7

    async def erased() -> dict[str, Erasure]:
        return {"acme": Erasure(at=1_700_000_000.0, restored=False), "anew": Erasure(at=1.0, restored=True)}

    reads = MemoryReads(
        index=cast(Any, types.SimpleNamespace(count_where=count_where)),
        retriever=cast(Any, None),
        search=cast(Any, None),
        graph=None,
        status=cast(Any, None),
        settings=cast(Any, None),
        erased=erased,
    )
    rows = await reads.tenant_rows(["acme", "anew", "globex"])
    assert [(r.tenant, r.documents, r.erased_at) for r in rows] == [
        ("acme", 0, 1_700_000_000.0),
        ("anew", 7, None),
        ("globex", 7, None),
    ]
    assert "acme" not in counted
    body = tenants_body(rows)
    assert "erased 2023-11-14" in body and 'tenant=acme"' not in body and "tenant=globex" in body
