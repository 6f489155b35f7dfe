"""What `up` waits for before it stops: the events its groups have not committed."""

from __future__ import annotations

from consumers.config import ConsumerConfig
from daemon.drain import _drain_said, events_left
from daemon.status import LagReport
from memory.errors import BackendUnavailable


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
    assert events_left(report, ConsumerConfig(group_id="g")) == 9
    assert events_left(LagReport(lag={}, dlq=0, past_end={}), ConsumerConfig(group_id="g")) == 0


async def test_the_drain_says_when_its_events_wait_for_a_reindex_not_for_the_daemon() -> None:
    """With its index refused (an upgrade that changed the analysis), the events cannot be
    applied by waiting: the message says they are lost on stop and how to keep them."""

    async def refused() -> str:
        return "the active index generation 1 was analyzed with text analysis version 2"

    async def usable() -> None:
        return None

    async def blinked() -> str | None:
        raise BackendUnavailable("redis unavailable")

    said = await _drain_said(2, 60.0, refused)
    assert "lost when it stops" in said and "agentmemd reindex" in said and "analysis version 2" in said, said
    for plain in (usable, blinked, None):
        assert (await _drain_said(2, 60.0, plain)).startswith("agentmemd stopping: applying the 2 event(s)")
