"""One error hierarchy for the whole daemon.

``code`` values are part of the reply contract (``docs/contract.md``): adding one is an
API change, renaming one breaks callers.
"""

from __future__ import annotations

from typing import ClassVar


class MemdError(Exception):
    """Base of every error the daemon raises on purpose."""

    code: ClassVar[str] = "internal"
    retryable: ClassVar[bool] = False


class InvalidRequest(MemdError):
    """The caller sent something we cannot act on (bad JSON, schema, filter key, top_k)."""

    code = "invalid_request"


class InvalidEvent(MemdError):
    """An ingested event is malformed; it goes to the DLQ with this message."""

    code = "invalid_event"


class NotFound(MemdError):
    """A named thing (index, document) does not exist."""

    code = "not_found"


class BackendUnavailable(MemdError):
    """Redis or Kafka cannot be reached right now; the operation may succeed later."""

    code = "unavailable"
    retryable = True


class Unauthorized(MemdError):
    """A backend refused our credentials: a configuration problem, not an outage."""

    code = "unauthorized"
