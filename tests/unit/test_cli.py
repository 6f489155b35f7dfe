"""Pure helpers of the `agentmemd` command line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import typer

from daemon.cli import _tenant_target, _when


@pytest.mark.parametrize(
    ("tenancy", "tenant", "want"),
    [
        ("single", None, None),
        ("single", "default", None),  # single mode's only tenant: the bare requests topic
        ("topic", "acme", "acme"),
        ("topic", "default", "default"),  # a tenant like any other there
    ],
)
def test_tenant_target(tenancy: str, tenant: str | None, want: str | None) -> None:
    """`agentmemd query --tenant` names a tenant's requests topic only in topic tenancy."""
    assert _tenant_target(tenancy, tenant) == want


@pytest.mark.parametrize(
    ("tenancy", "tenant", "why"),
    [
        ("single", "acme", "--tenant acme needs AGENTMEM_CONSUMER__TENANCY=topic"),
        ("topic", None, "name the tenant with --tenant"),
    ],
)
def test_tenant_target_refused(tenancy: str, tenant: str | None, why: str) -> None:
    """A tenant in single mode, or none in topic tenancy, is a usage error (never a timeout)."""
    with pytest.raises(typer.BadParameter, match=why):
        _tenant_target(tenancy, tenant)


def test_since_and_until_take_an_iso_time_or_an_age() -> None:
    """`--since 24h` is a day ago; an ISO time is taken as written; anything else is refused."""
    assert _when(None, "--since") is None
    assert _when("2026-11-01T08:00:00+00:00", "--since") == datetime(2026, 11, 1, 8, tzinfo=UTC)
    ago = _when("24h", "--since")
    assert ago is not None and abs(datetime.now(UTC) - timedelta(hours=24) - ago) < timedelta(seconds=5)
    week = _when("2w", "--until")
    assert week is not None and abs(datetime.now(UTC) - timedelta(weeks=2) - week) < timedelta(seconds=5)
    with pytest.raises(typer.BadParameter, match="--since"):
        _when("yesterday", "--since")
