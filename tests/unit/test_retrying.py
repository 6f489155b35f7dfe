"""How backend calls are retried: the backoff's doubling and cap, and what the log says."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from memory.config import IngestConfig
from memory.errors import BackendUnavailable, Unauthorized, WritesHeld
from memory.retrying import backoff_s, retry_while_unavailable, worth_logging

CFG = IngestConfig(retry_initial_s=0.2, retry_max_s=5.0)


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [
        (0, 0.2),  # never asked for, but no shorter than the first wait
        (1, 0.2),
        (2, 0.4),
        (3, 0.8),
        (5, 3.2),
        (6, 5.0),  # 6.4, capped
        (7, 5.0),
        (10_000, 5.0),  # no overflow however long the outage
    ],
)
def test_backoff_doubles_up_to_its_cap(attempt: int, expected: float) -> None:
    """The wait after each failed try starts at retry_initial_s, doubles, and stops at retry_max_s."""
    assert backoff_s(attempt, CFG) == pytest.approx(expected)


async def test_an_outage_is_retried_with_growing_waits_until_it_ends() -> None:
    """A try that meets an outage is logged as a warning with the wait that follows (tries
    1, 2 and 4 of one error), the waits grow as the backoff says, and the call's result comes back once it works."""
    cfg = IngestConfig(retry_initial_s=0.001, retry_max_s=0.004)
    tries = 0

    async def flaky() -> str:
        nonlocal tries
        tries += 1
        if tries <= 4:
            raise BackendUnavailable("redis unavailable (test)")
        return "done"

    with capture_logs() as logs:
        got = await retry_while_unavailable("chunk write", flaky, stopping=asyncio.Event(), cfg=cfg)
    assert got == "done" and tries == 5
    retried = [e for e in logs if e["event"] == "ingest.backend_retried"]
    assert [e["delay_s"] for e in retried] == [0.001, 0.002, 0.004]  # the third try is not logged
    assert {e["log_level"] for e in retried} == {"warning"}
    assert [e["attempt"] for e in retried] == [1, 2, 4]


async def test_a_refusal_is_waited_out_loudly() -> None:
    """Redis refusing the credentials is retried too, but logged as an error: an operator must act."""
    cfg = IngestConfig(retry_initial_s=0.001, retry_max_s=0.001)
    tries = 0

    async def refused() -> int:
        nonlocal tries
        tries += 1
        if tries == 1:
            raise Unauthorized("redis refused the credentials (test)")
        return 7

    with capture_logs() as logs:
        assert await retry_while_unavailable("vector lookup", refused, stopping=asyncio.Event(), cfg=cfg) == 7
    assert [(e["event"], e["log_level"]) for e in logs] == [("ingest.backend_retried", "error")]


async def test_a_stopping_daemon_gives_up_and_a_hold_passes_through() -> None:
    """Once stopping, an outage is raised instead of waited out; ``WritesHeld`` is never retried here."""
    stopping = asyncio.Event()
    stopping.set()

    async def down() -> None:
        raise BackendUnavailable("redis unavailable (test)")

    with pytest.raises(BackendUnavailable):
        await retry_while_unavailable("chunk write", down, stopping=stopping, cfg=CFG)

    calls = 0

    async def held() -> None:
        nonlocal calls
        calls += 1
        raise WritesHeld("a reindex holds turn writes (test)")

    with pytest.raises(WritesHeld):
        await retry_while_unavailable("chunk write", held, stopping=asyncio.Event(), cfg=CFG)
    assert calls == 1


def test_a_long_outage_is_logged_sparsely_and_a_new_error_at_once() -> None:
    """The same error is logged on tries 1, 2, 4, …, 32, then every 60th; another error at once."""
    same = [n for n in range(1, 241) if worth_logging(n, "BackendUnavailable", "BackendUnavailable")]
    assert same == [1, 2, 4, 8, 16, 32, 60, 120, 180, 240]
    assert worth_logging(7, "Unauthorized", "BackendUnavailable")
    assert worth_logging(1, "BackendUnavailable", None)


async def test_a_retry_loop_logs_the_tries_worth_logging_and_each_change_of_error() -> None:
    """Ten tries of one kind of error, its message changing, are logged on tries 1, 2, 4 and 8
    (each with its own message); another kind that follows is logged on its first try."""
    cfg = IngestConfig(retry_initial_s=0.0001, retry_max_s=0.0001)
    tries = 0

    async def down() -> str:
        nonlocal tries
        tries += 1
        if tries <= 10:
            raise BackendUnavailable(f"redis unavailable (try {tries})")
        if tries == 11:
            raise Unauthorized("redis refused the credentials (test)")
        return "done"

    with capture_logs() as logs:
        assert await retry_while_unavailable("chunk write", down, stopping=asyncio.Event(), cfg=cfg) == "done"
    retried = [(e["attempt"], e["error"]) for e in logs if e["event"] == "ingest.backend_retried"]
    expected = [(n, f"redis unavailable (try {n})") for n in (1, 2, 4, 8)]
    assert retried == [*expected, (11, "redis refused the credentials (test)")]
