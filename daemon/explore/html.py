"""The explorer's page frame and small HTML pieces (pure): every value goes through ``esc``.

Pages carry no script at all, and the server forbids any (``CSP``): a turn's text is untrusted,
and escaping is what keeps it text; the policy is the second wall.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from urllib.parse import urlencode

from daemon.control_pictures import HTML_PICTURES

#: Sent with every explorer response: no script, no plugin, no frame, forms only to us.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

CSS = """
body{font-family:system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#24323f;color:#fff;padding:10px 20px;display:flex;gap:18px;align-items:baseline}
header a{color:#cfe3f5;text-decoration:none} header a.on{color:#fff;font-weight:600}
header .who{margin-left:auto;color:#9fb3c8;font-size:12px}
main{padding:16px 20px} h1{font-size:19px;margin:4px 0 10px} h2{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse;margin:6px 0;background:#fff} .crumbs{font-size:13px;color:#666}
td,th{border-bottom:1px solid #e6e6e6;padding:4px 9px;text-align:left;font-size:13px;vertical-align:top}
th{background:#f0f2f4} .muted{color:#888} .bad{color:#c0392b} .num{text-align:right}
.text{white-space:pre-wrap;max-width:760px;font-family:ui-monospace,monospace;font-size:12px}
.pager{margin:10px 0} .pager a{margin-right:12px}
form.ask{display:grid;grid-template-columns:repeat(4,minmax(150px,1fr));gap:6px 14px;max-width:980px}
form.ask label{font-size:12px;color:#555;display:flex;flex-direction:column}
form.ask .wide{grid-column:1/-1} input,select,textarea{font:inherit;font-size:13px;padding:3px}
.legs{display:flex;gap:14px;flex-wrap:wrap;align-items:flex-start} .legs table{min-width:220px}
.won{background:#e8f5e9} .stale{color:#c0392b;font-weight:600} .card{display:inline-block;margin-right:18px}
pre.bytes{background:#fff;border:1px solid #ddd;padding:6px;max-width:900px;white-space:pre-wrap;font-size:12px}
"""

VIEWS = (
    ("tenants", "/explore"),
    ("ask", "/explore/ask"),
    ("graph", "/explore/graph"),
    ("dead letters", "/explore/dlq"),
)


def esc(value: object) -> str:
    """Any value as HTML text (quotes too, so it is safe inside an attribute), its control
    characters but tab and line ends shown as their pictures (NUL as ␀)."""
    return html.escape("" if value is None else str(value), quote=True).translate(HTML_PICTURES)


def pairs(metadata: Mapping[str, object]) -> str:
    """Metadata as the pages and the CLI show it: ``key=value``, by key, comma-separated (text,
    not yet escaped)."""
    return ", ".join(f"{k}={v}" for k, v in sorted(metadata.items()))


def url(path: str, **params: object) -> str:
    """``path`` with the query parameters that are not None or ``""``, escaped for an attribute."""
    kept = {k: str(v) for k, v in params.items() if v is not None and v != ""}
    return esc(path + ("?" + urlencode(kept) if kept else ""))


def link(text: object, path: str, **params: object) -> str:
    """An ``<a>`` to ``path`` with ``params``; the text escaped."""
    return f'<a href="{url(path, **params)}">{esc(text)}</a>'


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless one: "1 change", "3 changes"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def when(epoch: float | None) -> str:
    """An epoch time as UTC ``YYYY-MM-DD HH:MM:SS``; ``""`` for none or one no date can hold."""
    if epoch is None or not math.isfinite(epoch):
        return ""
    try:
        return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return ""


def table(heads: Sequence[str], rows: Iterable[Sequence[str]], *, table_id: str = "", empty: str = "nothing") -> str:
    """A table of already-escaped cells (``heads`` are our own words, escaped here)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in heads)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        body = f'<tr><td colspan="{len(heads)}" class="muted">{esc(empty)}</td></tr>'
    ident = f' id="{esc(table_id)}"' if table_id else ""
    return f"<table{ident}><tr>{head}</tr>{body}</table>"


def snippet(text: str, limit: int = 400) -> str:
    """The start of a text, escaped, saying how much was left out."""
    if len(text) <= limit:
        return esc(text)
    return esc(text[:limit]) + f'<span class="muted">… ({len(text) - limit} more characters)</span>'


def pager(next_params: Mapping[str, object] | None, path: str, first: Mapping[str, object] | None = None) -> str:
    """Links to the first page (when not on it) and the next one (when there is one)."""
    parts = []
    if first is not None:
        parts.append(f'<a href="{url(path, **first)}">first page</a>')
    if next_params is not None:
        parts.append(f'<a id="next-page" href="{url(path, **next_params)}">next page</a>')
    return f'<div class="pager">{"".join(parts)}</div>' if parts else ""


def page(title: str, body: str, *, view: str, who: str, crumbs: Sequence[str] = ()) -> str:
    """A whole explorer page: header with the views, breadcrumbs, ``body`` (already escaped)."""
    nav = "".join(f'<a href="{esc(path)}"{" class=on" if name == view else ""}>{esc(name)}</a>' for name, path in VIEWS)
    trail = f'<div class="crumbs">{" &rsaquo; ".join(crumbs)}</div>' if crumbs else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)} · agentmemd explorer</title>"
        '<link rel="stylesheet" href="/explore/static/explore.css"></head><body>'
        f'<header><strong>agentmemd explorer</strong>{nav}<span class="who">{esc(who)} · '
        f"rendered {esc(when(time.time()))} UTC</span></header>"
        f"<main>{trail}<h1>{esc(title)}</h1>{body}</main></body></html>"
    )
