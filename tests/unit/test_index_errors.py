"""Which Redis errors are outages (back off, commit nothing) and which are our fault."""

from __future__ import annotations

import pytest
import redis.exceptions as rexc
from redis._parsers import BaseParser

from memory.errors import BackendUnavailable, Unauthorized
from memory.index import IndexError_, QuerySyntaxError, _translated, translate_errors


@pytest.mark.parametrize(
    "exc",
    [
        rexc.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        rexc.ReadOnlyError("You can't write against a read only replica."),
        rexc.ResponseError("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist"),
        rexc.ResponseError("BUSY Redis is busy running a script."),
        rexc.TryAgainError("Multiple keys request during rehashing of slot"),
        rexc.ClusterDownError("The cluster is down"),
        rexc.BusyLoadingError("Redis is loading the dataset in memory"),
        rexc.ConnectionError("Connection refused"),
        rexc.ResponseError("Timeout limit was reached"),  # a search under ON_TIMEOUT FAIL
    ],
)
def test_refusals_that_pass_are_outages(exc: Exception) -> None:
    """Memory full, a read-only replica, a failed snapshot: ingestion must wait, not dead-letter."""
    assert isinstance(_translated(exc, "chunk write"), BackendUnavailable)


def test_refusal_inside_a_transaction_is_found() -> None:
    """redis-py rewrites a pipeline's error message; the code is still read (MISCONF here)."""
    text = (
        "Command # 1 (DEL rvmis:g1:doc:default:doc-1) of pipeline caused error: "
        '("MISCONF Redis is configured to save RDB snapshots, but it\'s currently unable to persist",)'
    )
    assert isinstance(_translated(rexc.ResponseError(text), "chunk write"), BackendUnavailable)


def test_errors_as_redis_py_parses_them_off_the_wire() -> None:
    """The parser strips some codes into classes (NOPERM -> NoPermissionError): classes count too."""
    for wire, kind in [
        ("NOPERM User agentmem has no permissions to run the 'ft.search' command", Unauthorized),
        ("OOM command not allowed when used memory > 'maxmemory'.", BackendUnavailable),
        ("READONLY You can't write against a read only replica.", BackendUnavailable),
        ("MISCONF Redis is configured to save RDB snapshots", BackendUnavailable),
        ("Syntax error at offset 3", IndexError_),
    ]:
        assert isinstance(_translated(BaseParser.parse_error(wire), "x"), kind), wire


def test_wrapped_refusal_is_found() -> None:
    """redisvl wraps the redis error it hit; the cause decides."""
    try:
        try:
            raise rexc.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
        except rexc.RedisError as inner:
            raise RuntimeError("redisvl: failed to load") from inner
    except RuntimeError as outer:
        assert isinstance(_translated(outer, "index creation"), BackendUnavailable)


def test_bad_commands_and_credentials_are_not_outages() -> None:
    """A syntax error is ours to fix; retrying it forever would block the partition."""
    assert isinstance(_translated(rexc.ResponseError("Syntax error at offset 3"), "text search"), QuerySyntaxError)
    assert isinstance(_translated(rexc.ResponseError("NOPERM this user has no permissions"), "x"), Unauthorized)
    assert _translated(ValueError("not redis"), "x") is None


async def test_a_watch_error_reaches_its_watch_loop_untranslated_unless_its_connection_was_lost() -> None:
    """A WatchError of a watched key that changed passes ``translate_errors`` as it is (the
    caller's WATCH loop retries); one raised as the watching connection dropped (its context a
    ConnectionError: Redis restarted, or loading) is an outage, not a conflict to retry at once."""

    async def dropped_while_watching() -> None:
        try:
            raise rexc.ConnectionError("Connection reset by peer")
        except rexc.ConnectionError:
            raise rexc.WatchError("A ConnectionError occurred on while watching one or more keys") from None

    async def changed() -> None:
        raise rexc.WatchError("Watched variable changed.")

    with pytest.raises(rexc.WatchError):
        async with translate_errors("chunk write"):
            await changed()
    with pytest.raises(BackendUnavailable, match="redis unavailable during chunk write: Connection reset"):
        async with translate_errors("chunk write"):
            await dropped_while_watching()
