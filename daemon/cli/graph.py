"""``graph``, ``stale`` and ``communities``: the entity graph, its communities and stale summaries."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.table import Table

from daemon.cli._app import _fail, _settings, _with_redis, app, err, out
from daemon.cli._client import _tenant_target, check_tenant_known
from daemon.cli.query import shown_epoch
from daemon.settings import Settings
from memory.errors import MemdError
from memory.records import DEFAULT_TENANT
from memory.tenants import TenantRegistry

if TYPE_CHECKING:
    from graph import GraphService

T = TypeVar("T")

graph_app = typer.Typer(no_args_is_help=True, help="The entity graph and its communities.")
app.add_typer(graph_app, name="graph")


TenantOpt = Annotated[
    str | None, typer.Option("--tenant", help="Whose graph: required in topic tenancy; 'default' otherwise.")
]


def _with_graph(fn: Callable[[GraphService], Awaitable[T]], tenant: str | None = None) -> T:
    """Run ``fn`` with ``tenant``'s graph service, wired as the daemon wires it, over the active
    index. In topic tenancy the tenant must be named: the default one holds nobody's graph there."""

    from daemon.components import active_index, build_graph  # only these commands need the graph's wiring

    async def run(settings: Settings, client: Any) -> T:
        whose = _tenant_target(settings.consumer.tenancy, tenant) or DEFAULT_TENANT
        await check_tenant_known(settings, client, whose)
        graph = build_graph(settings, redis=client, index=await active_index(settings, client), embedder=None, ner=None)
        return await fn(graph.service(whose))

    return _with_redis(run)


@app.command()
def stale(
    as_json: Annotated[bool, typer.Option("--json", metavar="")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1)] = 20,
    tenant: TenantOpt = None,
) -> None:
    """The stale-summary queue: depth, oldest age, and the oldest communities with why (in
    topic tenancy without --tenant: each tenant's depth and oldest age)."""
    import time

    if tenant is None and _settings(quiet=True).consumer.tenancy == "topic":
        _every_tenants_stale(as_json)
        return
    depth, items = _with_graph(lambda g: g.store.stale(limit=limit), tenant)
    now = time.time()
    oldest = max((now - i.first_marked_at for i in items), default=0.0)
    if as_json:
        print(
            json.dumps(
                {
                    "depth": depth,
                    "oldest_age_s": round(oldest, 3),
                    "items": [
                        {
                            "community_id": i.community_id,
                            "level": i.level,
                            "first_marked_at": i.first_marked_at,
                            "last_marked_at": i.last_marked_at,
                            "change_count": i.change_count,
                            "doc_ids": i.doc_ids,
                            "attempts": i.attempts,
                            "last_error": i.last_error or None,
                            "retry_at": i.retry_at,
                            "claimed": i.claimed,
                            "asked": i.asked,
                            "ahead": i.ahead,
                        }
                        for i in items
                    ],
                },
                indent=2,
            )
        )
        return
    table = Table(title=f"stale summaries: {depth} queued, oldest {oldest:.1f}s")
    for col in ("community", "level", "age s", "changes", "caused by", "summary"):
        table.add_column(col, overflow="fold")
    for i in items:
        table.add_row(
            i.community_id,
            str(i.level),
            f"{now - i.first_marked_at:.1f}",
            str(i.change_count),
            i.cause(),
            i.state(now),
        )
    out.print(table)


def _every_tenants_stale(as_json: bool) -> None:
    """One line per tenant any daemon has seen: its queue's depth and oldest age, deepest first."""
    import time

    from daemon.components import active_index, build_graph

    async def read(settings: Settings, client: Any) -> list[dict[str, Any]]:
        graph = build_graph(settings, redis=client, index=await active_index(settings, client), embedder=None, ner=None)
        now = time.time()
        rows = []
        for whose in await TenantRegistry(client=client, name=settings.index.name).all():
            depth, oldest = await graph.service(whose).store.stale(limit=1)
            age = round(now - oldest[0].first_marked_at, 3) if oldest else 0.0
            rows.append({"tenant": whose, "depth": depth, "oldest_age_s": age})
        return sorted(rows, key=lambda r: (-r["depth"], -r["oldest_age_s"], r["tenant"]))

    rows = _with_redis(read)
    if as_json:
        print(json.dumps({"tenants": rows}, indent=2))
        return
    table = Table(title=f"stale summaries of {len(rows)} tenant(s): {sum(r['depth'] for r in rows)} queued")
    for col in ("tenant", "queued", "oldest s"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["tenant"], str(r["depth"]), f"{r['oldest_age_s']:.1f}")
    out.print(table)
    out.print("each tenant's communities: agentmemd stale --tenant NAME")


@app.command()
def communities(as_json: Annotated[bool, typer.Option("--json", metavar="")] = False, tenant: TenantOpt = None) -> None:
    """Communities: ids, levels, sizes and whether their summaries are fresh."""

    unnamed = 0  # communities whose every member's documents are gone, until the next recompute

    async def read(g: GraphService) -> list[dict[str, Any]]:
        nonlocal unnamed
        every = await g.store.communities()
        comms = await g.store.named(every)
        unnamed = len(every) - len(comms)
        stale_map = await g.store.is_stale([c.id for c in comms])
        rows = []
        for c in comms:
            summary = await g.store.summaries.get(c.id)
            # Entities some document still names: a deleted or forgotten one leaves the community
            # only at the next recompute, and its name must not show meanwhile.
            live = sorted(await g.store.nodes(sorted(c.members)))
            rows.append(
                {
                    "community_id": c.id,
                    "level": c.level,
                    "size": len(live),
                    "parent": c.parent,
                    "stale": stale_map.get(c.id, False),
                    "summarized": summary is not None,
                    "members": live,
                }
            )
        return rows

    rows = _with_graph(read, tenant)
    if as_json:
        print(json.dumps({"communities": rows}, indent=2))
        return
    table = Table(title=f"{len(rows)} communities")
    for col in ("community", "level", "size", "fresh", "members"):
        table.add_column(col, overflow="fold")
    for r in rows:
        fresh = "stale" if r["stale"] else ("fresh" if r["summarized"] else "none")
        shown = ", ".join(r["members"][:10]) + (f", … ({r['size'] - 10} more)" if r["size"] > 10 else "")
        table.add_row(r["community_id"], str(r["level"]), str(r["size"]), fresh, shown)
    out.print(table)
    if not rows and unnamed:
        err.print(
            f"{unnamed} communities left, none of whose members a document still names (deleted or "
            "forgotten): the next recompute removes them (`agentmemd graph rebuild` now)",
            highlight=False,
        )
    elif not rows:
        cfg = _settings(quiet=True).graph
        err.print(
            "no communities yet: they are computed once the graph has changed by "
            f"{cfg.drift_threshold} entities or edges (graph.drift_threshold), at most every "
            f"{cfg.recompute_min_interval_s:g} s, or at once with `agentmemd graph rebuild`"
            + ("" if cfg.enabled else "; the graph layer is off (AGENTMEM_GRAPH__ENABLED)"),
            highlight=False,
        )


@graph_app.command("rebuild")
def graph_rebuild(tenant: TenantOpt = None) -> None:
    """Recompute communities now (ids stay stable; changed ones are marked stale)."""
    from graph.communities import preload

    # Imported first: the seconds cdlib takes to import were reported as the recompute's own.
    preload()
    report = _with_graph(lambda g: g.recompute(force=True), tenant)
    if report is None:
        raise _fail(MemdError("another daemon holds the recompute lock; try again shortly"))
    out.print(
        f"{report.communities} communities on {report.levels} level(s); {len(report.changed)} new or changed "
        f"(marked stale), {len(report.removed)} removed, {len(report.events)} merges/splits, {report.took_ms:.0f} ms"
    )


@graph_app.command("resummarize")
def graph_resummarize(
    everything: Annotated[
        bool, typer.Option("--all", help="Every summarized community, not only those another summarizer wrote.")
    ] = False,
    summarizer: Annotated[
        str | None,
        typer.Option(
            "--summarizer",
            metavar="NAME",
            help="What the daemons write summaries with ('extractive' or the litellm model), when not recorded.",
        ),
    ] = None,
    tenant: TenantOpt = None,
) -> None:
    """Mark stale the communities whose summary another summarizer wrote (after setting or
    changing graph.llm_model), so the daemons' workers write them again. Compared against the
    summarizer the daemons last started with (recorded in Redis), not this shell's settings."""
    from graph.summary_records import recorded_summarizer

    settings = _settings(quiet=True)

    async def current(_settings: Settings, client: Any) -> tuple[str, float] | None:
        return await recorded_summarizer(client, _settings.index.name)

    recorded = _with_redis(current)
    if summarizer is None and recorded is not None and recorded[0] != settings.graph.summarizer:
        raise _fail(
            MemdError(
                f"the daemons write summaries with {recorded[0]!r} (the last one started its workers at "
                f"{shown_epoch(recorded[1])}), and these settings name {settings.graph.summarizer!r}: run with the "
                f"daemons' settings, or name the summarizer with --summarizer (nothing was marked)"
            )
        )
    by = summarizer or (recorded[0] if recorded is not None else settings.graph.summarizer)
    report = _with_graph(lambda g: g.resummarize(everything=everything, summarizer=by), tenant)
    other = f"communities summarized by another summarizer than {report.summarizer!r}"
    which = "summarized communities" if everything else other
    again = f" ({report.queued} of them were queued already)" if report.queued else ""
    out.print(
        f"{report.marked} {which} marked stale{again}, {report.kept} left as they are; "
        "the daemons' workers write them again (agentmemd stale shows the queue)"
    )


@graph_app.command("repoint")
def graph_repoint() -> None:
    """Re-extract every graph doc of every tenant from the active index's chunks, so entities
    cite the chunks that hold them now (`reindex` does it after a chunking change)."""
    from daemon.components import active_index
    from daemon.reindex import repoint_graph

    async def run(settings: Settings, client: Any) -> int:
        return await repoint_graph(settings, client, await active_index(settings, client))

    done = _with_redis(run)
    out.print(f"{done} graph docs re-pointed to the active index's chunks")
