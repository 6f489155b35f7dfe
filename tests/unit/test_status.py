"""Pure helpers of the status sampler."""

from __future__ import annotations

from daemon.status import oldest_age_s


def test_oldest_age_is_never_negative() -> None:
    """An empty queue's age is 0, never a negative from two reads of the clock, and a mark
    stamped by another host's clock may lie in this one's future."""
    assert oldest_age_s([], 1000.0) == 0.0
    assert oldest_age_s([1000.5], 1000.0) == 0.0
    assert oldest_age_s([990.0, 995.0], 1000.0) == 10.0
