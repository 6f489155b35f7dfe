"""``mcp``: serve the memory as MCP tools (stdio for a desktop host, or streamable HTTP)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from consumers.client import MemoryClient
from daemon.cli._app import _fail, _settings, app
from daemon.cli._client import _tenant_target
from daemon.connections import memory_client
from daemon.explore.access import is_loopback
from daemon.mcp_tools import MemoryTools
from memory.errors import MemdError


@app.command()
def mcp(
    http: Annotated[
        bool, typer.Option("--http", metavar="", help="Serve streamable HTTP at /mcp instead of stdio.")
    ] = False,
    host: Annotated[
        str | None, typer.Option("--host", help="HTTP address (with --http; default AGENTMEM_MCP__HOST, 127.0.0.1).")
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", help="HTTP port (with --http; default AGENTMEM_MCP__PORT, 8765).")
    ] = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Whose memory every tool reads and writes (topic tenancy).")
    ] = None,
) -> None:
    """Serve the memory as MCP tools over the daemon's Kafka contract (docs/mcp.md)."""
    from daemon.mcp_server import serve_http, serve_stdio

    settings = _settings()
    target = _tenant_target(settings.consumer.tenancy, tenant)
    cfg = settings.mcp
    host = cfg.host if host is None else host
    port = cfg.port if port is None else port
    if http and not cfg.token.get_secret_value() and not is_loopback(host):
        # As the explorer: anyone reaching the port could read and write every memory it serves.
        raise _fail(
            MemdError(
                f"address {host} (--host or AGENTMEM_MCP__HOST) is reachable from other machines and no token is "
                "set: set AGENTMEM_MCP__TOKEN (or serve on 127.0.0.1)"
            )
        )

    def make_client() -> MemoryClient:
        return memory_client(settings, tenant=target, timeout_s=cfg.client_timeout_s)

    status_host = "127.0.0.1" if settings.http_host in ("0.0.0.0", "::", "") else settings.http_host
    status_url = f"http://{status_host}:{settings.http_port}" if settings.http_port else None
    tools = MemoryTools(make_client, cfg, status_url=status_url, tenant=target, filter_keys=settings.index.filter_keys)
    try:
        if http:
            asyncio.run(serve_http(tools, host=host, port=port, token=cfg.token.get_secret_value()))
        else:
            asyncio.run(serve_stdio(tools))
    except KeyboardInterrupt:
        pass
