"""Pure helpers of the status sampler."""

from __future__ import annotations

from daemon.status import oldest_age_s


def test_oldest_age_is_never_negative() -> None:
    """An empty queue's age is 0, never a negative from two reads of the clock, and a mark
    stamped by another host's clock may lie in this one's future."""
    assert oldest_age_s([], 1000.0) == 0.0
    assert oldest_age_s([1000.5], 1000.0) == 0.0
    assert oldest_age_s([990.0, 995.0], 1000.0) == 10.0


def test_an_askers_bad_or_expired_request_is_refused_not_an_error_of_the_daemons() -> None:
    from daemon.status import StatusState

    state = StatusState(started_at=0.0)
    for outcome in ("ok", "invalid", "expired", "error", "invalid"):
        state.record_query(0.01, outcome)
    assert (len(state.query_ms), state.query_errors, state.query_refused) == (5, 1, 3)
