"""``topics``: create the contract's topics, or a tenant's, where they are missing; ``tenants``: those seen."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer

from daemon.cli._app import _fail, _settings, _with_redis, app, out
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
    settings = _settings()
    if tenant and settings.consumer.tenancy != "topic":
        raise _fail(
            ValueError(
                "--tenant needs AGENTMEM_CONSUMER__TENANCY=topic: in single mode the daemon reads only "
                "the contract's own topics, so a tenant's would never be read"
            )
        )

    async def main() -> list[tuple[str, bool]]:
        if not tenant:
            created = set(await ensure_contract_topics(settings, timeout_s=TIMEOUT_S))
            return [(t, t in created) for t in settings.topics.all()]
        rows: list[tuple[str, bool]] = []
        for name in dict.fromkeys(tenant):
            created = set(await ensure_tenant_topics(settings, name, timeout_s=TIMEOUT_S))
            rows += [(t, t in created) for t in tenant_topics(settings, name)]
        return rows

    try:
        rows = asyncio.run(main())
    except MemdError as exc:
        raise _fail(exc) from exc
    for name, created in rows:
        out.print(f"{'created' if created else 'exists '}  {name}", highlight=False)


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
