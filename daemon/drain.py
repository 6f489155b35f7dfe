"""The last events applied before ``up`` stops its embedded broker, which forgets them.

tansu keeps its log in memory: an event the broker accepted and the daemon had not yet applied
when ``up`` stopped was gone at the next start, neither applied nor dead-lettered. So on the
first Ctrl-C (or SIGTERM) ``up`` keeps consuming until its groups have committed every event
of the documents and transcripts topics (every tenant's), for at most ``up_drain_s``; a second
signal stops at once. Apache Kafka keeps its log, so ``run`` does not wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog
from aiokafka.errors import KafkaError

from daemon.settings import Settings
from daemon.status import LagReport, measure_lag

log = structlog.get_logger(__name__)

#: How often the lag is read while draining.
POLL_S = 0.5


def events_left(report: LagReport, group_id: str) -> int:
    """Events of the documents and transcripts topics the daemon's groups have not committed
    (the requests group's lag is questions, which a stop may leave unanswered)."""
    groups = (f"{group_id}.documents", f"{group_id}.transcripts")
    return sum(n for g in groups for n in report.lag.get(g, {}).values())


async def drain_events(settings: Settings, interrupt: asyncio.Event) -> int:
    """Wait until the daemon has applied every event the broker holds, ``interrupt`` is set (a
    second signal) or ``settings.up_drain_s`` pass.

    Returns:
        The events left unapplied (0: none), or -1 when the lag could not be read.
    """
    deadline = time.monotonic() + settings.up_drain_s
    told = False
    while True:
        try:
            report = await asyncio.wait_for(measure_lag(settings), timeout=10.0)
        except (KafkaError, TimeoutError, OSError) as exc:
            log.warning("daemon.drain_lag_unread", error=f"{type(exc).__name__}: {exc}")
            return -1
        left = events_left(report, settings.consumer.group_id)
        if left == 0:
            if told:
                log.info("daemon.drain_finished")
            return 0
        if interrupt.is_set() or time.monotonic() >= deadline:
            log.warning("daemon.drain_cut", events=left, waited_s=settings.up_drain_s, interrupted=interrupt.is_set())
            print(f"agentmemd stopping with {left} event(s) unapplied: the embedded broker forgets them", flush=True)
            return left
        if not told:
            told = True
            log.info("daemon.drain_started", events=left, timeout_s=settings.up_drain_s)
            print(
                f"agentmemd stopping: applying the {left} event(s) the embedded broker still holds "
                f"(at most {settings.up_drain_s:g} s; Ctrl-C again to stop now and lose them)",
                flush=True,
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(interrupt.wait(), timeout=POLL_S)
