"""Expired requests are told to the operator once a minute, with how many expired since."""

from __future__ import annotations

import types

from structlog.testing import capture_logs

from consumers.expiry import ExpiryLog, expired_error


def test_a_backlog_of_expired_requests_warns_once_per_period_with_its_count() -> None:
    record = types.SimpleNamespace(topic="memory.requests", partition=0, offset=7)
    expiries = ExpiryLog(every_s=3600)
    with capture_logs() as logs:
        for _ in range(500):
            expiries.seen(record, 90_000)
    assert [(e["event"], e["log_level"], e["expired"]) for e in logs] == [("query.request_expired", "warning", 1)]
    expiries = ExpiryLog(every_s=0)
    with capture_logs() as logs:
        expiries.seen(record, 90_000)
        expiries.seen(record, 90_000)
    assert [e["expired"] for e in logs] == [1, 1]


def test_the_expired_error_names_both_causes() -> None:
    err = expired_error(75_400, 60_000)
    assert err.code == "expired" and "75 s old" in str(err) and "(60 s)" in str(err)
    assert "given up" in str(err) and "time sync" in str(err)
