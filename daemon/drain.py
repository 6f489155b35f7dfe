"""The last events applied before ``up`` stops its embedded broker, which forgets them.

tansu keeps its log in memory: an event the broker accepted and the daemon has not applied
when ``up`` stops is gone at the next start, neither applied nor dead-lettered. So on the
first Ctrl-C (or SIGTERM) ``up`` keeps consuming until its groups have committed every event
of the documents and transcripts topics (every tenant's), for at most ``up_drain_s``; a second
signal ends the wait at once (the daemon's own stop then takes what a stop takes). Apache Kafka
keeps its log, so ``run`` does not wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog
from aiokafka.errors import KafkaError

from consumers.config import INGEST_ROLES, ConsumerConfig
from daemon.settings import Settings
from daemon.status import LagReport, measure_lag
from memory.errors import MemdError

log = structlog.get_logger()

#: How often the lag is read while draining.
POLL_S = 0.5
#: How often a long drain says where it is.
PROGRESS_EVERY_S = 30.0
#: How often a drain whose index was refused asks again whether it still is.
RECHECK_S = 5.0


def events_left(report: LagReport, consumer: ConsumerConfig) -> int:
    """Events of the documents and transcripts topics the daemon's groups have not committed
    (the requests group's lag is questions, which a stop may leave unanswered)."""
    groups = [consumer.group(role) for role in INGEST_ROLES]
    return sum(n for g in groups for n in report.lag.get(g, {}).values())


async def drain_events(
    settings: Settings,
    interrupt: asyncio.Event,
    *,
    refused: Callable[[], Awaitable[str | None]] | None = None,
    busy: Callable[[], bool] | None = None,
) -> int:
    """Wait until the daemon has applied every event the broker holds, ``interrupt`` is set (a
    second signal) or ``settings.up_drain_s`` pass with nothing applied; each lag read is raced
    against both, so neither waits for a broker that does not answer.

    Progress is the lag going down, or ``busy()`` (a batch being applied now: a large document
    in a lane holds its partition's lag for minutes while its chunks are embedded), and every
    progress gives the wait ``up_drain_s`` more, so a bulk load is applied to its end.

    ``refused``: why the daemon cannot use its index (``ChunkIndex.mismatch``), or None when it
    can: events then wait for a reindex, not for the daemon, and the message says so; a batch
    in hand is then no progress (it retries a write that cannot succeed), only the lag going
    down is.

    Returns:
        The events left unapplied (0: none), or -1 when the lag could not be read (or was not
        read: ``up_drain_s`` is 0, or the interrupt or the deadline came first).
    """
    if settings.up_drain_s <= 0:
        return -1
    started = time.monotonic()
    deadline = started + settings.up_drain_s
    told = stuck = False
    said_at = stuck_at = started
    first = left = -1
    while True:
        before = left
        try:
            report = await _before(measure_lag(settings), interrupt, deadline)
        except (KafkaError, TimeoutError, OSError) as exc:
            log.warning("daemon.drain_lag_unread", error=f"{type(exc).__name__}: {exc}")
            print("agentmemd stopping: the broker's lag could not be read; events not yet applied are lost", flush=True)
            return -1
        if report is not None:
            left = events_left(report, settings.consumer)
            if left == 0:
                if told:
                    waited = round(time.monotonic() - started, 1)
                    log.info("daemon.drain_finished", waited_s=waited)
                    print(f"agentmemd stopping: the {first} event(s) are applied ({waited:g} s)", flush=True)
                return 0
            # A batch in hand is progress unless the index is refused: then it is retrying a
            # write that cannot succeed, and would hold the stop for ever. Looked at again now
            # and then: the reindex the message asks for makes it usable.
            if stuck and time.monotonic() - stuck_at >= RECHECK_S:
                stuck_at = time.monotonic()
                stuck = await _refused_still(refused)
            working = busy is not None and busy() and not stuck
            if (0 <= left < before or working) and not interrupt.is_set():
                deadline = time.monotonic() + settings.up_drain_s
        if report is None or interrupt.is_set() or time.monotonic() >= deadline:
            waited = round(time.monotonic() - started, 1)
            log.warning("daemon.drain_cut", events=left, waited_s=waited, interrupted=interrupt.is_set())
            if left > 0:
                said = f"agentmemd stopping with {left} event(s) unapplied: the embedded broker forgets them"
                print(said, flush=True)
            return left
        if not told:
            told, first = True, left
            log.info("daemon.drain_started", events=left, timeout_s=settings.up_drain_s)
            said, stuck = await _drain_said(left, settings.up_drain_s, refused)
            stuck_at = time.monotonic()
            print(said, flush=True)
        elif time.monotonic() - said_at >= PROGRESS_EVERY_S:
            # A large document holds its partition's lag for minutes: say the wait still moves.
            said_at = time.monotonic()
            doing = "a batch being applied" if busy is not None and busy() else "none being applied"
            print(f"agentmemd stopping: {left} event(s) left, {doing} (Ctrl-C again to stop now)", flush=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(interrupt.wait(), timeout=min(POLL_S, max(0.0, deadline - time.monotonic())))


async def _drain_said(
    left: int, wait_s: float, refused: Callable[[], Awaitable[str | None]] | None
) -> tuple[str, bool]:
    """What ``up`` says as its drain starts: that it applies what the broker holds, or, with its
    index refused, that nothing will apply them unless a reindex runs meanwhile; and whether
    the index is refused."""
    why = None
    if refused is not None:
        with contextlib.suppress(MemdError):  # Redis blinked: the plain message then
            why = await refused()
    if why is None:
        return (
            f"agentmemd stopping: applying the {left} event(s) the embedded broker still holds "
            f"(until {wait_s:g} s pass with none applied; Ctrl-C again to stop now and lose them)"
        ), False
    return (
        f"agentmemd stopping: {left} event(s) the embedded broker holds wait for an index this daemon "
        f"cannot use ({why}); they are lost when it stops. To keep them, run `agentmemd reindex` in "
        f"another shell now: this waits for it at most {wait_s:g} s (Ctrl-C again to stop now)"
    ), True


async def _refused_still(refused: Callable[[], Awaitable[str | None]] | None) -> bool:
    """Whether the daemon's index is still refused (Redis blinking: taken as still)."""
    if refused is None:
        return False
    try:
        return await refused() is not None
    except MemdError:
        return True


async def _before(read: Coroutine[Any, Any, LagReport], interrupt: asyncio.Event, deadline: float) -> LagReport | None:
    """``read``'s report, or None when ``interrupt`` is set or ``deadline`` passes first.

    Raises:
        TimeoutError: the read took longer than 10 s (a broker that does not answer).
    """
    task = asyncio.ensure_future(asyncio.wait_for(read, timeout=10.0))
    stop = asyncio.ensure_future(interrupt.wait())
    try:
        done, _ = await asyncio.wait(
            {task, stop}, timeout=max(0.0, deadline - time.monotonic()), return_when=asyncio.FIRST_COMPLETED
        )
        return task.result() if task in done else None
    finally:
        for t in (task, stop):
            t.cancel()
        await asyncio.gather(task, stop, return_exceptions=True)
