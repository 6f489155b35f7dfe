"""The contract side's errors, in the daemon's one tree (``memory.errors``)::

MemdError
├── QueryFailed        the daemon answered a request with an error reply (its code)
├── WriteRejected      the daemon dead-lettered a write the caller waited for (its ack)
├── RequestExpired     a request older than consumer.query_max_age_ms, not searched      expired
├── TenantErased       a request of a tenant erased and not created again           tenant_erased
├── NotFound
│   └── VersionGone    the version a client was reading on was replaced and is no longer kept
└── InvalidRequest
    └── UnknownReplyTopic  reply_to names no topic a reply may go to     invalid_request
"""

from __future__ import annotations

from consumers.events import WriteAck
from consumers.requests import ErrorReply
from memory.errors import InvalidRequest, MemdError, NotFound


class QueryFailed(MemdError):
    """The daemon answered with an error reply; ``code`` is the reply's error code."""

    def __init__(self, reply: ErrorReply) -> None:
        super().__init__(f"{reply.error.code}: {reply.error.message}")
        self.reply = reply
        self.error_code = reply.error.code


class WriteRejected(MemdError):
    """The daemon dead-lettered a write the caller waited for; ``ack`` says why."""

    def __init__(self, ack: WriteAck) -> None:
        super().__init__(f"{ack.error_code or 'rejected'}: {ack.reason or 'dead-lettered'}")
        self.ack = ack
        self.error_code = ack.error_code or "rejected"


class UnknownReplyTopic(InvalidRequest):
    """reply_to names no topic that exists, no valid topic name, or a topic replies may not go
    to: the error reply goes to the default reply topic."""


class RequestExpired(MemdError):
    """A request older than ``consumer.query_max_age_ms`` by the daemon's clock: not searched."""

    code = "expired"


class TenantErased(MemdError):
    """A request on the topic of a tenant that was erased (``agentmemd erase-tenant``) and not
    created again since: nothing of it is kept, and nothing is searched."""

    code = "tenant_erased"  # the error code of an erased tenant's write ack too (consumers.acks)

    def __init__(self, tenant: str) -> None:
        super().__init__(
            f"tenant {tenant!r} was erased (agentmemd erase-tenant): nothing of it is kept, and its "
            f"questions are not answered until its topics are created again (agentmemd topics --tenant {tenant})"
        )


class VersionGone(NotFound):
    """The version a client was reading on (``MemoryClient.read_on``) was replaced and is no
    longer kept before its last part was read (an upsert of the same content under a new
    number replaces it too)."""
