"""The embedded broker's memory, watched while `agentmemd up` or `servers` runs.

tansu, as packaged, keeps every record in memory with no retention and cannot delete any: it
grows with every event, question and reply until it restarts. Nothing in the daemon can bound
that, so an operator is told when it crosses 512 MiB, and again at each doubling.
"""

from __future__ import annotations

import threading

import psutil
import structlog

from memory.metrics import EMBEDDED_BROKER_RSS

log = structlog.get_logger()

#: The first size warned about; each warning after it doubles.
WARN_FROM_BYTES = 512 * 1024 * 1024
#: How often the broker's resident memory is read.
CHECK_EVERY_S = 60.0


def crossed(rss: int, warned: int, warn_from: int = WARN_FROM_BYTES) -> int | None:
    """The largest of ``warn_from`` and its doublings that ``rss`` reached, if above ``warned``
    (the last one warned about, 0 for none); otherwise ``None``."""
    if rss < warn_from:
        return None
    level = warn_from
    while level * 2 <= rss:
        level *= 2
    return level if level > warned else None


class BrokerMemoryWatch:
    """A thread that reads the broker's resident memory every ``every_s`` seconds and logs
    ``launcher.broker_memory_grew`` as it crosses ``warn_from`` and each doubling of it."""

    def __init__(self, pid: int, *, warn_from: int = WARN_FROM_BYTES, every_s: float = CHECK_EVERY_S) -> None:
        self._pid = pid
        self._warn_from = warn_from
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-memory", daemon=True)

    def start(self) -> None:
        """Start sampling the broker's memory in a background thread."""
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the sampling thread is alive."""
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop sampling (waits up to 5 s for the thread)."""
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        warned = 0
        try:
            proc = psutil.Process(self._pid)
            EMBEDDED_BROKER_RSS.set(int(proc.memory_info().rss))
            while not self._stop.wait(self._every_s):
                rss = int(proc.memory_info().rss)
                EMBEDDED_BROKER_RSS.set(rss)  # the trend, for a dashboard; the log says when to act
                level = crossed(rss, warned, self._warn_from)
                if level is None:
                    continue
                warned = level
                log.warning(
                    "launcher.broker_memory_grew",
                    rss_mib=rss // (1024 * 1024),
                    why="the embedded broker keeps every event and reply in memory, with no retention",
                    fix="restart `agentmemd up` to release it (it forgets unconsumed events and the dead letters), "
                    "or run Apache Kafka and `agentmemd run` for long runs",
                )
        except psutil.Error:  # the broker is gone: stopping, or its own failure, which is reported elsewhere
            EMBEDDED_BROKER_RSS.set(0)
            return
