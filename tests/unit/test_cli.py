"""Pure helpers of the `agentmemd` command line."""

from __future__ import annotations

import pytest
import typer

from daemon.cli import _tenant_target


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
