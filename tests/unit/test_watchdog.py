"""The one watchdog thread (``memory.watchdog``): due calls run, disarmed ones never do."""

from __future__ import annotations

import threading
import time

from memory.watchdog import Watchdog


def test_a_call_runs_at_its_deadline_and_a_disarmed_one_never() -> None:
    dog = Watchdog("test")
    fired: list[str] = []
    done = threading.Event()
    kept = dog.arm(0.4, lambda: (fired.append("kept"), done.set()))
    dropped = dog.arm(0.2, fired.append, "dropped")
    dog.disarm(dropped)
    assert done.wait(5)
    time.sleep(0.05)
    assert fired == ["kept"]
    dog.disarm(kept)  # already ran: a no-op
    assert dog.pending() == 0


def test_a_sooner_deadline_armed_later_wakes_the_thread() -> None:
    dog = Watchdog("test")
    done = threading.Event()
    late = dog.arm(60.0, done.set)
    time.sleep(0.2)  # the thread is now asleep until the minute is up
    t0 = time.monotonic()
    dog.arm(0.05, done.set)
    assert done.wait(5)
    assert time.monotonic() - t0 < 30  # woken for the sooner one, not at the minute
    dog.disarm(late)


def test_a_failing_call_does_not_stop_the_next() -> None:
    dog = Watchdog("test")
    done = threading.Event()

    def boom() -> None:
        raise RuntimeError("boom")

    dog.arm(0.01, boom)
    dog.arm(0.05, done.set)
    assert done.wait(5)


def test_disarmed_calls_do_not_pile_up() -> None:
    dog = Watchdog("test")
    for _ in range(10_000):
        dog.disarm(dog.arm(120.0, print))
    assert dog.pending() == 0
    assert len(dog._heap) <= 64 + 1
