"""What `up` waits for before it stops: the events its groups have not committed."""

from __future__ import annotations

from daemon.drain import events_left
from daemon.status import LagReport


def test_events_left_counts_documents_and_transcripts_of_every_tenant_not_questions() -> None:
    report = LagReport(
        lag={
            "g.documents": {"memory.documents/0": 3, "memory.documents.acme/1": 2},
            "g.transcripts": {"memory.transcripts/0": 4},
            "g.requests": {"memory.requests/0": 9},
            "other.documents": {"memory.documents/0": 100},
        },
        dlq=7,
        past_end={},
    )
    assert events_left(report, "g") == 9
    assert events_left(LagReport(lag={}, dlq=0, past_end={}), "g") == 0
