"""The explorer's HTTP edge: GET pages under ``/explore`` (each view has a URL), read-only.

A handler parses its query parameters, checks the tenant against the request's principal
(set by the HTTP server's guard, ``daemon.http``), awaits one read (``reads``) and renders
(the ``views_*`` modules). Every response forbids scripts (``html.CSP``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from consumers.spelling import near_spelling
from daemon.explore.access import COOKIE, OPERATOR, Access, Principal
from daemon.explore.html import CSP, CSS, esc, link, page
from daemon.explore.reads import MemoryReads
from daemon.explore.views_ask import AskForm, error_html, form_html, results_html
from daemon.explore.views_dlq import dlq_body
from daemon.explore.views_graph import community_body, graph_body
from daemon.explore.views_memory import (
    document_body,
    groups_body,
    tenant_body,
    tenants_body,
    timeline_body,
    turns_body,
)
from memory.errors import InvalidRequest, MemdError
from memory.index import PageKey
from memory.keys import check_tenant
from memory.schema import MAX_SEARCH_OFFSET

#: The request key under which the HTTP guard leaves the request's principal.
PRINCIPAL = web.RequestKey("agentmemd.principal", Principal)

Handler = Callable[[web.Request], Awaitable[web.Response]]


def secured(resp: web.Response) -> web.Response:
    """``resp`` with the explorer's headers: no script, no sniffing, no caching, no referrer."""
    resp.headers["Content-Security-Policy"] = CSP
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "no-referrer"
    resp.headers["Cache-Control"] = "no-store"
    resp.headers["X-Frame-Options"] = "DENY"
    return resp


def html_response(text: str, status: int = 200) -> web.Response:
    """An explorer page."""
    return secured(web.Response(text=text, status=status, content_type="text/html"))


def principal_of(request: web.Request) -> Principal:
    """Who the guard found the request to be (the operator where no token is configured)."""
    found: Principal = request.get(PRINCIPAL, OPERATOR)
    return found


def page_key(request: web.Request) -> PageKey | None:
    """The ``at``/``skip`` parameters as a page key; None on the first page.

    Raises:
        InvalidRequest: ``at`` is no finite number or ``skip`` no count.
    """
    at = request.query.get("at")
    if not at:
        return None
    try:
        stamp, skip = float(at), int(request.query.get("skip", "0"))
    except ValueError as exc:
        raise InvalidRequest("the page key is no number") from exc
    if not math.isfinite(stamp) or skip < 0:
        raise InvalidRequest("the page key is out of range")
    return PageKey(stamp, skip)


#: How long a login with a token the server does not accept waits before its answer.
LOGIN_FAILED_PAUSE_S = 1.0


def same_origin(request: web.Request) -> bool:
    """Whether a form posted here came from one of this server's pages (or from no page: a
    script, curl). A browser says so in ``Sec-Fetch-Site``, whatever proxy stands between; one
    too old to send it names the page's origin, which the explorer's ``no-referrer`` policy
    makes ``null`` for its own pages too, so only an origin naming another host is refused."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("Origin")
    if not origin or origin == "null":
        return True
    return urlsplit(origin).netloc == request.host


def offset_of(request: web.Request) -> int:
    """The ``offset`` parameter (0 when absent).

    Raises:
        InvalidRequest: not a count.
    """
    try:
        value = int(request.query.get("offset", "0"))
    except ValueError as exc:
        raise InvalidRequest("offset is no number") from exc
    if not 0 <= value <= MAX_SEARCH_OFFSET:
        raise InvalidRequest("offset is out of range")
    return value


class Explorer:
    """The explorer's routes over one daemon's reads."""

    def __init__(self, *, reads: MemoryReads, access: Access) -> None:
        self._reads = reads
        self._access = access
        self._cfg = reads.settings.explore
        self._refusals = asyncio.Lock()  # refused logins answered one after the other
        self._pages = asyncio.Semaphore(self._cfg.concurrent_pages)

    def routes(self) -> list[web.RouteDef]:
        """Every explorer route (GET pages, the stylesheet, the login form)."""
        pages: dict[str, Handler] = {
            "/explore": self.tenants,
            "/explore/tenant": self.tenant,
            "/explore/agents": self.agents,
            "/explore/sessions": self.sessions,
            "/explore/turns": self.turns,
            "/explore/documents": self.documents,
            "/explore/document": self.document,
            "/explore/chunks": self.chunks,
            "/explore/ask": self.ask,
            "/explore/graph": self.graph,
            "/explore/community": self.community,
            "/explore/dlq": self.dlq,
        }
        out = [web.get(path, self._guarded(handler)) for path, handler in pages.items()]
        out += [
            web.get("/explore/static/explore.css", self.stylesheet),
            web.get("/explore/login", self.login_form),
            web.post("/explore/login", self.login),
            web.post("/explore/logout", self.logout),
        ]
        return out

    def _guarded(self, handler: Handler) -> Handler:
        async def run(request: web.Request) -> web.Response:
            try:
                # A few pages at a time: each one's reads and rendering take the loop queries need.
                async with self._pages:
                    return await handler(request)
            except InvalidRequest as exc:
                return self._error(request, str(exc), 400)
            except web.HTTPException:
                raise
            except MemdError as exc:  # Redis or the broker away: say so on the page
                return self._error(request, f"{exc.code}: {exc}", 503)

        return run

    def _error(self, request: web.Request, message: str, status: int) -> web.Response:
        body = f'<p class="bad" id="error">{esc(message)}</p>'
        return html_response(page("Cannot show this", body, view="", who=self._who(request)), status)

    def _who(self, request: web.Request) -> str:
        found: Principal | None = request.get(PRINCIPAL)
        if found is None:  # the login page, which is not guarded
            found = self._access.identify(request.headers.get("Authorization"), request.cookies.get(COOKIE))
        if found is None:
            return "not logged in"
        return "operator" if found.tenant is None else f"tenant {found.tenant}"

    async def _tenant(self, request: web.Request) -> str:
        """The tenant the request asks for (its own for a tenant's token); 403 for another."""
        principal = principal_of(request)
        asked = request.query.get("tenant", "")
        if asked:
            try:
                check_tenant(asked)
            except ValueError as exc:
                raise web.HTTPBadRequest(text=str(exc)) from exc
        if principal.tenant is not None:
            if asked and asked != principal.tenant:
                raise web.HTTPForbidden(text="this token sees only its own tenant")
            return principal.tenant
        if asked:
            return asked
        tenants = await self._reads.tenants()
        return tenants[0] if tenants else "default"

    async def _visible_tenants(self, request: web.Request) -> list[str]:
        principal = principal_of(request)
        return [t for t in await self._reads.tenants() if principal.sees(t)] or (
            [principal.tenant] if principal.tenant else []
        )

    def _page(
        self,
        request: web.Request,
        title: str,
        body: str,
        view: str,
        crumbs: list[str] | None = None,
        *,
        status: int = 200,
    ) -> web.Response:
        return html_response(page(title, body, view=view, who=self._who(request), crumbs=crumbs or []), status)

    def _crumbs(self, tenant: str, *more: str) -> list[str]:
        return [
            '<a href="/explore">tenants</a>',
            link(tenant, "/explore/tenant", tenant=tenant),
            *more,
        ]

    async def stylesheet(self, _: web.Request) -> web.Response:
        """The explorer's only static file: its stylesheet (no script is served at all)."""
        return secured(web.Response(text=CSS, content_type="text/css"))

    async def tenants(self, request: web.Request) -> web.Response:
        """Tenants and their chunk counts."""
        rows = await self._reads.tenant_rows(await self._visible_tenants(request))
        return self._page(request, "Tenants", tenants_body(rows), "tenants")

    async def tenant(self, request: web.Request) -> web.Response:
        """A tenant's agents and documents (first pages)."""
        tenant = await self._tenant(request)
        n = self._cfg.page_size
        agents, more_agents = await self._reads.groups("agents", tenant, offset=0, limit=n)
        docs, more_docs = await self._reads.groups("documents", tenant, offset=0, limit=n)
        if not agents and not docs and principal_of(request).tenant is None:
            # An operator's tenant with nothing stored: a misspelt name (a tenant's own, empty one is its page).
            return self._error(request, f"no tenant {tenant!r} has anything stored in this memory", 404)
        more = {k: v for k, v in (("agents", more_agents), ("documents", more_docs)) if v is not None}
        return self._page(
            request, f"Tenant {tenant}", tenant_body(tenant, agents, docs, more), "tenants", self._crumbs(tenant)
        )

    async def agents(self, request: web.Request) -> web.Response:
        """A page of a tenant's agents."""
        tenant = await self._tenant(request)
        found, nxt = await self._reads.groups("agents", tenant, offset=offset_of(request), limit=self._cfg.page_size)
        body = groups_body(
            "agents", ("agent", "turn chunks", "latest"), found, "/explore/sessions", {"tenant": tenant}, nxt
        )
        return self._page(request, f"Agents of {tenant}", body, "tenants", self._crumbs(tenant))

    async def sessions(self, request: web.Request) -> web.Response:
        """A page of an agent's sessions."""
        tenant = await self._tenant(request)
        agent = request.query.get("agent", "")
        found, nxt = await self._reads.groups(
            "sessions", tenant, offset=offset_of(request), limit=self._cfg.page_size, agent=agent
        )
        params = {"tenant": tenant, "agent": agent}
        body = groups_body("sessions", ("session", "turn chunks", "latest"), found, "/explore/turns", params, nxt)
        status = 404 if not found and offset_of(request) == 0 else 200  # an agent with no turns: none by that name
        return self._page(
            request, f"Sessions of agent {agent}", body, "tenants", self._crumbs(tenant, esc(agent)), status=status
        )

    async def turns(self, request: web.Request) -> web.Response:
        """A session's turns in order."""
        tenant = await self._tenant(request)
        agent, session = request.query.get("agent", ""), request.query.get("session", "")
        found = await self._reads.turns(tenant, agent, session, page_key(request), self._cfg.page_size)
        params = {"tenant": tenant, "agent": agent, "session": session}
        sessions = link(agent, "/explore/sessions", tenant=tenant, agent=agent)
        crumbs = self._crumbs(tenant, sessions, esc(session))
        status = 404 if not found.chunks and page_key(request) is None else 200  # no turns: no such session
        return self._page(request, f"Session {session}", turns_body(found, params), "tenants", crumbs, status=status)

    async def documents(self, request: web.Request) -> web.Response:
        """A page of a tenant's documents."""
        tenant = await self._tenant(request)
        found, nxt = await self._reads.groups("documents", tenant, offset=offset_of(request), limit=self._cfg.page_size)
        heads = ("document", "version", "chunks", "latest")
        body = groups_body("documents", heads, found, "/explore/document", {"tenant": tenant}, nxt)
        return self._page(request, f"Documents of {tenant}", body, "tenants", self._crumbs(tenant))

    async def document(self, request: web.Request) -> web.Response:
        """A document's (or a turn's) version and chunks."""
        tenant = await self._tenant(request)
        doc_id = request.query.get("doc", "")
        offset, limit = offset_of(request), self._cfg.page_size
        chunks, total, earlier = await self._reads.document(tenant, doc_id, offset, limit)
        body = document_body(tenant, doc_id, chunks, earlier, offset=offset, total=total)
        found = 200 if chunks or earlier or total else 404
        return self._page(request, doc_id, body, "tenants", self._crumbs(tenant, esc(doc_id)), status=found)

    async def chunks(self, request: web.Request) -> web.Response:
        """A tenant's chunks, newest first, keyset-paged."""
        tenant = await self._tenant(request)
        start = page_key(request)
        found = await self._reads.timeline(tenant, start, self._cfg.page_size)
        body = timeline_body(found, {"tenant": tenant}, deep=start is not None)
        return self._page(request, f"Chunks of {tenant}, newest first", body, "tenants", self._crumbs(tenant, "chunks"))

    async def ask(self, request: web.Request) -> web.Response:
        """The query form and, with a question, its answer and why."""
        q = request.query
        tenant = await self._tenant(request)
        form = AskForm(
            q=q.get("q", ""),
            tenant=tenant,
            k=q.get("k", "10"),
            scope=q.get("scope", "chunks"),
            dense=q.get("dense", ""),
            sparse=q.get("sparse", ""),
            identifier=q.get("identifier", ""),
            recency=q.get("recency", ""),
            speaker=q.get("speaker", ""),
            rrf_k=q.get("rrf_k", ""),
            filters=q.get("filters", ""),
            since=q.get("since", ""),
            until=q.get("until", ""),
            tenants=tuple(await self._visible_tenants(request)),
        )
        body, status = form_html(form), 200
        asked = {f.name for f in dataclasses.fields(AskForm)} - {"tenants"}
        if unknown := sorted(set(q) - asked):
            # As the contract refuses a field it does not know: read past, it would change nothing, untold.
            near = near_spelling(unknown[0], asked)
            said = f"unknown field {unknown[0]!r}" + (f": did you mean {near!r}?" if near else "")
            return self._page(request, "Ask and see why", body + error_html(said), "ask", status=400)
        if form.q.strip():
            try:
                answer = await self._reads.ask(form, tenant)
            except InvalidRequest as exc:  # the form again, with what to mend
                body, status = body + error_html(str(exc)), 400
            else:
                body += results_html(answer.outcome, answer.weights, answer.rrf_k, answer.texts, tenant, answer.stale)
        return self._page(request, "Ask and see why", body, "ask", status=status)

    async def graph(self, request: web.Request) -> web.Response:
        """The tenant's communities and stale queue."""
        tenant = await self._tenant(request)
        view = await self._reads.graph(tenant)
        if view is None:
            body = '<p class="muted">the graph layer is off (AGENTMEM_GRAPH__ENABLED=false)</p>'
        else:
            body = graph_body(tenant, view.communities, view.stale, view.depth, view.history, self._reads.now())
        picker = " ".join(link(t, "/explore/graph", tenant=t) for t in await self._visible_tenants(request))
        return self._page(request, f"Graph of {tenant}", f"<p>tenants: {picker}</p>{body}", "graph")

    async def community(self, request: web.Request) -> web.Response:
        """One community: stale or not and why, its summary, its members."""
        tenant = await self._tenant(request)
        cid = request.query.get("id", "")
        view = await self._reads.community(tenant, cid)
        if view is None:
            body = '<p class="muted">the graph layer is off</p>'
        else:
            body = community_body(
                tenant, view.community, cid, view.summary, view.members, view.item, view.stale, self._reads.now()
            )
        crumbs = [link(f"graph of {tenant}", "/explore/graph", tenant=tenant), esc(cid)]
        missing = view is not None and view.community is None and view.summary is None
        return self._page(request, f"Community {cid}", body, "graph", crumbs, status=404 if missing else 200)

    async def dlq(self, request: web.Request) -> web.Response:
        """The DLQ's recent records this principal may see."""
        principal = principal_of(request)
        topic = self._reads.settings.topics.dlq
        try:
            # A record whose tenant cannot be told (no DLQ record, an unknown topic) is the operator's only.
            letters, hidden = await self._reads.dead_letters()
            records = [
                d for d in letters if principal.tenant is None or (d.tenant is not None and principal.sees(d.tenant))
            ]
            try:
                marks = await self._reads.replay_marks() if records else {}
            except MemdError:  # the letters are worth showing without whether they were sent again
                marks = {}
            # The operator's count agrees with the DLQ's (the status page's); a tenant learns of no erasure.
            body = dlq_body(
                records,
                topic=topic,
                limit=self._cfg.dlq_records,
                hidden=hidden if principal.tenant is None else 0,
                marks=marks,
            )
        except MemdError as exc:
            body = dlq_body([], topic=topic, limit=self._cfg.dlq_records, error=str(exc))
        return self._page(request, "Dead letters", body, "dead letters")

    async def login_form(self, request: web.Request) -> web.Response:
        """A form that stores a token in a cookie, for browsers (which cannot send a header)."""
        note = "" if self._access.required else '<p class="muted">no token is configured: nothing to log in to</p>'
        body = (
            f'{note}<form method="post" action="/explore/login"><label>token '
            '<input type="password" name="token" autocomplete="off"></label> '
            '<button type="submit">log in</button></form>'
        )
        if COOKIE in request.cookies:
            body += '<form method="post" action="/explore/logout"><button type="submit">log out</button></form>'
        return self._page(request, "Log in", body, "")

    async def logout(self, request: web.Request) -> web.Response:
        """Forget the token's cookie (to log in with another token) and go to the login form."""
        if not same_origin(request):
            return self._error(request, "a form of another site may not log this browser out", 403)
        resp = web.HTTPSeeOther("/explore/login")
        resp.del_cookie(COOKIE, path="/")
        raise resp

    async def login(self, request: web.Request) -> web.Response:
        """Check the posted token; if it names a principal, set the cookie and go to the explorer."""
        if not same_origin(request):
            # A page of another site could post its own token and log the browser in as that
            # tenant, whose explorer the user would then fill with what they look for.
            return self._error(request, "a form of another site may not log this browser in", 403)
        form = await request.post()
        token = str(form.get("token", "")).strip()  # as identify reads it: the cookie must name the same
        if self._access.identify(f"Bearer {token}") is None:
            async with self._refusals:  # one refusal a second, however many guesses come at once
                await asyncio.sleep(LOGIN_FAILED_PAUSE_S)
            return self._error(request, "that token is not one this server accepts", 401)
        resp = web.HTTPSeeOther("/explore")
        resp.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
        raise resp
