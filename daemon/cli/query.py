"""``query``: ask the memory a question, and show the reply; ``recent``: an agent's latest turns."""

from __future__ import annotations

import itertools
import re
from datetime import datetime
from typing import Annotated, Any, Literal

import typer
from rich.console import Group
from rich.padding import Padding
from rich.text import Text

from consumers.client import MemoryClient
from consumers.client_core import DEFAULT_TIMEOUT_S
from consumers.errors import QueryFailed
from consumers.requests import ContextTurn, GetItem, GetReply, QueryReply
from consumers.times import when
from daemon.cli._app import _settings, app, out
from daemon.cli._client import _filter, _tenant_target, _with_client
from daemon.control_pictures import json_for_terminal
from memory.conversation import MAX_CONTEXT_TURNS, MAX_RECENT_TURNS, parse_turn
from memory.errors import InvalidRequest

FILTER_HELP = "key=value (repeat a key for any of them) or key!=value (none of them)."
#: The options every read command takes alike.
FilterOpt = Annotated[list[str] | None, typer.Option("--filter", help=FILTER_HELP)]
ReadTenantOpt = Annotated[str | None, typer.Option("--tenant", help="Whose memory (topic tenancy).")]
JsonOpt = Annotated[bool, typer.Option("--json", metavar="", help="Print the raw reply.")]
ReadTimeoutOpt = Annotated[
    float | None,
    typer.Option("--timeout", min=0.1, help=f"Seconds to wait for the daemon's reply (default {DEFAULT_TIMEOUT_S:g})."),
]


def _when(value: str | None, what: str) -> datetime | None:
    """``--since``/``--until``: as ``consumers.times.when`` takes them (ISO 8601, an age, ``yesterday``)."""
    try:
        return when(value, what)
    except InvalidRequest as exc:
        raise typer.BadParameter(str(exc)) from None


@app.command()
def query(
    text: Annotated[str, typer.Argument(help="What to search for.")],
    top_k: Annotated[int, typer.Option("--top-k", help="Results wanted (1..100).")] = 5,
    filters: FilterOpt = None,
    dense_weight: Annotated[float | None, typer.Option("--dense-weight")] = None,
    sparse_weight: Annotated[float | None, typer.Option("--sparse-weight")] = None,
    identifier_weight: Annotated[float | None, typer.Option("--identifier-weight")] = None,
    recency_weight: Annotated[
        float | None, typer.Option("--recency-weight", help="Weight of the lift of newer results (0: off).")
    ] = None,
    speaker_weight: Annotated[
        float | None,
        typer.Option("--speaker-weight", help="Weight of the turns said by someone the query names (0: off)."),
    ] = None,
    rrf_k: Annotated[int | None, typer.Option("--rrf-k")] = None,
    min_similarity: Annotated[
        float | None,
        typer.Option(
            "--min-similarity", min=-1.0, max=1.0, help="The vector leg keeps only candidates this similar (cosine)."
        ),
    ] = None,
    scope: Annotated[
        Literal["chunks", "communities", "all"] | None,
        typer.Option("--scope", help="chunks (default), communities (graph summaries) or all (both, fused)."),
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(
            "--tenant",
            help="Whose memory (topic tenancy): asks on <requests topic>.<tenant>, reads <replies topic>.<tenant>.",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since", help="Only memories from this time on: ISO 8601, an age (24h, 7d), today or yesterday."
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            "--until", help="Only memories up to this time: ISO 8601, an age, today or yesterday (to its end)."
        ),
    ] = None,
    context_turns: Annotated[
        int,
        typer.Option(
            "--context-turns",
            min=0,
            max=MAX_CONTEXT_TURNS,
            help="Show each conversation turn with this many turns around it (0..10).",
        ),
    ] = 0,
    fold_repeats: Annotated[
        bool,
        typer.Option(
            "--fold-repeats/--no-fold-repeats",
            help="List a result that repeats a better one word for word under it (default), or as its own.",
        ),
    ] = True,
    max_per_doc: Annotated[
        int | None,
        typer.Option(
            "--max-per-doc",
            min=0,
            help="Most results of one document while other documents' are found (0: no limit; "
            "default: the daemon's, 3).",
        ),
    ] = None,
    as_json: JsonOpt = False,
    timeout: ReadTimeoutOpt = None,
) -> None:
    """Ask the memory a question over Kafka request/reply."""
    flt = _filter(filters)
    start, end = _when(since, "--since"), _when(until, "--until")
    settings = _settings()
    target = _tenant_target(settings.consumer.tenancy, tenant)

    async def ask(c: MemoryClient) -> QueryReply:
        try:
            return await c.query(
                text,
                top_k=top_k,
                metadata_filter=flt or None,
                dense_weight=dense_weight,
                sparse_weight=sparse_weight,
                identifier_weight=identifier_weight,
                recency_weight=recency_weight,
                speaker_weight=speaker_weight,
                min_similarity=min_similarity,
                rrf_k=rrf_k,
                scope=scope,
                since=start,
                until=end,
                context_turns=context_turns,
                fold_repeats=fold_repeats,
                max_per_doc=max_per_doc,
            )
        except QueryFailed as exc:
            if as_json:  # the raw reply, error replies too, for scripts to parse
                print(json_for_terminal(exc.reply.model_dump_json(indent=2)))
            raise

    reply = _with_client(ask, settings, target, timeout_s=timeout)
    if as_json:
        print(json_for_terminal(reply.model_dump_json(indent=2)))
        return
    out.print(results_view(reply, whole_lines=out.soft_wrap, question=text))


@app.command()
def recent(
    agent_id: Annotated[str, typer.Option("--agent-id", help="Whose turns.")],
    session_id: Annotated[
        str | None, typer.Option("--session-id", help="One session's (default: across the agent's sessions).")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=MAX_RECENT_TURNS, help="Turns wanted (1..100).")] = 20,
    filters: FilterOpt = None,
    tenant: ReadTenantOpt = None,
    as_json: JsonOpt = False,
    timeout: ReadTimeoutOpt = None,
) -> None:
    """Show an agent's latest turns, oldest first: where a session left off."""
    flt = _filter(filters)
    settings = _settings()
    target = _tenant_target(settings.consumer.tenancy, tenant)

    async def read(c: MemoryClient) -> GetReply:
        return await c.recent(agent_id, session_id, limit=limit, metadata_filter=flt or None)

    reply = _with_client(read, settings, target, timeout_s=timeout)
    if as_json:
        print(json_for_terminal(reply.model_dump_json(indent=2)))
        return
    if not reply.items:
        out.print("no turns")
    for item in reply.items:
        out.print(*turn_view(item))


#: Characters of a turn ``recent`` prints: a pasted log or file would bury the turns around it.
RECENT_TURN_CHARS = 2_000


def turn_view(item: GetItem) -> list[Text]:
    """A turn as ``recent`` prints it: when, session/turn and role, then its text, cut after
    :data:`RECENT_TURN_CHARS` characters with how many more there are."""
    meta = item.metadata or {}
    where = f"{meta.get('session_id', '?')}/{meta.get('turn', '?')} {meta.get('role', '')}"
    head = f"{shown_time(item.timestamp) or '?'}  {where}:"
    content = item.content or ""
    parts = [Text(head, style="bold"), Text(content[:RECENT_TURN_CHARS])]
    if len(content) > RECENT_TURN_CHARS:
        more = len(content) - RECENT_TURN_CHARS
        parts.append(Text(f"… ({more:,} more characters: `--json` shows them)", style="yellow"))
    elif item.content_truncated:
        parts.append(Text("(cut: longer than one reply)", style="yellow"))
    return parts


def shown_time(iso: str | None) -> str:
    """A reply's ISO 8601 UTC time as every read command prints it: ``2026-12-05 16:12 UTC``."""
    return f"{iso[:16].replace('T', ' ')} UTC" if iso else ""


def shown_epoch(at: float) -> str:
    """A time in seconds since the epoch as ``shown_time`` prints it."""
    from datetime import UTC, datetime

    return shown_time(datetime.fromtimestamp(at, UTC).isoformat())


def results_view(
    reply: QueryReply, snippet_chars: int = 240, *, whole_lines: bool = False, question: str = ""
) -> Group:
    """A reply for a terminal of any width: per result, one line of facts (cut at the edge)
    and the text below it, wrapped; with ``context``, the turns around a turn dimmed, before
    and after it. A table with the text as one column of six showed none of it at 80 columns.
    ``whole_lines`` (piped output): nothing is cut or wrapped at the console's width. A text
    longer than ``snippet_chars`` shows the part that holds most of ``question``'s words."""

    def indented(text: Text) -> Any:
        # Padding renders to the console's width, which would crop an unwrapped line.
        return Text("    ") + text if whole_lines else Padding(text, (0, 0, 0, 4), expand=False)

    n = reply.total_retrieved
    lines: list[Any] = [Text(f"{n} result{'' if n == 1 else 's'} in {reply.took_ms:.1f} ms", style="bold")]
    if reply.truncated:
        lines.append(Text("(truncated: more results did not fit one Kafka record)", style="yellow"))
    for i, r in enumerate(reply.results, 1):
        ranks = " ".join(f"{k}:{v}" for k, v in sorted(r.ranks.items()))
        when = shown_time(r.timestamp)
        # The chunk id last: it is the long part, so an edge cuts it rather than the ranks.
        head = Text(no_wrap=True, overflow="ignore" if whole_lines else "ellipsis")
        head.append(f"{i:>2}. ", style="bold")
        head.append(f"{r.rrf_score:.4f}  ", style="cyan")
        head.append(f"{ranks}  ", style="dim")
        head.append(f"{when}  " if when else "")
        head.append(r.chunk_id, style="green")
        lines.append(head)
        ref = parse_turn(r.doc_id) if r.context else None
        own = ref.turn if ref is not None else None
        around = r.context or []
        for t in (t for t in around if own is not None and t.turn < own):
            lines.append(indented(_said(t, snippet_chars)))
        if r.section:
            lines.append(indented(Text(f"§ {r.section}", style="dim")))
        body = Text(_snippet(r.text, snippet_chars, question))
        if own is not None and around:  # among its neighbours, the match says so (dimming is lost in a pipe)
            role = str(r.metadata.get("role") or "")
            body = Text(f"» turn {own}{f' ({role})' if role else ''}: ", style="bold") + body
        lines.append(indented(body))
        for t in (t for t in around if own is None or t.turn > own):
            lines.append(indented(_said(t, snippet_chars)))
        if (c := r.community) is not None:
            fresh = "stale: marked to be written again (`agentmemd stale` says why)" if c.stale else "fresh"
            about = f"(community summary, level {c.level}, {c.member_count} members, {fresh})"
            lines.append(indented(Text(about, style="yellow" if c.stale else "dim")))
        if r.repeats:
            times = sorted(x.timestamp for x in r.repeats if x.timestamp)
            span = f", the latest {shown_time(times[-1])}" if times else ""
            n = r.repeat_count or len(r.repeats)
            # Chunks of one long document or turn share its id: then the chunk ids tell them apart.
            ids = [x.doc_id for x in r.repeats]
            named = ids if len(set(ids)) == len(ids) and r.doc_id not in ids else [x.chunk_id for x in r.repeats]
            said = f"(the same text in {n} more: {', '.join(named[:3])}"
            said += f"{', …' if n > 3 else ''}{span})"
            lines.append(indented(Text(said, style="dim")))
    return Group(*lines)


def _said(t: ContextTurn, chars: int) -> Text:
    """A turn around a result (``--context-turns``), dimmed."""
    return Text(f"turn {t.turn} ({t.role}): {_snippet(t.text, chars)}", style="dim")


def _snippet(text: str, chars: int, question: str = "") -> str:
    """``text`` on one line, cut to ``chars``: from its start, or around the place that holds
    the most of the question's words (a long chunk's match may lie far from its start, which
    then says nothing of why it was found)."""
    flat = " ".join(text.split())
    if len(flat) <= chars:
        return flat
    start = _best_window(flat, chars, question)
    if start == 0:
        return flat[: chars - 1] + "…"
    if (space := flat.find(" ", start - 1, start + 15)) >= 0:
        start = space + 1  # from a word's start, not its middle
    if len(flat) - start <= chars - 1:  # to the end: one mark
        return "…" + flat[start:]
    return "…" + flat[start : start + chars - 2] + "…"


def _best_window(flat: str, chars: int, question: str) -> int:
    """Where a ``chars``-long window of ``flat`` holds the most distinct words of ``question``
    (of 3 characters or more; case aside); 0 when the start holds as many as any. One pass:
    the windows start a quarter window before each place a word is found, in order."""
    words = sorted(set(re.findall(r"\w{3,}", question.casefold())), key=len, reverse=True)[:64]
    if not words:
        return 0
    pattern = re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, words)) + ")", re.IGNORECASE)
    hits = [(m.start(), m.end(), m.group(0).casefold()) for m in itertools.islice(pattern.finditer(flat), 5000)]
    if not hits:
        return 0
    width = chars - 2
    starts = [0] + [max(0, min(at - chars // 4, len(flat) - chars + 1)) for at, _, _ in hits]
    inside: dict[str, int] = {}
    lo = hi = 0
    best, best_start = -1, 0
    for start in starts:  # never decreasing: a sliding window over the hits
        while hi < len(hits) and hits[hi][1] <= start + width:
            inside[hits[hi][2]] = inside.get(hits[hi][2], 0) + 1
            hi += 1
        while lo < hi and hits[lo][0] < start:
            word = hits[lo][2]
            inside[word] -= 1
            if not inside[word]:
                del inside[word]
            lo += 1
        if len(inside) > best:
            best, best_start = len(inside), start
    return best_start
