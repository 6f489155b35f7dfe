"""The graph views (pure): communities as a picture drawn as inline SVG on the server (no script),
a community's summary and members, and the stale queue over time as a chart."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from consumers.times import age
from daemon.explore.html import counted, esc, link, table, url, when
from graph import Community, StaleItem
from graph.stale_queue import RECOMPUTE_CAUSE

#: Most communities the picture draws (the largest first); the table below lists them all.
MAX_DRAWN = 400


def _radius(members: int) -> float:
    return 5.0 + 3.2 * math.sqrt(max(members, 1))


def communities_svg(
    communities: Sequence[Community], stale: Mapping[str, StaleItem | None], tenant: str, width: int = 960
) -> str:
    """Every community as a circle sized by its members, the stale ones red, each a link to its
    page; one band per level, largest first. A stale community's title names its age and the
    documents that made it stale (a tooltip, read without any script)."""
    if not communities:
        return '<p class="muted" id="graph-empty">no community yet: the graph has not been computed</p>'
    drawn = sorted(communities, key=lambda c: (c.level, -len(c.members), c.id))[:MAX_DRAWN]
    pad, y, x, row_h = 8.0, 8.0, 8.0, 0.0
    level: int | None = None
    parts: list[str] = []
    for c in drawn:
        r = _radius(len(c.members))
        if c.level != level:
            if level is not None:
                y += row_h + 26
            level, x, row_h = c.level, pad, 0.0
            parts.append(f'<text x="{pad}" y="{y + 10:.0f}" font-size="12" fill="#555">level {c.level}</text>')
            y += 16
        if x + 2 * r > width - pad:
            x, y, row_h = pad, y + row_h + 6, 0.0
        cx, cy = x + r, y + r
        item = stale.get(c.id)
        fill, stroke = ("#e74c3c", "#922b21") if c.id in stale else ("#5dade2", "#21618c")
        tip = f"{c.id}: {len(c.members)} members"
        if c.id in stale:
            tip += " · stale"
            if item is not None:
                tip += f" since {when(item.first_marked_at)} UTC, {counted(item.change_count, 'change')}; caused by "
                tip += item.cause()
        label = (
            f'<text x="{cx:.1f}" y="{cy + 4:.1f}" font-size="11" text-anchor="middle" fill="#fff">'
            f"{len(c.members)}</text>"
            if r >= 12
            else ""
        )
        href = url("/explore/community", tenant=tenant, id=c.id)
        css = "community stale" if c.id in stale else "community"
        parts.append(
            f'<a href="{href}" class="{css}"><title>{esc(tip)}</title>'
            f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{r:.1f}" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>'
            f"{label}</a>"
        )
        x += 2 * r + 6
        row_h = max(row_h, 2 * r)
    height = y + row_h + pad
    more = (
        f'<p class="muted">the {MAX_DRAWN} largest of {len(communities)} are drawn</p>'
        if len(communities) > MAX_DRAWN
        else ""
    )
    return (
        f'<svg id="communities" width="{width}" height="{height:.0f}" viewBox="0 0 {width} {height:.0f}" '
        f'role="img" aria-label="communities, sized by members, stale ones red">{"".join(parts)}</svg>{more}'
    )


def stale_chart(points: Sequence[tuple[float, int]], now: float, width: int = 640, height: int = 170) -> str:
    """The stale queue's depth over time: a filled line with its axes, the latest and the peak
    depth written on it, so it reads without hovering."""
    if len(points) < 2:
        return '<p class="muted" id="stale-chart">collecting samples (one every status_sample_s)…</p>'
    left, bottom, top_pad = 40, 22, 14
    t0, t1 = points[0][0], points[-1][0]
    peak = max(1, max(v for _, v in points))
    span = max(t1 - t0, 1e-9)
    plot_w, plot_h = width - left - 8, height - bottom - top_pad

    def xy(t: float, v: int) -> tuple[float, float]:
        return left + (t - t0) / span * plot_w, top_pad + plot_h - v / peak * plot_h

    coords = [xy(t, v) for t, v in points]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
    area = f"{left},{top_pad + plot_h} {line} {coords[-1][0]:.1f},{top_pad + plot_h}"
    last = points[-1][1]
    return (
        f'<svg id="stale-chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="stale queue depth over time">'
        f'<polygon points="{area}" fill="#fadbd8"/>'
        f'<polyline points="{line}" fill="none" stroke="#c0392b" stroke-width="2"/>'
        f'<line x1="{left}" y1="{top_pad + plot_h}" x2="{width - 8}" y2="{top_pad + plot_h}" stroke="#999"/>'
        f'<line x1="{left}" y1="{top_pad}" x2="{left}" y2="{top_pad + plot_h}" stroke="#999"/>'
        f'<text x="{left - 4}" y="{top_pad + 4}" font-size="11" text-anchor="end">{peak}</text>'
        f'<text x="{left - 4}" y="{top_pad + plot_h}" font-size="11" text-anchor="end">0</text>'
        f'<text x="{left}" y="{height - 5}" font-size="11">{esc(age(now - t0))} ago</text>'
        f'<text x="{width - 8}" y="{height - 5}" font-size="11" text-anchor="end">now</text>'
        f'<text x="{coords[-1][0] - 4:.1f}" y="{max(coords[-1][1] - 6, 12):.1f}" font-size="12" '
        f'text-anchor="end" fill="#922b21" id="stale-now">{last} now</text></svg>'
    )


def graph_body(
    tenant: str,
    communities: Sequence[Community],
    stale: Mapping[str, StaleItem | None],
    depth: int,
    history: Sequence[tuple[float, int]],
    now: float,
) -> str:
    """The tenant's communities (picture and table), its stale queue now and over time."""
    oldest = max((now - i.first_marked_at for i in stale.values() if i is not None), default=0.0)
    cards = (
        f'<p><span class="card">communities <strong id="community-count">{len(communities)}</strong></span>'
        f'<span class="card">stale <strong id="stale-depth">{depth}</strong></span>'
        f'<span class="card">oldest stale <strong>{esc(age(oldest))}</strong></span></p>'
    )
    rows = []
    for item in sorted((i for i in stale.values() if i is not None), key=lambda i: i.first_marked_at):
        docs = ", ".join(link(d, "/explore/document", tenant=tenant, doc=d) for d in item.doc_ids[:8])
        rows.append(
            (
                link(item.community_id, "/explore/community", tenant=tenant, id=item.community_id),
                str(item.level),
                esc(age(now - item.first_marked_at)),
                str(item.change_count),
                docs or f'<span class="muted">{RECOMPUTE_CAUSE}</span>',
            )
        )
    return (
        cards
        + "<h2>Communities</h2>"
        + '<p class="muted">sized by members; red: its summary is stale. Click one for its summary and members.</p>'
        + communities_svg(communities, stale, tenant)
        + "<h2>Stale-summary queue over time</h2>"
        + stale_chart(history, now)
        + "<h2>Stale communities, oldest first</h2>"
        + table(
            ("community", "level", "stale for", "changes", "caused by"),
            rows,
            table_id="stale",
            empty="none: every summary is fresh",
        )
    )


def community_body(
    tenant: str,
    community: Community | None,
    cid: str,
    summary: Mapping[str, Any] | None,
    members: Mapping[str, tuple[str, str]],
    item: StaleItem | None,
    is_stale: bool,
    now: float,
) -> str:
    """One community: whether and why it is stale, its summary, its members."""
    if community is None:
        return f'<p class="muted">community {esc(cid)} does not exist (any more) in tenant {esc(tenant)}.</p>'
    live = [m for m in sorted(community.members) if m in members]
    state = '<p id="community-state">fresh: its summary covers its members as they are</p>'
    if not live:
        state = (
            '<p id="community-state" class="muted">gone: every member was deleted or forgotten; '
            "the next recompute removes it</p>"
        )
    elif summary is None and not is_stale:
        state = '<p id="community-state">not summarized yet</p>'
    elif is_stale:
        docs = ", ".join(link(d, "/explore/document", tenant=tenant, doc=d) for d in (item.doc_ids if item else []))
        since = f" for {esc(age(now - item.first_marked_at))}, {counted(item.change_count, 'change')}" if item else ""
        failing = (
            f"; its summary failed {item.attempts} time(s): {esc(item.last_error)}" if item and item.attempts else ""
        )
        state = f'<p id="community-state" class="stale">stale{since}; caused by {docs or RECOMPUTE_CAUSE}{failing}</p>'
    text = (summary or {}).get("text")
    summary_html = (
        f'<div class="text" id="summary">{esc(text)}</div><p class="muted">by {esc((summary or {}).get("model", ""))}, '
        f"written {esc(when(_float((summary or {}).get('written_at'))))} UTC</p>"
        if text
        else '<p class="muted" id="summary">no summary written yet</p>'
    )
    # Only entities some document still names: one whose every mention was deleted or forgotten
    # stays in the community until the next recompute, and its name must not show meanwhile.
    member_rows = ((esc(members[m][0]), esc(members[m][1]), esc(m)) for m in live[:500])
    parent = (
        link(community.parent, "/explore/community", tenant=tenant, id=community.parent)
        if community.parent
        else "&ndash;"
    )
    return (
        f"<p>level {community.level} · {len(live)} members · parent {parent}</p>"
        + state
        + "<h2>Summary</h2>"
        + summary_html
        + "<h2>Members</h2>"
        + table(("entity", "type", "key"), member_rows, table_id="members")
    )


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None
