"""`up` tells the operator when the embedded broker's memory grows (tansu keeps every record)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from daemon.broker_memory import BrokerMemoryWatch
from daemon.launcher import free_port, start_tansu

pytestmark = pytest.mark.integration


def test_the_broker_memory_watch_warns_once_per_doubling_and_ends_with_the_broker(tmp_path: Path) -> None:
    broker = start_tansu(f"127.0.0.1:{free_port()}", log_dir=tmp_path)
    watch = BrokerMemoryWatch(broker.proc.pid, warn_from=1024 * 1024, every_s=0.05)
    try:
        with capture_logs() as logs:
            watch.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not logs:
                time.sleep(0.05)
            time.sleep(0.3)  # more reads of the same size: no second warning
        warned = [e for e in logs if e["event"] == "launcher.broker_memory_grew"]
        assert len(warned) == 1 and warned[0]["log_level"] == "warning", logs
        assert warned[0]["rss_mib"] >= 1 and "Apache Kafka" in warned[0]["fix"]
    finally:
        broker.stop()
    deadline = time.monotonic() + 5  # the broker gone: the thread ends on its own, unasked
    while watch.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not watch.running
    watch.stop()
