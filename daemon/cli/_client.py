"""Running a command with a Kafka ``MemoryClient``, and the options that reach it (``query``, ``publish``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer

from consumers.client import MemoryClient
from consumers.client_core import DEFAULT_TIMEOUT_S
from consumers.errors import QueryFailed
from consumers.events import WriteAck
from consumers.spelling import near_name
from daemon.cli._app import _fail, _settings
from daemon.connections import memory_client
from daemon.settings import Settings
from daemon.wording import CLI_NAMES, in_words
from memory.errors import InvalidRequest, MemdError, NotFound
from memory.filters import filter_from_pairs
from memory.records import DEFAULT_TENANT

T = TypeVar("T")


def _filter(values: list[str] | None) -> dict[str, Any]:
    """``--filter`` options (``key=value``, ``key!=value``) as a request's filter."""
    try:
        return filter_from_pairs(values or [])
    except InvalidRequest as exc:
        raise typer.BadParameter(f"--filter: {exc}") from None


def _pairs(values: list[str] | None, what: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for raw in values or []:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{what} must look like key=value, got {raw!r}")
        if key in result:
            prev = result[key]
            result[key] = [*prev, value] if isinstance(prev, list) else [prev, value]
        else:
            result[key] = value
    return result


def _with_client(
    fn: Callable[[MemoryClient], Awaitable[T]],
    settings: Settings | None = None,
    tenant: str | None = None,
    *,
    timeout_s: float | None = None,
) -> T:
    """Run ``fn`` with a client of ``tenant`` (see ``_tenant_target``), failing as the CLI does;
    ``timeout_s``: how long a reply is waited for (None: the client's default)."""
    settings = _settings() if settings is None else settings

    async def main() -> T:
        # A tenant's client reads the tenant's own reply topic, as the daemon's default for
        # it: never the shared one, which every tenant reads and topic ACLs may not grant.
        async with memory_client(
            settings, tenant=tenant, timeout_s=DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
        ) as client:
            return await fn(client)

    try:
        return asyncio.run(main())
    except QueryFailed as exc:
        raise _fail(exc, in_words(str(exc), CLI_NAMES)) from exc
    except (MemdError, TimeoutError) as exc:
        raise _fail(exc, in_words(str(exc), CLI_NAMES) or "no reply in time") from exc


def _tenant_target(tenancy: str, tenant: str | None) -> str | None:
    """The tenant whose topics ``--tenant`` names under ``tenancy`` (None: the bare topics).

    Raises:
        typer.BadParameter: topic tenancy without a tenant (the bare topics name none there:
            a query or publish would be refused), or another tenant than the
            default one in single mode.
    """
    if tenancy == "topic":
        if tenant is None:
            raise typer.BadParameter(
                "the daemon runs in topic tenancy (AGENTMEM_CONSUMER__TENANCY=topic): name the tenant with --tenant"
            )
        return tenant
    if tenant not in (None, DEFAULT_TENANT):
        raise typer.BadParameter(
            f"--tenant {tenant} needs AGENTMEM_CONSUMER__TENANCY=topic; in single mode every memory is the "
            f"{DEFAULT_TENANT!r} tenant's"
        )
    return None


async def check_tenant_known(settings: Settings, client: Any, tenant: str) -> None:
    """In topic tenancy, refuse a tenant no daemon has read an event of: a misspelt tenant's
    graph or dead letters are empty, which said as "nothing there" would mislead.

    Raises:
        NotFound: it is unknown (with the near spelling), or was erased.
    """
    from memory.tenants import TenantRegistry

    if settings.consumer.tenancy != "topic":
        return
    registry = TenantRegistry(client=client, name=settings.index.name)
    seen = await registry.all()
    if tenant in seen:
        return
    if tenant in await registry.erased():
        raise NotFound(f"tenant {tenant!r} was erased (agentmemd erase-tenant)")
    near = near_name(tenant, seen)
    raise NotFound(
        f"no tenant {tenant!r} is known here: no daemon has read an event of it"
        + (f"; did you mean {near!r}?" if near else "")
        + " (`agentmemd tenants` lists those read)"
    )


def refused(ack: WriteAck | None) -> bool:
    """Whether a waited-for write changed nothing because it was refused (a conflicting
    version, an erased tenant), not because it was a retry: a script must see it fail."""
    return ack is not None and ack.status == "ignored" and ack.error_code is not None


def ack_said(ack: WriteAck) -> str:
    """What a write's ack says, for a person: ``indexed (12 chunk(s), 1 embedded)``, or its
    status and why."""
    if ack.status == "indexed":
        embedded = f", {ack.embedded} embedded" if ack.embedded is not None else ""
        if ack.removed:
            return f"indexed ({ack.removed} chunk(s) removed)"
        return "indexed" + (f" ({ack.chunks} chunk(s){embedded})" if ack.chunks else "")
    return f"{ack.status}: {ack.reason}"
