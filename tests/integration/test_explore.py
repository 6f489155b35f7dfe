"""The explorer in headless Chromium and over HTTP, against one real daemon (broker, Redis, graph).

One daemon for the module, in topic tenancy with two tenants: its own HTTP server on loopback
without a token (what the browser reads), and a second server over the same parts with an
operator's and two tenants' tokens (the access tests). Screenshots go to
``$AGENTMEM_TEST_ARTIFACTS`` (default: a temporary folder the test names).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from consumers.config import ConsumerConfig
from daemon.explore import Access
from daemon.http import build_app, start_http
from daemon.instance import Daemon, explorer
from daemon.launcher import free_port
from daemon.topics import ensure_topics
from graph.config import GraphConfig
from memory.search_results import SearchHit
from memory.search_spec import SearchSpec
from tests.conftest import unique
from tests.helpers import PlainClient, chromium, chromium_flags, eventually, isolated_settings, start_daemon
from tests.helpers.stacks import settled

pytestmark = pytest.mark.integration

TENANTS = ("acme", "globex")
TOKENS = {"operator": "op-secret-1", "acme": "acme-secret-2", "globex": "globex-secret-3"}
HOSTILE = "<script>document.title='pwned'</script><b>bold?</b> <img src=x onerror=\"document.title='x'\">"
GLOBEX_WORD = "zanzibarglobexonly"
DASH = "\u2013"  # what the page shows for "this leg did not find it"
BILLING_V2 = (
    "Alice Johnson of Acme Corporation met Bob Smith in Berlin about the billing-service outage. "
    "Carol White joined Bob Smith and Alice Johnson in Paris; Acme Corporation's ledger moved to Postgres."
)


@dataclass
class Env:
    daemon: Daemon
    client: PlainClient
    base: str  # the daemon's own server: loopback, no token
    guarded: str  # the same parts behind tokens
    shots: Path
    doms: dict[str, str] = field(default_factory=dict)  # path -> DOM, so a page is loaded once


def http(url: str, token: str | None = None, cookie: str | None = None) -> tuple[int, str, dict[str, str]]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if cookie:
        req.add_header("Cookie", cookie)
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


async def get(url: str, token: str | None = None, cookie: str | None = None) -> tuple[int, str, dict[str, str]]:
    return await asyncio.to_thread(http, url, token, cookie)


async def browse(env: Env, path: str, shot: str, *, height: int = 1000) -> str:
    """The page's DOM after Chromium loaded it (scripts would have run by then), and its screenshot."""
    if path in env.doms:
        return env.doms[path]
    browser = chromium()
    if browser is None:
        pytest.skip("no Chromium on this machine (.ci/run installs Debian's chromium where it can)")
    user_dir = tempfile.mkdtemp(prefix="chromium-")
    flags = [*chromium_flags(user_dir), "--hide-scrollbars"]
    target = env.base + path
    png = env.shots / f"explore-{shot}.png"
    try:
        # One run for both: the DOM after load (scripts would have run by then) and the picture.
        dom = await asyncio.to_thread(
            subprocess.run,
            [browser, *flags, "--dump-dom", f"--screenshot={png}", f"--window-size=1200,{height}", target],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        shutil.rmtree(user_dir, ignore_errors=True)
    assert png.exists() and png.stat().st_size > 1000, dom.stderr[-500:]
    assert "<html" in dom.stdout, dom.stderr[-500:]
    env.doms[path] = dom.stdout
    return dom.stdout


@pytest.fixture(scope="module")
async def env(kafka_bootstrap: str, redis_url: str) -> AsyncIterator[Env]:
    name = unique(__name__)
    settings = isolated_settings(
        name,
        kafka_bootstrap,
        redis_url,
        topic_partitions=1,
        http_port=free_port(),
        status_sample_s=0.3,
        consumer=ConsumerConfig(group_id=name, tenancy="topic", metadata_max_age_ms=500),
        # no summarizer: the stale queue holds still for the graph pages
        graph=GraphConfig(summarizer_concurrency=0),
    )
    t = settings.topics
    topics = [f"{base}.{tenant}" for tenant in TENANTS for base in (t.documents, t.transcripts, t.requests, t.replies)]
    await ensure_topics(kafka_bootstrap, topics, partitions=1, replication=1)
    daemon = await start_daemon(settings)
    client = PlainClient(kafka_bootstrap, t, t.replies)
    runner: web.AppRunner | None = None
    try:
        await client.start()
        access = Access(token=TOKENS["operator"], tenant_tokens={k: v for k, v in TOKENS.items() if k != "operator"})

        async def ready() -> dict[str, str | None]:
            return {"redis": None}

        guarded_port = free_port()
        app = build_app(
            state=daemon.status,
            ready_check=ready,
            access=access,
            explorer=explorer(daemon, access=access),  # the daemon's own parts, behind tokens
        )
        runner = await start_http(app, "127.0.0.1", guarded_port)
        shots = Path(os.environ.get("AGENTMEM_TEST_ARTIFACTS") or tempfile.mkdtemp(prefix="agentmemd-explore-"))
        await asyncio.to_thread(shots.mkdir, parents=True, exist_ok=True)
        e = Env(daemon, client, f"http://127.0.0.1:{settings.http_port}", f"http://127.0.0.1:{guarded_port}", shots)
        await _fill(e)
        yield e
    finally:
        if runner is not None:
            await runner.cleanup()
        await client.stop()
        await daemon.stop()


async def _fill(env: Env) -> None:
    """Two tenants' turns and documents, a hostile turn, dead letters; communities made stale."""
    t = env.client.topics
    turns = [
        "The deploy of billing-service to production failed with ERR_CONN_RESET_4F2A on db-01.",
        HOSTILE,
        "We rolled back billing-service and pgbouncer recovered; Alice Johnson from Acme Corporation confirmed.",
    ]
    for i, text in enumerate(turns):
        event = {"event_id": f"a{i}", "agent_id": "ops-bot", "session_id": "s1", "turn": i, "content": text}
        event["timestamp"] = f"2026-01-0{i + 1}T10:00:00Z"
        await env.client.send(f"{t.transcripts}.acme", event, key="ops-bot/s1")
    await env.client.send(
        f"{t.documents}.acme",
        {
            "event_id": "d1",
            "op": "upsert",
            "doc_id": "runbooks/billing.md",
            "version": 1,
            "content": "Alice Johnson of Acme Corporation met Bob Smith in Berlin about the billing-service outage. "
            "Bob Smith and Alice Johnson moved Acme Corporation's ledger from Oracle to Postgres in London.",
        },
    )
    await env.client.send(
        f"{t.documents}.globex",
        {"event_id": "g1", "op": "upsert", "doc_id": "globex/plan.md", "version": 1, "content": f"{GLOBEX_WORD} plan"},
    )
    await env.client.send(f"{t.documents}.acme", b"\xff\xfe\x00not json <script>alert(1)</script>", key="bad-a")
    await env.client.send(f"{t.documents}.globex", b'{"op": "upsert"}', key="bad-g")
    index = env.daemon.index

    async def stored() -> bool:
        have = [await index.count_where({"tenant": "acme", "kind": k}) for k in ("transcript", "document")]
        return have[0] >= 3 and have[1] >= 1 and await index.count_where({"tenant": "globex"}) >= 1

    await eventually(stored, timeout=120, what="both tenants' memory indexed")
    assert env.daemon.graph is not None
    svc = env.daemon.graph.service("acme")

    async def recomputed() -> bool:
        return await svc.recompute(force=True) is not None and (await svc.store.stale())[0] > 0

    await eventually(recomputed, timeout=60, what="acme's communities computed and stale")
    # An edit marks the communities of the entities it touches, naming itself as the cause.
    await env.client.send(
        f"{t.documents}.acme",
        {"event_id": "d2", "op": "upsert", "doc_id": "runbooks/billing.md", "version": 2, "content": BILLING_V2},
    )

    async def caused() -> bool:
        _, items = await svc.store.stale()
        return any("runbooks/billing.md" in i.doc_ids for i in items)

    await eventually(caused, timeout=60, what="the edit named as a stale community's cause")

    async def sampled() -> bool:
        return len(env.daemon.status.tenant_history.get("acme", ())) >= 3

    await eventually(sampled, timeout=30, what="the stale queue sampled")


async def test_browse_tenants_to_a_turn_in_a_real_browser(env: Env) -> None:
    """Tenants → agents → sessions → turns: the page lists both tenants and a session's turns in order."""
    dom = await browse(env, "/explore", "tenants", height=500)
    assert all(f">{t}</a>" in dom for t in TENANTS), dom[:2000]
    # The pages between are the server's HTML as sent (no script changes a page here).
    status, body, _ = await get(env.base + "/explore/tenant?tenant=acme")
    assert status == 200
    assert 'href="/explore/sessions?tenant=acme&amp;agent=ops-bot">ops-bot</a>' in body
    assert "runbooks/billing.md</a>" in body
    # What is not there is a 404, saying so: a tenant nobody wrote for, a document never written.
    status, body, _ = await get(env.base + "/explore/tenant?tenant=nope")
    assert status == 404 and "no tenant &#x27;nope&#x27; has anything stored" in body, body[-800:]
    status, body, _ = await get(env.base + "/explore/document?tenant=acme&doc=runbooks/nope.md")
    assert status == 404 and "never written" in body, body[-800:]
    status, _, _ = await get(env.base + "/explore/document?tenant=acme&doc=runbooks/billing.md")
    assert status == 200
    for missing in (
        "/explore/sessions?tenant=acme&agent=ops-bto",
        "/explore/turns?tenant=acme&agent=ops-bot&session=s9",
        "/explore/community?tenant=acme&id=c-nope",
    ):
        status, _, _ = await get(env.base + missing)
        assert status == 404, missing
    _, body, _ = await get(env.base + "/explore/sessions?tenant=acme&agent=ops-bot")
    assert 'href="/explore/turns?tenant=acme&amp;agent=ops-bot&amp;session=s1">s1</a>' in body
    dom = await browse(env, "/explore/turns?tenant=acme&agent=ops-bot&session=s1", "turns", height=500)
    turns = re.findall(r'<td><span class="num">(\d+)</span></td>', dom)
    assert turns == ["0", "1", "2"], dom[:3000]
    assert "ERR_CONN_RESET_4F2A" in dom and "pgbouncer recovered" in dom


async def test_a_turn_of_html_and_script_shows_as_text_and_runs_nothing(env: Env) -> None:
    """The hostile turn shows escaped, as text; the title the script would set is untouched; scripts are forbidden."""
    dom = await browse(env, "/explore/turns?tenant=acme&agent=ops-bot&session=s1", "turns", height=500)
    assert "&lt;script&gt;document.title='pwned'&lt;/script&gt;&lt;b&gt;bold?&lt;/b&gt;" in dom
    assert "<script" not in dom and "<b>bold?" not in dom and "<img" not in dom
    title = re.search(r"<title>([^<]*)</title>", dom)
    assert title and "pwned" not in title.group(1) and title.group(1) != "x"
    _, _, headers = await get(env.base + "/explore/turns?tenant=acme&agent=ops-bot&session=s1")
    assert (
        "script-src 'self'" in headers["Content-Security-Policy"]
        and "default-src 'none'" in headers["Content-Security-Policy"]
    )


async def test_ask_shows_each_legs_rank_beside_the_fused_score(env: Env) -> None:
    """The ask page runs the real retrieval: each result's BM25 and vector ranks and score are the search's own."""
    query = "billing-service rollback pgbouncer"
    params = urllib.parse.urlencode({"tenant": "acme", "q": query, "k": "5", "scope": "chunks"})
    assert env.daemon.search is not None

    def shown(dom: str) -> list[list[str]]:
        """Each result row's cells: #, fused score, BM25 rank, vector rank, moved, memory, text."""
        table = dom.split('id="results"', 1)[1].split("</table>", 1)[0]
        rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]
        return [
            [re.sub(r"<[^>]+>", "", c).replace("&ndash;", DASH).strip() for c in re.findall(r"<td>(.*?)</td>", r, re.S)]
            for r in rows
        ]

    def same(rows: list[list[str]], hits: list[SearchHit]) -> bool:
        return len(rows) == len(hits) > 0 and all(
            float(cells[1]) == pytest.approx(hit.score, abs=1e-5)
            and cells[2] == str(hit.ranks.get("sparse", DASH))
            and cells[3] == str(hit.ranks.get("dense", DASH))
            and hit.chunk.chunk_id in cells[5]
            for cells, hit in zip(rows, hits, strict=True)
        )

    # The page's search and this one must see the same BM25 statistics: a GC run between them
    # (the graph's summaries are written meanwhile) changes the scores, so up to three tries.
    for _ in range(3):
        await settled(env.daemon.index._r, env.daemon.index.cfg.name)
        dom = await browse(env, f"/explore/ask?{params}", "ask", height=1300)
        assert 'id="results"' in dom and 'id="leg-sparse"' in dom and 'id="leg-dense"' in dom, dom[:3000]
        outcome, _ = await env.daemon.search.search(SearchSpec(text=query, top_k=5, tenant="acme"), "chunks")
        if same(shown(dom), outcome.hits):
            break
    else:
        pytest.fail(f"the page showed {shown(dom)}, the search gives {[(h.score, h.ranks) for h in outcome.hits]}")
    assert "BM25 rank" in dom and "vector rank" in dom and "fused #1" in dom
    assert 'name="speaker"' in dom  # the speaker list's weight, beside the legs'
    _, refused, _ = await get(env.base + f"/explore/ask?{params}&speaker=-1")
    assert "speaker_weight" in refused  # passed on as the contract's hybrid_params.speaker_weight
    # A mistyped field is named in words, not as Python's or pydantic's own text; an age is a time.
    asked = urllib.parse.urlencode({"tenant": "acme", "q": query})
    for bad, says in (
        ("k=abc", "k (results) is no whole number: &#x27;abc&#x27;"),
        ("since=last-tuesday", "since takes"),
    ):
        status, body, _ = await get(env.base + f"/explore/ask?{asked}&{bad}")
        assert says in body and "pydantic" not in body and "invalid literal" not in body, body[-1500:]
        assert status == 400
    # A parameter the form does not have is refused, as the contract refuses a field, not read past.
    status, body, _ = await get(env.base + f"/explore/ask?{asked}&topk=3")
    assert status == 400 and "unknown field &#x27;topk&#x27;" in body and 'id="results"' not in body, body[-800:]
    status, body, _ = await get(env.base + f"/explore/ask?{asked}&scop=all")
    assert status == 400 and "unknown field &#x27;scop&#x27;: did you mean &#x27;scope&#x27;?" in body, body[-800:]
    _, aged, _ = await get(env.base + f"/explore/ask?{params}&since=3650d")
    assert 'id="results"' in aged and 'id="error"' not in aged and "since takes" not in aged
    # With a recency weight, each result's rank by time is shown beside the legs' ranks.
    _, recent, _ = await get(env.base + f"/explore/ask?{params}&recency=1")
    assert 'id="leg-recency"' in recent and "recency rank" in recent, recent[-3000:]


async def test_the_graph_shows_a_stale_community_and_why(env: Env) -> None:
    """Communities are drawn with the stale ones marked; a stale community's page names its cause and summary state."""
    dom = await browse(env, "/explore/graph?tenant=acme", "graph", height=900)
    assert 'id="communities"' in dom and 'class="community stale"' in dom, dom[:3000]
    assert 'id="stale-chart"' in dom and "<polyline" in dom
    assert env.daemon.graph is not None
    depth, items = await env.daemon.graph.store("acme").stale()
    assert re.search(rf'id="stale-depth">{depth}<', dom)
    item = next(i for i in items if i.doc_ids)
    params = urllib.parse.urlencode({"tenant": "acme", "id": item.community_id})
    dom = await browse(env, f"/explore/community?{params}", "community", height=700)
    state = re.search(r'<p id="community-state"[^>]*>(.*?)</p>', dom, re.S)
    assert state and "stale" in state.group(1), dom[:3000]
    assert item.doc_ids and all(f">{doc}</a>" in state.group(1) for doc in item.doc_ids)
    assert 'id="members"' in dom and 'id="summary"' in dom


async def test_a_dead_letter_shows_reason_position_and_a_safe_preview(env: Env) -> None:
    """The DLQ page reads the real DLQ: reason, original topic/partition/offset, non-UTF-8 bytes as hex."""
    t = env.client.topics

    async def dead() -> bool:
        _, body, _ = await get(env.base + "/explore/dlq")
        return body.count('class="dlq-reason"') >= 2

    await eventually(dead, timeout=30, what="both dead letters readable")
    dom = await browse(env, "/explore/dlq", "dlq", height=700)
    assert f"{t.documents}.acme / 0 / " in dom and f"{t.documents}.globex / 0 / " in dom, dom[:3000]
    assert "bytes (not UTF-8), as hex" in dom and "ff fe 00 6e" in dom and "|..." in dom
    assert "<script>alert" not in dom


async def test_without_a_token_only_health_and_readiness_answer(env: Env) -> None:
    """With tokens: all but /healthz and /readyz answer 401 without one; a tenant's reaches the explorer only."""
    for path in ("/healthz", "/readyz"):
        status, _, _ = await get(env.guarded + path)
        assert status == 200, path
    paths = ["/", "/metrics", "/explore", "/explore/ask?q=x", "/explore/graph", "/explore/dlq", "/explore/chunks"]
    for path in paths:
        status, _, headers = await get(env.guarded + path)
        assert status == 401 and headers.get("WWW-Authenticate", "").startswith("Bearer"), path
        status, _, _ = await get(env.guarded + path, token="not-a-token")
        assert status == 401, path
    for path in paths:
        status, _, _ = await get(env.guarded + path, token=TOKENS["operator"])
        assert status == 200, path
    status, body, _ = await get(env.guarded + "/metrics", token=TOKENS["operator"])
    assert "agentmemd_" in body
    for path in ("/", "/metrics"):
        status, _, _ = await get(env.guarded + path, token=TOKENS["acme"])
        assert status == 403, path
    status, _, headers = await get(env.guarded + "/explore/login")
    assert status == 200


async def test_a_tenants_token_never_shows_another_tenants_data(env: Env) -> None:
    """acme's token sees acme only, in every view: tenants, browse, query, graph and dead letters."""
    acme, glob = TOKENS["acme"], TOKENS["globex"]
    _, body, _ = await get(env.guarded + "/explore", token=acme)
    assert ">acme</a>" in body and "globex" not in body
    for path in (
        "/explore/tenant?tenant=globex",
        "/explore/documents?tenant=globex",
        "/explore/document?tenant=globex&doc=globex/plan.md",
        f"/explore/ask?tenant=globex&q={GLOBEX_WORD}",
        "/explore/graph?tenant=globex",
        "/explore/chunks?tenant=globex",
    ):
        status, _, _ = await get(env.guarded + path, token=acme)
        assert status == 403, path
    # A tenant no key could hold (the legs read tenants back from keys) is refused, not looked up.
    for path in ("/explore/document?tenant=acme:x&doc=plan.md", "/explore/ask?tenant=acme:x&q=plan"):
        status, body, _ = await get(env.guarded + path, token=TOKENS["operator"])
        assert status == 400 and "cannot lead a key" in body, path
    # No tenant named: a tenant's own; its search never reaches another's chunks.
    status, body, _ = await get(env.guarded + f"/explore/ask?q={GLOBEX_WORD}&k=20&sparse=1&dense=1", token=acme)
    assert status == 200 and "globex/plan.md" not in body and 'id="results"' in body
    status, body, _ = await get(env.guarded + f"/explore/ask?q={GLOBEX_WORD}&k=20", token=glob)
    assert "globex/plan.md" in body
    _, body, _ = await get(env.guarded + "/explore/chunks", token=acme)
    assert "globex" not in body and "runbooks/billing.md" in body
    t = env.client.topics
    _, body, _ = await get(env.guarded + "/explore/dlq", token=acme)
    assert f"{t.documents}.acme" in body and f"{t.documents}.globex" not in body
    _, body, _ = await get(env.guarded + "/explore/dlq", token=glob)
    assert f"{t.documents}.globex" in body and f"{t.documents}.acme" not in body


async def test_the_login_form_sets_a_cookie_a_browser_can_use(env: Env) -> None:
    """Posting a token sets an HttpOnly cookie that then stands for the header; a wrong one is
    refused, and so is a form another site's page posts (its Origin names that site)."""

    def post(token: str, path: str = "/explore/login", **headers: str) -> tuple[int, dict[str, str]]:
        data = urllib.parse.urlencode({"token": token}).encode()
        req = urllib.request.Request(env.guarded + path, data=data, method="POST")
        for name, value in headers.items():
            req.add_header(name.replace("_", "-"), value)

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: object, **kwargs: object) -> None:
                return None

        opener = urllib.request.build_opener(NoRedirect)
        try:
            with opener.open(req, timeout=20) as resp:
                return resp.status, dict(resp.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers)

    status, _ = await asyncio.to_thread(post, "wrong")
    assert status == 401
    login = "/explore/login"
    for other_site in ({"Sec_Fetch_Site": "cross-site", "Origin": "null"}, {"Origin": "https://evil.example"}):
        status, headers = await asyncio.to_thread(post, TOKENS["globex"], login, **other_site)
        assert status == 403 and "Set-Cookie" not in headers, other_site
    # From its own page: a browser says same-origin, and sends Origin null (the pages' no-referrer policy).
    for own_page in ({"Sec_Fetch_Site": "same-origin", "Origin": "null"}, {"Origin": env.guarded}, {"Origin": "null"}):
        status, headers = await asyncio.to_thread(post, TOKENS["globex"], login, **own_page)
        assert status == 303 and "HttpOnly" in headers["Set-Cookie"], own_page
    status, headers = await asyncio.to_thread(post, TOKENS["globex"])
    assert status == 303 and "HttpOnly" in headers["Set-Cookie"]
    cookie = headers["Set-Cookie"].split(";", 1)[0]
    status, body, _ = await get(env.guarded + "/explore", cookie=cookie)
    assert status == 200 and ">globex</a>" in body and "acme" not in body
    # The login page says who is logged in, and logs out (to log in with another token).
    _, body, _ = await get(env.guarded + "/explore/login")
    assert "not logged in" in body and "log out" not in body
    _, body, _ = await get(env.guarded + "/explore/login", cookie=cookie)
    assert "tenant globex" in body and "log out" in body
    status, headers = await asyncio.to_thread(post, "", "/explore/logout")
    gone = headers["Set-Cookie"]
    assert status == 303 and headers["Location"] == "/explore/login", headers
    assert gone.startswith("agentmemd_token=") and "Max-Age=0" in gone, gone


async def test_the_explorer_is_refused_on_a_public_address_without_a_token(env: Env) -> None:
    """A server bound beyond loopback with no token answers 403 under /explore, and serves health as before."""
    app = build_app(state=env.daemon.status, ready_check=_ok, host="0.0.0.0", explorer=explorer(env.daemon))
    port = free_port()
    runner = await start_http(app, "127.0.0.1", port)  # served on loopback: the rule reads the configured host
    try:
        status, body, _ = await get(f"http://127.0.0.1:{port}/explore")
        assert status == 403 and "AGENTMEM_HTTP_TOKEN" in body
        status, _, _ = await get(f"http://127.0.0.1:{port}/healthz")
        assert status == 200
    finally:
        await runner.cleanup()


async def _ok() -> dict[str, str | None]:
    return {}


async def test_a_page_rebound_to_loopback_cannot_read_the_explorer(env: Env) -> None:
    """A web page whose domain was re-pointed at 127.0.0.1 (DNS
    rebinding) could read every tenant's memory through the operator's browser, since the
    loopback server answered any Host. It now answers only loopback names; probes still pass."""

    def with_host(path: str, host: str) -> int:
        req = urllib.request.Request(env.base + path, headers={"Host": host})
        try:
            with urllib.request.urlopen(req, timeout=20) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    port = env.base.rsplit(":", 1)[1]
    for path in ("/", "/explore", "/explore/dlq", "/metrics"):
        assert await asyncio.to_thread(with_host, path, f"attacker.example:{port}") == 421, path
        assert await asyncio.to_thread(with_host, path, f"localhost:{port}") == 200, path
    assert await asyncio.to_thread(with_host, "/healthz", f"attacker.example:{port}") == 200


async def test_the_dlq_is_read_again_only_when_its_log_moved(kafka_bootstrap: str) -> None:
    """A DLQ page viewed again, with no new dead letter, reads no record: the cache gives the
    last read; a new dead letter makes the next view read the DLQ again, and show it."""
    from aiokafka import AIOKafkaProducer

    from daemon.explore.dlq import DlqCache, recent_dead_letters
    from daemon.topics import ensure_topics

    topic = unique("dlq-cache")
    await ensure_topics(kafka_bootstrap, [topic], partitions=2, replication=1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()

    async def letter(reason: str, partition: int) -> None:
        body = {"reason": reason, "error_code": "invalid_event", "topic": "memory.documents", "failed_at": reason}
        await producer.send_and_wait(topic, json.dumps(body).encode(), partition=partition)

    cache = DlqCache()

    async def view() -> list[str]:
        letters = await recent_dead_letters(
            bootstrap=kafka_bootstrap,
            topic=topic,
            options={},
            limit=50,
            wait_s=5.0,
            bases=("memory.documents",),
            tenancy="single",
            cache=cache,
        )
        return [d.reason for d in letters]

    try:
        await letter("r1", 0)
        await letter("r2", 1)
        assert await view() == ["r2", "r1"] and cache.reads == 1
        assert await view() == ["r2", "r1"] and cache.reads == 1  # nothing new: nothing read
        await letter("r3", 0)
        assert await view() == ["r3", "r2", "r1"] and cache.reads == 2
    finally:
        await producer.stop()
