"""Pure helpers of the status sampler."""

from __future__ import annotations

from daemon.status import StatusState, oldest_age_s


def test_oldest_age_is_never_negative() -> None:
    """An empty queue's age is 0, never a negative from two reads of the clock, and a mark
    stamped by another host's clock may lie in this one's future."""
    assert oldest_age_s([], 1000.0) == 0.0
    assert oldest_age_s([1000.5], 1000.0) == 0.0
    assert oldest_age_s([990.0, 995.0], 1000.0) == 10.0


def test_an_askers_bad_or_expired_request_is_refused_not_an_error_of_the_daemons() -> None:

    state = StatusState(started_at=0.0)
    for outcome in ("ok", "invalid", "expired", "error", "invalid"):
        state.record_query(0.01, outcome)
    assert (len(state.query_ms), state.query_errors, state.query_refused) == (5, 1, 3)


def test_the_status_page_says_why_a_stale_summary_is_not_written() -> None:
    """A failing summarizer shows on the page, with the reason, not only as a growing queue."""
    import time

    from daemon.http import render_status
    from graph.stale_queue import StaleItem

    now = time.time()
    failing = StaleItem("c1", 0, now - 60, now - 30, 2, ["runbooks/a.md"], attempts=3, last_error="LlmFailed: 500")
    state = StatusState(started_at=0.0, ready=True)
    state.stale = {"acme": {"depth": 1, "oldest_age_s": 60.0, "items": [failing]}}
    page = render_status(state, title="agentmemd")
    assert "<th>summary</th>" in page and "failed 3x: LlmFailed: 500" in page
    # The queue is a sample, which the page dates: the explorer, read live, may differ.
    assert "not sampled yet" in page
    state.depth_history.append((now - 3.2, 1))
    assert "as of 3 s ago" in render_status(state, title="agentmemd")


def test_the_lag_table_says_which_partition_a_lane_is_applying() -> None:
    """A partition whose lag stands still while its large batch is applied beside the poll is
    said to be in a lane, so an operator does not take it for a stuck consumer."""
    from daemon.http import render_status

    state = StatusState(started_at=0.0, ready=True)
    state.lag = {"agentmemd.documents": {"memory.documents/0": 1, "memory.documents/1": 0}}
    state.lanes = lambda: {"memory.documents/0": "applying 1 record(s), 512 KiB, for 30 s"}
    page = render_status(state, title="agentmemd")
    assert "<th>in a lane</th>" in page
    rows = [r for r in page.split("<tr>") if "memory.documents/" in r]
    assert "applying 1 record(s), 512 KiB, for 30 s" in rows[0] and "applying" not in rows[1]
