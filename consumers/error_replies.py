"""Errors as replies (pure): the contract's codes, and the reply a failed request gets."""

from __future__ import annotations

import structlog

from consumers.errors import TenantErased
from consumers.requests import ErrorBody, ErrorReply
from memory.errors import EmbedderError, MemdError, NotFound
from memory.index import IndexError_, QuerySyntaxError

log = structlog.get_logger()

#: The error codes a reply may carry (docs/contract.md); askers switch on them.
REPLY_CODES = frozenset({"invalid_request", "unavailable", "unauthorized", "expired", TenantErased.code, "internal"})


def error_reply(exc: MemdError, query_id: str | None) -> ErrorReply:
    """The reply to a request that failed with ``exc`` (logged: an internal code is a bug of
    ours, an operator's business; the rest is the asker's)."""
    body = error_body(exc)
    emit = log.error if body.code == "internal" else log.info
    emit("query.request_failed", query_id=query_id, code=body.code, cause=exc.code, error=str(exc))
    return ErrorReply(query_id=query_id, error=body)


def reply_code(exc: MemdError) -> str:
    """The contract's code for an error: its own when it is one of them, else what it means to
    the asker. A missing index (Redis came back empty), an index that refused the command or a
    query embedding that failed are ``unavailable`` (try again later; the message says what);
    anything else is ``internal``.
    """
    if exc.code in REPLY_CODES:
        return exc.code
    if isinstance(exc, QuerySyntaxError):  # ours to fix: asking again would fail again
        return "internal"
    if exc.retryable or isinstance(exc, NotFound | IndexError_ | EmbedderError):
        return "unavailable"
    return "internal"


def error_body(exc: MemdError) -> ErrorBody:
    """The error a reply carries for ``exc``: the contract's code (``reply_code``) and its message."""
    return ErrorBody(code=reply_code(exc), message=str(exc))


def crash_reply(exc: Exception, query_id: str | None) -> ErrorReply:
    """The reply to a request whose handling hit a bug of ours: ``internal``, naming only the
    exception's type (its message may quote anything)."""
    return ErrorReply(
        query_id=query_id, error=ErrorBody(code="internal", message=f"internal error: {type(exc).__name__}")
    )
