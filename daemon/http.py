"""The daemon's small HTTP server: /healthz, /readyz, /metrics, the status page at / and the
explorer under /explore (``daemon.explore``).

The pages are rendered on the server (no front-end build step). With a token configured
(``daemon.explore.access``) every endpoint but /healthz and /readyz requires it.
"""

from __future__ import annotations

import asyncio
import html
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from daemon.explore import PRINCIPAL, Access, Explorer, explorer_refusal
from daemon.explore.access import BEARER_CHALLENGE, COOKIE, LOGIN_PATHS, OPEN_PATHS, UNAUTHORIZED, rebound
from daemon.status import StatusState, oldest_age_s, past_end_text, percentile
from memory.errors import MemdError
from memory.index import ChunkIndex
from memory.metrics import REGISTRY

ReadyCheck = Callable[[], Awaitable[dict[str, str | None]]]
#: How long /readyz waits for Redis's answers: under a 1 s probe deadline. A healthy Redis
#: answers in well under a millisecond; one blocked this long cannot answer queries either.
READY_REDIS_BUDGET_S = 0.8


def readiness_checks(
    *, index: ChunkIndex, state: StatusState, stale_after_s: float, redis_budget_s: float = READY_REDIS_BUDGET_S
) -> ReadyCheck:
    """Checks that say, in words, what is not ready: Redis, the index, the Kafka consumers.

    The Redis checks get ``redis_budget_s`` in all, so the probe answers in time.
    """

    async def redis_checks(problems: dict[str, str | None]) -> None:
        try:
            await index.ping()
        except MemdError as exc:
            problems["redis"] = str(exc)
        if problems["redis"] is None:
            try:
                await index.count()
            except MemdError as exc:
                problems["index"] = f"index {index.cfg.name!r} missing or unreadable: {exc}"
            else:
                try:
                    problems["index"] = await index.mismatch()
                except MemdError as exc:
                    problems["index"] = f"index generations unreadable: {exc}"
        else:
            problems["index"] = "not checked: redis is down"

    async def check() -> dict[str, str | None]:
        problems: dict[str, str | None] = {"redis": None, "index": None, "kafka": None}
        try:
            await asyncio.wait_for(redis_checks(problems), redis_budget_s)
        except TimeoutError:
            # A hung Redis (paused, swapping) would hold the probe for the client's whole
            # socket timeout (10 s), past any probe's deadline (Kubernetes' default is 1 s).
            problems["redis"] = f"no answer from Redis within {redis_budget_s:g} s (hung or blocked)"
            problems["index"] = problems["index"] or "not checked: redis does not answer"
        unassigned = sorted({*state.stopped_consumers(), *(c for c in state.consumers if c not in state.assigned)})
        if not state.ready:
            problems["kafka"] = "consumers not assigned yet (starting or stopping)"
        elif state.lag_error is not None:
            problems["kafka"] = f"broker unreachable: {state.lag_error}"
        elif state.past_end:
            beyond = past_end_text(state.past_end)
            problems["kafka"] = f"committed past the end of the log (the broker lost it?), rewinding: {beyond}"
        elif unassigned:
            problems["kafka"] = f"consumers stopped or rejoining their groups: {', '.join(unassigned)}"
        elif state.lag_measured_at and time.time() - state.lag_measured_at > stale_after_s:
            problems["kafka"] = f"no successful broker check for {time.time() - state.lag_measured_at:.0f}s"
        return problems

    return check


def _svg_chart(points: list[tuple[float, int]], width: int = 560, height: int = 120) -> str:
    if len(points) < 2:
        return '<p class="muted">collecting samples…</p>'
    t0, t1 = points[0][0], points[-1][0]
    top = max(1, max(v for _, v in points))
    span = max(t1 - t0, 1e-9)
    coords = " ".join(f"{(t - t0) / span * width:.1f},{height - v / top * (height - 10):.1f}" for t, v in points)
    return (
        f'<svg id="depth-chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="stale queue depth over time"><polyline fill="none" stroke="#c0392b" stroke-width="2" '
        f'points="{coords}"/><text x="4" y="12" font-size="11">max {top}</text></svg>'
    )


def render_status(state: StatusState, *, title: str, not_ready: Mapping[str, str] | None = None) -> str:
    """The operator's page: readiness (``not_ready``: the failing /readyz checks), stale-summary
    queue, consumer lag, DLQ, query latency."""
    now = time.time()
    depth = sum(int(s["depth"]) for s in state.stale.values())
    oldest = max((float(s["oldest_age_s"]) for s in state.stale.values() if s["depth"]), default=0.0)
    q = list(state.query_ms)
    rows = []
    for tenant, s in sorted(state.stale.items()):
        for item in s["items"]:
            rows.append(
                f"<tr><td>{html.escape(tenant)}</td><td>{html.escape(item.community_id)}</td><td>{item.level}</td>"
                f"<td>{oldest_age_s([item.first_marked_at], now):.1f}</td><td>{item.change_count}</td>"
                f"<td>{html.escape(item.cause())}</td><td>{html.escape(item.state(now))}</td></tr>"
            )
    lanes = state.lanes()
    lag_rows = [
        f"<tr><td>{html.escape(group)}</td><td>{html.escape(tp)}</td><td>{value}</td>"
        f'<td class="muted">{html.escape(lanes.get(tp, ""))}</td></tr>'
        for group, parts in sorted(state.lag.items())
        for tp, value in sorted(parts.items())
    ]
    total_lag = sum(v for parts in state.lag.values() for v in parts.values())
    lag_note = f'<p class="bad">{html.escape(state.lag_error)}</p>' if state.lag_error else ""
    dlq = state.dlq_records if state.dlq_records is not None else "?"
    chunks = state.chunks if state.chunks is not None else "?"
    p50, p95 = percentile(q, 0.5), percentile(q, 0.95)
    heads = "".join(
        f"<th>{h}</th>" for h in ("tenant", "community", "level", "age s", "changes", "caused by", "summary")
    )
    if not_ready is None:
        not_ready = {} if state.ready else {"kafka": "consumers not assigned yet"}
    readiness = (
        '<span id="readiness">ready</span>'
        if not not_ready
        else '<span id="readiness" class="bad">not ready: '
        + html.escape("; ".join(f"{k}: {v}" for k, v in sorted(not_ready.items())))
        + "</span>"
    )
    empty = '<tr><td colspan="7" class="muted">empty: every summary is fresh</td></tr>'
    # The queue is sampled, so a write seconds ago may not show yet (the explorer reads it live).
    sampled = (
        f"as of {now - state.depth_history[-1][0]:.0f} s ago (sampled every few seconds; the explorer reads it live)"
        if state.depth_history
        else "not sampled yet"
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>{html.escape(title)}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:24px;color:#222}} h1{{font-size:20px}}
.cards{{display:flex;gap:16px;flex-wrap:wrap}} .card{{border:1px solid #ddd;border-radius:6px;padding:10px 14px}}
.num{{font-size:26px;font-weight:600}} table{{border-collapse:collapse;margin:8px 0}}
td,th{{border-bottom:1px solid #eee;padding:4px 10px;text-align:left;font-size:13px}} .muted{{color:#888}}
.bad{{color:#c0392b}}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="muted">up {now - state.started_at:.0f}s · {readiness} · refreshed every 5s</p>
<div class="cards">
<div class="card">stale summaries<div class="num" id="stale-depth">{depth}</div></div>
<div class="card">oldest stale (s)<div class="num" id="stale-oldest">{oldest:.1f}</div></div>
<div class="card">consumer lag<div class="num" id="consumer-lag">{total_lag}</div></div>
<div class="card">DLQ records<div class="num" id="dlq-count">{dlq}</div></div>
<div class="card">index entries<div class="num" id="chunks">{chunks}</div>
<span class="muted">chunks and community summaries</span></div>
<div class="card">query p50 / p95 ms<div class="num" id="query-latency">{p50:.1f} / {p95:.1f}</div>
<span class="muted" id="query-count">{len(q)} recent, {state.query_errors} errors, \
{state.query_refused} refused (bad or expired requests)</span></div>
</div>
<h2>Stale-summary queue</h2>
<p class="muted" id="stale-sampled">{sampled}</p>
{_svg_chart(list(state.depth_history))}
<table id="stale-table"><tr>{heads}</tr>
{"".join(rows) or empty}</table>
<h2>Consumer lag</h2>{lag_note}
<table id="lag-table"><tr><th>group</th><th>partition</th><th>lag</th><th>in a lane</th></tr>{"".join(lag_rows)}</table>
</body></html>"""


def guard(access: Access, *, host: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The middleware that lets each request through only as far as its token reaches.

    Open: /healthz and /readyz, always; the explorer's login form. With a token configured,
    everything else needs ``Authorization: Bearer <token>`` (or the login cookie): 401
    without, and a tenant's token reaches the explorer only (403 elsewhere). Without a
    token, the explorer answers 403 on a non-loopback ``host``. On a loopback ``host``, a
    request naming any other host is refused (421): DNS rebinding.
    """
    refusal = explorer_refusal(host, access)

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        path = request.path
        if path in OPEN_PATHS:
            return await handler(request)
        if rebound(host, request.url.host):
            return web.Response(status=421, text="this server answers to localhost and loopback addresses only")
        explorer = path == "/explore" or path.startswith("/explore/")
        if explorer and refusal is not None:
            return web.Response(status=403, text=refusal)
        if path in LOGIN_PATHS:
            return await handler(request)
        principal = access.identify(request.headers.get("Authorization"), request.cookies.get(COOKIE))
        if principal is None:
            return web.json_response(UNAUTHORIZED, status=401, headers={"WWW-Authenticate": BEARER_CHALLENGE})
        if principal.tenant is not None and not explorer:
            return web.json_response(
                {"error": "forbidden", "message": "a tenant's token reaches the explorer only"}, status=403
            )
        request[PRINCIPAL] = principal
        return await handler(request)

    return middleware


def build_app(
    *,
    state: StatusState,
    ready_check: ReadyCheck,
    title: str = "agentmemd",
    access: Access | None = None,
    host: str = "127.0.0.1",
    explorer: Explorer | None = None,
) -> web.Application:
    """The aiohttp application: health, metrics, the status page and (given) the explorer,
    behind ``guard`` with ``access`` (none: open, as on a loopback address)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "alive", "uptime_s": round(time.time() - state.started_at, 1)})

    async def readyz(_: web.Request) -> web.Response:
        problems = await ready_check()
        failing = {k: v for k, v in problems.items() if v}
        body: dict[str, Any] = {"ready": not failing, "checks": {k: v or "ok" for k, v in problems.items()}}
        return web.json_response(body, status=200 if not failing else 503)

    async def metrics(_: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(REGISTRY))
        resp.content_type = CONTENT_TYPE_LATEST.split(";")[0]
        return resp

    async def page(_: web.Request) -> web.Response:
        # The same checks as /readyz: the page must never say ready where the probe does not.
        failing = {k: v for k, v in (await ready_check()).items() if v}
        return web.Response(text=render_status(state, title=title, not_ready=failing), content_type="text/html")

    app = web.Application(middlewares=[guard(access or Access(), host=host)])
    app.add_routes(
        [web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/metrics", metrics), web.get("/", page)]
    )
    if explorer is not None:
        app.add_routes(explorer.routes())
    return app


async def start_http(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Serve ``app``; returns the runner (``await runner.cleanup()`` stops it)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
