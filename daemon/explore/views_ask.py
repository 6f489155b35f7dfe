""" "Ask and see why" (pure): the query form, the fused results with each leg's rank, and each
leg's own top list beside them, so a person sees what each leg brought and what fusion did."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from daemon.explore.html import esc, link, snippet, table, when
from memory.filters import filter_from_pairs
from memory.search_results import SearchOutcome, leg_order

#: The legs in the order their columns are shown.
LEGS = ("sparse", "dense", "identifier", "recency", "speaker")
LEG_NAMES = {
    "sparse": "BM25",
    "dense": "vector",
    "identifier": "identifier",
    "recency": "recency",
    "speaker": "speaker",
}


@dataclass(frozen=True, slots=True)
class AskForm:
    """The form's fields as typed (strings: the page shows them back as they were)."""

    q: str = ""
    tenant: str = ""
    k: str = "10"
    scope: str = "chunks"
    dense: str = ""
    sparse: str = ""
    identifier: str = ""
    recency: str = ""
    speaker: str = ""
    rrf_k: str = ""
    filters: str = ""  # one key=value a line
    since: str = ""
    until: str = ""
    tenants: tuple[str, ...] = field(default=())  # what the tenant select offers


def form_html(form: AskForm) -> str:
    """The query form (GET, so each question has a URL)."""

    def box(name: str, label: str, value: str, hint: str = "") -> str:
        return f'<label>{esc(label)}<input name="{esc(name)}" value="{esc(value)}" placeholder="{esc(hint)}"></label>'

    tenants = "".join(
        f'<option value="{esc(t)}"{" selected" if t == form.tenant else ""}>{esc(t)}</option>' for t in form.tenants
    )
    scopes = "".join(
        f'<option value="{s}"{" selected" if s == form.scope else ""}>{s}</option>'
        for s in ("chunks", "communities", "all")
    )
    return (
        '<form class="ask" method="get" action="/explore/ask">'
        f'<label class="wide">question<input id="q" name="q" value="{esc(form.q)}" size="80"></label>'
        f'<label>tenant<select name="tenant">{tenants}</select></label>'
        f'<label>scope<select name="scope">{scopes}</select></label>'
        + box("k", "top k", form.k)
        + box("rrf_k", "RRF k", form.rrf_k, "default")
        + box("sparse", "BM25 weight", form.sparse, "default")
        + box("dense", "vector weight", form.dense, "default")
        + box("identifier", "identifier weight", form.identifier, "default")
        + box("recency", "recency weight", form.recency, "default")
        + box("speaker", "speaker weight", form.speaker, "default")
        + box("since", "since (ISO time, age, yesterday)", form.since, "open")
        + box("until", "until (ISO time, age, today)", form.until, "open")
        + f'<label class="wide">metadata filter, one key=value or key!=value a line<textarea name="filters" rows="2">'
        f"{esc(form.filters)}</textarea></label>"
        '<div class="wide"><button type="submit">ask</button></div></form>'
    )


def _rank_cell(rank: int | None) -> str:
    return f'<span class="num">{rank}</span>' if rank is not None else '<span class="muted">&ndash;</span>'


def results_html(
    outcome: SearchOutcome,
    weights: Mapping[str, float],
    rrf_k: int,
    texts: Mapping[str, str],
    tenant: str,
    stale: Mapping[str, bool],
) -> str:
    """The fused results and the legs' own lists.

    Args:
        outcome: the search's outcome (its ``ranked`` and ``candidates`` say why).
        weights: the legs' weights the search used; rrf_k: its RRF constant.
        texts: chunk id -> text of the legs' candidates shown that are not among the results.
        tenant: whose memory was searched.
        stale: community id -> whether its summary is stale now.
    """
    legs = [leg for leg in LEGS if leg in outcome.ranked]
    fused_at = {h.chunk.chunk_id: i for i, h in enumerate(outcome.hits, start=1)}
    # A candidate folded into a result for repeating its text (memory.repeats): its result's place.
    repeat_of = {r.chunk_id: i for i, h in enumerate(outcome.hits, start=1) for r in h.repeats}
    rows = []
    for i, h in enumerate(outcome.hits, start=1):
        best = min(h.ranks.values(), default=None)
        moved = "" if best is None else f"{best - i:+d}" if best != i else "0"
        cid = str(h.chunk.metadata.get("community_id", ""))
        badge = ' <span class="stale">stale</span>' if h.chunk.kind == "community" and stale.get(cid) else ""
        rows.append(
            [
                f'<span class="num">{i}</span>',
                f'<span class="num fused-score">{h.score:.5f}</span>',
                *(_rank_cell(h.ranks.get(leg)) for leg in legs),
                f'<span class="num">{esc(moved)}</span>',
                link(h.chunk.doc_id, "/explore/document", tenant=tenant, doc=h.chunk.doc_id)
                + f'<br><span class="muted">{esc(h.chunk.chunk_id)} · {esc(h.chunk.kind)}{badge} · '
                f"{esc(when(h.chunk.timestamp))}</span>"
                + (f'<br><span class="muted">§ {esc(h.chunk.section)}</span>' if h.chunk.section else "")
                + (
                    f'<br><span class="muted repeats">the same text in {h.repeat_count} more: '
                    + ", ".join(link(r.doc_id, "/explore/document", tenant=tenant, doc=r.doc_id) for r in h.repeats[:5])
                    + (" …" if h.repeat_count > 5 else "")
                    + "</span>"
                    if h.repeats
                    else ""
                ),
                f'<div class="text">{snippet(h.chunk.text, 300)}</div>',
            ]
        )
    heads = ["#", "fused score", *(f"{LEG_NAMES[leg]} rank" for leg in legs), "moved", "memory", "text"]
    timing = " · ".join(
        f"{LEG_NAMES.get(name, name)} {1000 * (t.end - t.start):.1f} ms" for name, t in sorted(outcome.legs.items())
    )
    used = ", ".join(f"{LEG_NAMES.get(leg, leg)} {weights.get(leg, 0.0):g}" for leg in LEGS)
    summary = (
        f'<p id="ask-summary">{len(outcome.hits)} results in {outcome.took_ms:.1f} ms · weights: {esc(used)} · '
        f"RRF k {rrf_k} · legs: {esc(timing) or 'none ran'}. "
        '<span class="muted">"moved": the best leg rank minus the fused rank (positive: fusion lifted it).'
        " A transcript turn weighs its legs by its own defaults unless the request set a weight.</span></p>"
    )
    out = summary + table(heads, rows, table_id="results", empty="no result")
    out += '<h2>Each leg\'s own list</h2><div class="legs">'
    show = max(len(outcome.hits), 1)
    for leg in legs:
        ordered = leg_order(outcome.ranked[leg])
        leg_rows = []
        for chunk_id, rank in ordered[: max(show, 10)]:
            hit = outcome.candidates.get(chunk_id)
            fused = fused_at.get(chunk_id)
            text = texts.get(chunk_id, "")
            won = ' class="won"' if fused is not None else ""
            folded = repeat_of.get(chunk_id)
            where = (
                f"fused #{fused}"
                if fused is not None
                else f"repeats #{folded}"
                if folded is not None
                else "not in the results"
            )
            leg_rows.append(
                (
                    f'<span class="num"{won}>{rank}</span>',
                    f"{esc(hit.doc_id if hit else chunk_id)}<br>"
                    f'<span class="muted">{esc(chunk_id)} · {esc(where)}</span>'
                    + (f'<div class="text">{snippet(text, 160)}</div>' if fused is None and text else ""),
                )
            )
        out += f"<div><h3>{esc(LEG_NAMES[leg])} ({len(ordered)} candidates, weight " + (
            f"{weights.get(leg, 0.0):g})</h3>"
            + table(("rank", "candidate"), leg_rows, table_id=f"leg-{leg}", empty="no candidate")
            + "</div>"
        )
    return out + "</div>"


def error_html(message: str) -> str:
    """A refused question (the retrieval's own words)."""
    return f'<p class="bad" id="ask-error">{esc(message)}</p>'


def leg_only_ids(outcome: SearchOutcome, shown: int) -> list[str]:
    """The chunk ids the legs' shown lists hold that are not among the results (their texts are read)."""
    winners = {h.chunk.chunk_id for h in outcome.hits}
    out: dict[str, None] = {}
    for leg in LEGS:
        if leg in outcome.ranked:
            for chunk_id, _ in leg_order(outcome.ranked[leg])[: max(shown, 10)]:
                if chunk_id not in winners:
                    out.setdefault(chunk_id)
    return list(out)


def parse_filters(text: str) -> dict[str, object]:
    """``key=value`` and ``key!=value`` lines as a metadata filter (``filter_from_pairs``):
    a key given twice takes any of its values, or with ``!=`` none of them.

    Raises:
        InvalidRequest: a line that holds no ``=``, or a key given with both forms.
    """
    return filter_from_pairs((line for line in text.splitlines() if line.strip()), strip=True)
