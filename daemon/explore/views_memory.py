"""Browse views (pure): tenants → agents → sessions → turns; documents → versions → chunks.

Each function takes what was read and returns the page's body; values are escaped here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from daemon.explore.html import esc, link, pager, pairs, snippet, table, when
from memory.conversation import parse_turn
from memory.index import ChunkPage, Group, PageKey
from memory.index.history import Version
from memory.records import StoredChunk


@dataclass(frozen=True, slots=True)
class TenantRow:
    """A tenant and how much it holds."""

    tenant: str
    documents: int
    turns: int
    summaries: int
    erased_at: float | None = None  # erased (``agentmemd erase-tenant``) and not started anew


def key_params(key: PageKey | None) -> dict[str, object] | None:
    """A page key as query parameters (``at``, ``skip``); None for no next page."""
    return None if key is None else {"at": repr(key.timestamp), "skip": key.skip}


def tenants_body(rows: Sequence[TenantRow]) -> str:
    """The tenants this principal sees, with chunk counts per kind."""
    body = table(
        ("tenant", "document chunks", "turn chunks", "summary chunks", ""),
        (
            (
                link(r.tenant, "/explore/tenant", tenant=r.tenant),
                f'<span class="num">{r.documents}</span>',
                f'<span class="num">{r.turns}</span>',
                f'<span class="num">{r.summaries}</span>',
                link("timeline", "/explore/chunks", tenant=r.tenant),
            )
            if r.erased_at is None
            else (esc(r.tenant), f"erased {esc(when(r.erased_at))}", "", "", "")
            for r in rows
        ),
        table_id="tenants",
        empty="no tenant holds anything yet",
    )
    return body


def tenant_body(tenant: str, agents: Sequence[Group], documents: Sequence[Group], more: Mapping[str, int]) -> str:
    """A tenant's agents and documents, the first page of each (``more``: what -> next offset)."""
    agent_rows = (
        (link(g.value, "/explore/sessions", tenant=tenant, agent=g.value), str(g.chunks), esc(when(g.last)))
        for g in agents
    )
    doc_rows = (
        (
            link(g.value, "/explore/document", tenant=tenant, doc=g.value),
            esc(g.version),
            str(g.chunks),
            esc(when(g.last)),
        )
        for g in documents
    )

    def more_link(what: str) -> str:
        if what not in more:
            return ""
        return f'<div class="pager">{link("more " + what, "/explore/" + what, tenant=tenant, offset=more[what])}</div>'

    return (
        f"<p>{link('all chunks, newest first', '/explore/chunks', tenant=tenant)}</p>"
        f"<h2>Agents</h2>{table(('agent', 'turn chunks', 'latest'), agent_rows, table_id='agents', empty='no agent')}"
        f"{more_link('agents')}<h2>Documents</h2>"
        f"{table(('document', 'version', 'chunks', 'latest'), doc_rows, table_id='documents', empty='no document')}"
        f"{more_link('documents')}"
    )


def groups_body(
    what: str,
    heads: Sequence[str],
    groups: Sequence[Group],
    to: str,
    params: Mapping[str, str],
    next_offset: int | None,
) -> str:
    """A paged group listing (agents, sessions, documents): each value links to ``to``."""
    key = {"agents": "agent", "sessions": "session", "documents": "doc"}[what]
    rows = []
    for g in groups:
        cells = [link(g.value, to, **params, **{key: g.value}), str(g.chunks), esc(when(g.last))]
        if what == "documents":
            cells.insert(1, str(g.version if g.version is not None else ""))
        rows.append(cells)
    nxt = None if next_offset is None else {**params, "offset": next_offset}
    return table(heads, rows, table_id=what, empty=f"no {what}") + pager(nxt, f"/explore/{what}")


def turn_number(chunk: StoredChunk) -> str:
    """A turn chunk's turn number as its doc id holds it ("" when it holds none)."""
    ref = parse_turn(chunk.doc_id)
    return "" if ref is None else str(ref.turn)


def turns_body(page: ChunkPage, params: Mapping[str, str]) -> str:
    """A session's turns in order (by time), their whole text, escaped."""
    rows = (
        (
            f'<span class="num">{esc(turn_number(c))}</span>',
            esc(c.metadata.get("role", "")),
            esc(when(c.timestamp)),
            f'<div class="text turn-text">{esc(c.text)}</div>',
            link(c.chunk_id, "/explore/document", tenant=c.tags.get("tenant", ""), doc=c.doc_id),
        )
        for c in page.chunks
    )
    nxt = key_params(page.next)
    return table(("turn", "role", "time", "text", "chunk"), rows, table_id="turns", empty="no turn") + pager(
        None if nxt is None else {**params, **nxt}, "/explore/turns"
    )


#: Characters of an earlier version a document's page shows (the rest: ``agentmemd get --history``).
VERSION_CHARS = 4_000


def document_body(
    tenant: str,
    doc_id: str,
    chunks: Sequence[StoredChunk],
    earlier: Sequence[Version] = (),
    *,
    offset: int = 0,
    total: int | None = None,
) -> str:
    """One document (or turn): its stored version and a page of its chunks (``chunks``, from
    ``offset`` of its ``total``), whole, with a link to the next ones; on the first page the
    earlier versions its history keeps (``memory.index.history``), newest first, each shown up to
    :data:`VERSION_CHARS`: a page costs what its rows do, whatever the document's size
    (decision 0074)."""
    count = len(chunks) if total is None else total
    params = {"tenant": tenant, "doc": doc_id}
    if not chunks and count:
        said = f'<p class="muted">no chunk from {offset}: {esc(doc_id)} has {count}</p>'
        return said + pager(None, "/explore/document", first=params)
    if not chunks:
        return f'<p class="muted">{esc(doc_id)} holds no chunk in tenant {esc(tenant)} (deleted, or never written).</p>'
    first = chunks[0]
    facts = table(
        ("doc", "kind", "source", "stored version", "time", "chunks"),
        [
            (
                esc(doc_id),
                esc(first.kind),
                esc(first.source),
                # Turns are unversioned (a redelivery overwrites): their stored 0 is no version.
                "unversioned" if first.kind == "transcript" else esc("" if first.version is None else first.version),
                esc(when(first.timestamp)),
                str(count),
            )
        ],
        table_id="doc-facts",
    )
    rows = (
        (esc(c.chunk_id), esc(c.version), f'<div class="text chunk-text">{esc(c.text)}</div>', esc(pairs(c.metadata)))
        for c in chunks
    )
    nxt = {**params, "offset": offset + len(chunks)} if offset + len(chunks) < count else None
    heads = ("chunk", "version", "text", "metadata")
    body = facts + "<h2>Chunks</h2>" + table(heads, rows, table_id="chunks")
    body += pager(nxt, "/explore/document", first=params if offset else None)
    if first.kind != "document" or offset:
        return body
    past = (
        (
            esc(v.version),
            esc(when(v.timestamp)),
            esc(when(v.until)),
            f'<div class="text chunk-text">{snippet(v.content, VERSION_CHARS)}</div>',
            esc(pairs(v.metadata)),
        )
        for v in earlier
    )
    note = (
        '<p class="muted">What the versions a newer one replaced said, as many as '
        "<code>AGENTMEM_INDEX__HISTORY_VERSIONS</code> keeps; a delete drops them.</p>"
    )
    columns = ("version", "from", "until", "content", "metadata")
    return body + "<h2>Earlier versions</h2>" + note + table(columns, past, table_id="history", empty="none kept")


def timeline_body(page: ChunkPage, params: Mapping[str, str], *, deep: bool) -> str:
    """A tenant's chunks, newest first, a page at a time (keyset-paged: deep pages cost what the first does)."""
    rows = (
        (
            esc(when(c.timestamp)),
            esc(c.kind),
            link(c.doc_id, "/explore/document", tenant=c.tags.get("tenant", ""), doc=c.doc_id),
            esc(c.chunk_id),
            esc("" if c.version is None else c.version),
            f'<div class="text">{snippet(c.text, 240)}</div>',
        )
        for c in page.chunks
    )
    nxt = key_params(page.next)
    return table(
        ("time", "kind", "doc", "chunk", "version", "text"), rows, table_id="timeline", empty="no chunk"
    ) + pager(None if nxt is None else {**params, **nxt}, "/explore/chunks", params if deep else None)
