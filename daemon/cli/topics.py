"""``topics``: create the contract's topics, or a tenant's, where they are missing; ``tenants``: those seen."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer
from rich.markup import escape

from daemon.cli._app import _fail, _settings, _with_redis, app, err, out
from daemon.cli.query import shown_epoch
from daemon.connections import redis_client
from daemon.settings import Settings
from daemon.topics import ensure_contract_topics, ensure_tenant_topics, tenant_topics
from memory.errors import MemdError

#: How long the command waits for the broker.
TIMEOUT_S = 30.0


@app.command()
def topics(
    tenant: Annotated[
        list[str] | None,
        typer.Option(
            "--tenant", metavar="NAME", help="A tenant whose topics to create (topic tenancy); repeat for several."
        ),
    ] = None,
) -> None:
    """Create the contract's topics, or with --tenant a tenant's, where they are missing.

    A tenant's: documents, transcripts, requests, replies (events with the daemon's record size).
    """
    settings = _settings(quiet=True)
    if tenant and settings.consumer.tenancy != "topic":
        raise _fail(
            ValueError(
                "--tenant needs AGENTMEM_CONSUMER__TENANCY=topic: in single mode the daemon reads only "
                "the contract's own topics, so a tenant's would never be read"
            )
        )

    async def main() -> tuple[list[tuple[str, bool]], dict[str, float], list[tuple[str, str]]]:
        if not tenant:
            created = set(await ensure_contract_topics(settings, timeout_s=TIMEOUT_S))
            return [(t, t in created) for t in settings.topics.all()], {}, []
        from memory.tenants import TenantRegistry  # only a tenant's topics need Redis

        rows: list[tuple[str, bool]] = []
        lifted: dict[str, float] = {}
        unchecked: list[tuple[str, str]] = []
        client = redis_client(settings)
        registry = TenantRegistry(client=client, name=settings.index.name)
        try:
            for name in dict.fromkeys(tenant):
                created = set(await ensure_tenant_topics(settings, name, timeout_s=TIMEOUT_S))
                rows += [(t, t in created) for t in tenant_topics(settings, name)]
                try:  # a tenant erased before starts anew, once its topics are there
                    if (at := await registry.restore(name)) is not None:
                        lifted[name] = at
                except MemdError as exc:  # the topics are what this command is for: Redis may be out of its reach
                    unchecked.append((name, str(exc)))
        finally:
            await client.aclose()
        return rows, lifted, unchecked

    try:
        rows, lifted, unchecked = asyncio.run(main())
    except MemdError as exc:
        raise _fail(exc) from exc
    for name, created in rows:
        out.print(f"{'created' if created else 'exists '}  {name}", highlight=False)
    for name, why in unchecked:
        err.print(
            f"[yellow]warning:[/yellow] could not read whether tenant {escape(name)} was erased ({escape(why)}): "
            "were it, its events would stay unapplied until this command runs again with Redis in reach"
        )
    for name, at in lifted.items():
        out.print(
            f"tenant {name} was erased at {shown_epoch(at)}: it starts anew (its events from before are never applied)"
        )


@app.command()
def tenants(as_json: Annotated[bool, typer.Option("--json", metavar="", help="A JSON list.")] = False) -> None:
    """The tenants any daemon of this index has seen (``default`` for the bare topics), one a
    line: whom `stale`, `communities` and the read commands take with --tenant."""
    from memory.tenants import TenantRegistry

    async def read(settings: Settings, client: Any) -> list[str]:
        return await TenantRegistry(client=client, name=settings.index.name).all()

    seen = _with_redis(read)
    if as_json:
        print(json.dumps(seen))
        return
    out.print("\n".join(seen) if seen else "no tenant seen yet (no daemon has consumed an event)")


@app.command("erase-tenant")
def erase_tenant_command(
    tenant: Annotated[str, typer.Argument(help="The tenant to erase (topic tenancy).")],
    yes: Annotated[bool, typer.Option("--yes", help="Erase (without it: only say what it would erase).")] = False,
    delete_topics: Annotated[
        bool, typer.Option("--delete-topics", help="Also delete its topics with their events (no daemon may run).")
    ] = False,
    sweep_s: Annotated[
        float, typer.Option("--sweep", min=5, help="How long to sweep for data written by work already in hand.")
    ] = 90.0,
) -> None:
    """Erase a tenant: every memory, graph and summary of it in Redis (every index generation)
    and its place in `tenants`; with --delete-topics, its topics with their events too. Daemons
    apply none of its events from then on, until `agentmemd topics --tenant` starts it anew."""
    from daemon.erase import check_known, delivery_topics, erase_tenant, tenant_keys

    settings = _settings(quiet=True)
    if settings.consumer.tenancy != "topic":
        raise _fail(
            ValueError(
                "erase-tenant needs AGENTMEM_CONSUMER__TENANCY=topic: in single tenancy every memory is the default "
                "tenant's, and its events stay in the shared topics (remove an agent's turns with `agentmemd publish "
                "forget --all-sessions`, a document with `agentmemd publish delete`)"
            )
        )
    try:
        topics = tenant_topics(settings, tenant)
    except MemdError as exc:
        raise _fail(exc) from exc
    if not yes:

        async def preview(s: Settings, client: Any) -> int:
            await check_known(s, client, tenant)
            return await tenant_keys(client, s.index.name, tenant, delivery_topics(s, tenant), delete=False)

        found = _with_redis(preview)
        what = f"delete the topics {', '.join(topics)} with every event they hold, and " if delete_topics else ""
        out.print(
            f"this would erase tenant {tenant}: {what}every memory, graph and summary of it in Redis ({found} key(s) "
            "now), and it cannot be undone. Run again with --yes.",
            highlight=False,
        )
        raise typer.Exit(code=2)
    report = _with_redis(
        lambda s, client: erase_tenant(s, client, tenant, delete_topics=delete_topics, sweep_for_s=sweep_s)
    )
    deleted = f"{len(report.topics)} topic(s) deleted ({', '.join(report.topics)}), " if report.topics else ""
    out.print(
        f"tenant {tenant} erased at {shown_epoch(report.erased_at)}: {deleted}"
        f"{report.keys + report.late_keys} Redis key(s) deleted "
        f"({report.late_keys} of them written meanwhile by batches already in hand)",
        highlight=False,
    )
    if not report.quiet:
        raise _fail(
            MemdError(
                f"a daemon was still writing tenant {tenant}'s data after {report.swept_s:.0f} s of sweeping: "
                "run the command again once its batch is done"
            )
        )
    if not delete_topics:
        out.print(
            f"its events stay in {', '.join(topics[:2])} (daemons ignore them) until their retention removes them, or "
            "until the topics are deleted: with the daemons stopped, `agentmemd erase-tenant "
            f"{tenant} --yes --delete-topics` (an embedded broker forgets them when `up` restarts)",
            highlight=False,
        )
    out.print(
        f"dead letters of {tenant} stay in {settings.topics.dlq} until its retention removes them; "
        f"`agentmemd topics --tenant {tenant}` would start it anew",
        highlight=False,
    )
