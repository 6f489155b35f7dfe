"""Who may see what over HTTP: bearer tokens, tenant-scoped tokens, the loopback rule (pure).

With no token configured the HTTP server is open (on a loopback address by default), except
that the explorer is refused on a non-loopback address: it shows what agents remember. With a
token, every endpoint but ``/healthz`` and ``/readyz`` requires one: the
operator's token (``http_token``) sees everything, a tenant's token (``http_tenant_tokens``)
only the explorer, and only its tenant. Tokens are compared in constant time, as the MCP
server's.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

#: What a request without a valid token gets, from the HTTP server and from ``agentmemd mcp --http``.
UNAUTHORIZED = {"error": "unauthorized", "message": "send Authorization: Bearer <token>"}
#: The ``WWW-Authenticate`` challenge sent with it.
BEARER_CHALLENGE = 'Bearer realm="agentmemd"'
#: Paths served to anyone (probes carry no token).
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
#: The cookie the explorer's login form sets (for browsers, which cannot add a header).
COOKIE = "agentmemd_token"
#: Paths under the explorer that need no token: the login form, its stylesheet and the logout
#: (a stale or rotated token must be able to leave).
LOGIN_PATHS = frozenset({"/explore/login", "/explore/logout", "/explore/static/explore.css"})


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request is: the operator (``tenant`` None: every tenant) or one tenant."""

    tenant: str | None

    def sees(self, tenant: str) -> bool:
        """Whether this principal may see ``tenant``'s memory."""
        return self.tenant is None or self.tenant == tenant


OPERATOR = Principal(None)


@dataclass(frozen=True, slots=True)
class Access:
    """The tokens in force: the operator's (``""`` = none) and each tenant's."""

    token: str = ""
    tenant_tokens: Mapping[str, str] | None = None

    @property
    def required(self) -> bool:
        """Whether any token is configured (then every endpoint but health needs one)."""
        return bool(self.token) or any(self.tenant_tokens.values() if self.tenant_tokens else ())

    def identify(self, authorization: str | None, cookie: str | None = None) -> Principal | None:
        """The principal a request's ``Authorization: Bearer`` header (else the login cookie)
        names; ``OPERATOR`` when no token is required; None for a missing or wrong token.

        Every configured token is compared, each in constant time, so the time taken does not
        tell which one came close.
        """
        if not self.required:
            return OPERATOR
        given = bearer(authorization) or (cookie or "")
        if not given:
            return None
        found: Principal | None = None
        if self.token and _same(given, self.token):
            found = OPERATOR
        for tenant, token in sorted((self.tenant_tokens or {}).items()):
            if token and _same(given, token) and found is None:
                found = Principal(tenant)
        return found


def bearer(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header; ``""`` for none or another scheme."""
    if not authorization:
        return ""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an HTTP bind address) is reachable from this machine only.

    ``localhost`` counts; ``""`` and ``0.0.0.0`` (every interface) and names do not.
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def rebound(bind_host: str, request_host: str | None) -> bool:
    """Whether a request to a server bound to loopback names another host in its ``Host``
    header: a web page whose domain was re-pointed at 127.0.0.1 (DNS rebinding) reading the
    server through the operator's browser. A server bound elsewhere is reached by names of its
    own, which only a token guards."""
    if not is_loopback(bind_host):
        return False
    name = (request_host or "").lower()
    return not (name == "localhost" or name.endswith(".localhost") or is_loopback(name))


def explorer_refusal(host: str, access: Access) -> str | None:
    """Why the explorer must not be served on ``host`` with these tokens, or None when it may."""
    if access.required or is_loopback(host):
        return None
    return (
        f"the explorer shows what agents remember, and the HTTP server listens on {host!r} "
        "with no token: set AGENTMEM_HTTP_TOKEN (or bind AGENTMEM_HTTP_HOST to 127.0.0.1)"
    )


def duplicate_tokens(token: str, tenant_tokens: Mapping[str, str]) -> list[str]:
    """The tenants whose token is also another tenant's or the operator's (ambiguous: refused)."""
    seen: dict[str, str] = {token: "(operator)"} if token else {}
    clashes: list[str] = []
    for tenant, value in sorted(tenant_tokens.items()):
        if not value:
            continue
        if value in seen:
            clashes.append(tenant)
        seen.setdefault(value, tenant)
    return clashes
