"""Redis errors translated into ``memory.errors``' tree at the point they enter.

::

    MemdError
    ├── IndexError_                 Redis rejected an index command
    │   └── QuerySyntaxError        RediSearch could not parse a query we built
    ├── BackendUnavailable          (memory.errors) an outage: retried, nothing committed
    │   └── WriteInProgress         another live process writes this version in slices
    ├── Unauthorized                (memory.errors) credentials or ACL refused
    └── NotFound                    (memory.errors)
        └── _NoGeneration           the index has no active generation

Every redis exception is translated here; none leaves ``memory/``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from redis import exceptions as rexc
from redisvl.exceptions import RedisVLError

from memory.errors import BackendUnavailable, MemdError, NotFound, Unauthorized


class _NoGeneration(NotFound):
    """The index has no active generation (never created, or lost with Redis's data)."""


class WriteInProgress(BackendUnavailable):
    """Another live process is writing this very version of the doc in slices: retried later
    (by then it has finished, and the stored version says so, or stopped, and is taken over)."""


class IndexError_(MemdError):
    """Redis rejected an index command (schema mismatch, bad query)."""

    code = "index_error"


class QuerySyntaxError(IndexError_):
    """RediSearch could not parse a query we built: our bug, not an outage (retrying the
    same query can only fail again)."""


# Refusals that pass: memory full (maxmemory), a replica after a failover, a failed
# snapshot write, a busy script, a cluster resharding. Reported as outages, so ingestion
# backs off without committing, instead of dead-lettering every event it holds.
_REFUSED_FOR_NOW = (
    rexc.OutOfMemoryError,
    rexc.ReadOnlyError,
    rexc.MasterDownError,
    rexc.ClusterDownError,
    rexc.TryAgainError,
)
# The error code leads the message of a single command; inside a transaction redis-py
# rewrites it as 'Command # 1 (DEL …) of pipeline caused error: ("MISCONF …",)'.
_AT_CODE = r"(?:^|caused error: \(['\"])"
_REFUSED = re.compile(_AT_CODE + r"(?:OOM|READONLY|MASTERDOWN|MISCONF|BUSY |TRYAGAIN|CLUSTERDOWN|NOREPLICAS)")
_DENIED = re.compile(_AT_CODE + r"(?:NOAUTH|WRONGPASS|NOPERM)")
# The error for a query that outlived its timeout under ON_TIMEOUT FAIL (newer releases
# prefix the message with a SEARCH_TIMEOUT code).
_SEARCH_TIMEOUT = re.compile(r"Timeout limit was reached|^SEARCH_TIMEOUT\b")


def _translated(exc: BaseException, what: str) -> MemdError | None:
    """Our error for a redis (or redisvl-wrapped redis) exception, or ``None``."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 5:  # redisvl wraps the redis error it hit
        if isinstance(cur, rexc.AuthenticationError):
            return Unauthorized(f"redis refused the credentials during {what}: {cur}")
        if isinstance(cur, rexc.ConnectionError | rexc.TimeoutError | rexc.BusyLoadingError | OSError):
            return BackendUnavailable(f"redis unavailable during {what}: {cur}")
        if isinstance(cur, _REFUSED_FOR_NOW):
            return BackendUnavailable(f"redis refused the command for now during {what}: {cur}")
        if isinstance(cur, rexc.NoPermissionError | rexc.AuthorizationError):
            return Unauthorized(f"redis refused access during {what}: {cur}")
        if isinstance(cur, rexc.ResponseError):
            text = str(cur)
            if _DENIED.search(text):
                return Unauthorized(f"redis refused access during {what}: {cur}")
            if "LOADING" in text or _REFUSED.search(text):
                return BackendUnavailable(f"redis not ready during {what}: {cur}")
            if _SEARCH_TIMEOUT.search(text):
                return BackendUnavailable(f"redis search timed out during {what}: {cur}")
            if text.startswith("Syntax error"):
                return QuerySyntaxError(f"redis could not parse the query during {what}: {cur}")
            return IndexError_(f"redis error during {what}: {cur}")
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return None


def raise_if_lost(exc: rexc.WatchError, what: str) -> None:
    """Raise the outage behind a failed WATCH (``BackendUnavailable``); return for a watched
    key that changed, which the caller's loop tries again at once.

    redis-py raises a ``WatchError`` for both: when the watching connection fails (Redis
    restarted, or still loading its data: ``LOADING`` is a connection error to it), it raises
    one with that error as its context. Taken for a conflict, it would be tried again at once,
    and a write's tries spent within the outage would give it up as conflicting, to the DLQ.
    An outage is waited out and retried, as any other (decision 0072).
    """
    lost = exc.__context__
    if isinstance(lost, rexc.ConnectionError | rexc.TimeoutError | OSError):
        raise BackendUnavailable(f"redis unavailable during {what}: {lost}") from exc


@asynccontextmanager
async def translate_errors(what: str) -> AsyncIterator[None]:
    """Turn redis exceptions into our hierarchy at the point they enter."""
    try:
        yield
    except rexc.WatchError as exc:
        # A watched key changed: the caller's WATCH loop starts its transaction over on a
        # fresh read. Unless the watching connection was lost (``raise_if_lost``).
        raise_if_lost(exc, what)
        raise
    except (rexc.RedisError, RedisVLError, OSError) as exc:
        ours = _translated(exc, what)
        if ours is None:
            raise
        raise ours from exc
