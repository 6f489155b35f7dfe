"""Topic names: a tenant's topics (``<base>.<tenant>``), read back and checked (pure).

In topic tenancy every topic the daemon reads, and each tenant's replies topic, is a contract
topic's name with the tenant after a dot; in single tenancy the contract names are used as they
are, and every record is the ``default`` tenant's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memory.errors import InvalidRequest
from memory.records import DEFAULT_TENANT

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_TENANT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


#: What a tenant's name may be, for people.
TENANT_NAME_RULE = "1-64 of A-Z a-z 0-9 _ -"


def valid_tenant(name: str) -> bool:
    """Whether ``name`` is a tenant's name (topic tenancy reads ``<base>.<name>`` for it)."""
    return bool(_TENANT.match(name))


def tenant_topic(base: str, tenant: str) -> str:
    """``<base>.<tenant>``, the topic a daemon in topic tenancy reads for ``tenant``.

    Raises:
        InvalidRequest: ``tenant`` is no valid tenant name (the daemon would dead-letter the
            record, or never read the topic).
    """
    if not valid_tenant(tenant):
        raise InvalidRequest(f"tenant {tenant!r} is not {TENANT_NAME_RULE}")
    return f"{base}.{tenant}"


def tenant_from_topic(topic: str, base: str, mode: str) -> str | None:
    """The tenant a record belongs to: always ``default`` in single mode; in topic mode the
    suffix of ``<base>.<tenant>``, or ``None`` when the topic does not name a valid tenant.
    """
    if mode == "single":
        return DEFAULT_TENANT
    prefix = base + "."
    if not topic.startswith(prefix):
        return None
    tenant = topic[len(prefix) :]
    return tenant if valid_tenant(tenant) else None


def read_for(topic: str, base: str, tenancy: str) -> bool:
    """Whether a daemon of ``tenancy`` reads ``topic`` for the contract topic ``base``: the base
    itself in single tenancy; in topic tenancy a tenant's topic of it, and the base too (whose
    records it refuses, as they name no tenant)."""
    return topic == base or (tenancy != "single" and topic.startswith(base + "."))


def topic_base(topic: str, bases: Sequence[str]) -> str | None:
    """The first of ``bases`` that ``topic`` is, or is a tenant's topic of (``<base>.<tenant>``)."""
    return next((base for base in bases if topic == base or topic.startswith(base + ".")), None)


def valid_topic(name: str) -> bool:
    """Whether ``name`` is a legal Kafka topic name (so a reply can be published to it)."""
    return bool(_TOPIC.match(name)) and name not in {".", ".."}
