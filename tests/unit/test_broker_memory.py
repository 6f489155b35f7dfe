"""When `up` warns that the embedded broker's memory has grown: at 512 MiB and each doubling."""

from __future__ import annotations

from daemon.broker_memory import crossed

MIB = 1024 * 1024


def test_a_warning_at_the_first_size_and_at_each_doubling_once() -> None:
    assert crossed(100 * MIB, 0) is None
    assert crossed(512 * MIB, 0) == 512 * MIB
    assert crossed(900 * MIB, 512 * MIB) is None  # already told
    assert crossed(1024 * MIB, 512 * MIB) == 1024 * MIB
    assert crossed(5000 * MIB, 1024 * MIB) == 4096 * MIB  # a jump past several: the largest, once
    assert crossed(5000 * MIB, 4096 * MIB) is None


def test_the_watch_exports_the_brokers_memory_and_zero_once_it_is_gone() -> None:
    """A real process watched as the broker would be: its resident memory reaches /metrics at
    once, and 0 once it is gone."""
    import subprocess
    import sys
    import time

    from daemon.broker_memory import BrokerMemoryWatch
    from memory.metrics import EMBEDDED_BROKER_RSS

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    watch = BrokerMemoryWatch(proc.pid, every_s=0.05)
    try:
        watch.start()
        deadline = time.monotonic() + 10
        while EMBEDDED_BROKER_RSS._value.get() <= 1 * MIB and time.monotonic() < deadline:
            time.sleep(0.05)
        assert EMBEDDED_BROKER_RSS._value.get() > 1 * MIB
        proc.kill()
        proc.wait()
        while watch.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not watch.running and EMBEDDED_BROKER_RSS._value.get() == 0
    finally:
        proc.kill()
        watch.stop()
