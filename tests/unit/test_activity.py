"""When background work yields to ingestion (pure)."""

from __future__ import annotations

import pytest

from memory.activity import IngestActivity, background_wait


@pytest.mark.parametrize(
    ("in_flight", "idle_s", "deferred_s", "wait_s"),
    [
        (0, 10.0, 0.0, 0.0),  # quiet long enough: start now
        (0, 0.5, 0.0, 0.0),  # exactly the quiet time
        (0, 0.2, 0.0, 0.3),  # quiet, but not for long enough yet
        (1, 99.0, 0.0, 0.5),  # a batch in flight: ask again after the quiet time
        (2, 0.0, 4.8, 0.2),  # never past the deferral bound
        (1, 0.0, 5.0, 0.0),  # deferred long enough: start anyway
        (1, 0.0, 7.0, 0.0),
    ],
)
def test_background_work_waits_for_quiet_ingestion_but_not_forever(
    in_flight: int, idle_s: float, deferred_s: float, wait_s: float
) -> None:
    """A job starts once ingestion has been idle quiet_s, or once it has waited max_defer_s."""
    got = background_wait(
        now=100.0, in_flight=in_flight, last_end=100.0 - idle_s, deferred_s=deferred_s, quiet_s=0.5, max_defer_s=5.0
    )
    assert got == pytest.approx(wait_s)


def test_activity_counts_batches_and_notes_when_the_last_ended() -> None:
    """in_flight is up inside a batch (even one that raises); last_end is when it left."""
    now = [10.0]
    activity = IngestActivity(clock=lambda: now[0])
    assert activity.wait_s(deferred_s=0, quiet_s=0.5, max_defer_s=5) == 0.0  # never busy
    with activity.batch():
        assert activity.in_flight == 1
        assert activity.wait_s(deferred_s=0, quiet_s=0.5, max_defer_s=5) == 0.5
        now[0] = 12.0
    assert (activity.in_flight, activity.last_end) == (0, 12.0)
    with pytest.raises(RuntimeError), activity.batch():
        now[0] = 13.0
        raise RuntimeError("batch failed")
    assert (activity.in_flight, activity.last_end) == (0, 13.0)
    now[0] = 13.25
    assert activity.wait_s(deferred_s=0, quiet_s=0.5, max_defer_s=5) == pytest.approx(0.25)
