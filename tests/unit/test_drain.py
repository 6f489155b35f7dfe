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

    said, stuck = await _drain_said(2, 60.0, refused)
    assert "lost when it stops" in said and "agentmemd reindex" in said and "analysis version 2" in said, said
    assert stuck
    for plain in (usable, blinked, None):
        said, stuck = await _drain_said(2, 60.0, plain)
        assert said.startswith("agentmemd stopping: applying the 2 event(s)") and not stuck


async def test_the_drain_goes_on_while_events_are_applied_and_ends_once_none_are(monkeypatch) -> None:
    """The wait is `up_drain_s` without progress, not in all: a lag that keeps going down, or a
    batch being applied (a large document in a lane keeps its lag at 1), extends it; a lag that
    stays put with nothing applied ends it after `up_drain_s`."""
    import asyncio

    import daemon.drain as drain
    from daemon.settings import Settings

    monkeypatch.setattr(drain, "POLL_S", 0.01)
    settings = Settings(up_drain_s=0.05)

    def reads(lags: list[int]) -> object:
        it = iter(lags)

        async def measure(_: object) -> LagReport:
            return LagReport(lag={"agentmemd.documents": {"memory.documents/0": next(it)}}, dlq=0, past_end={})

        return measure

    # Down by one every read, for far longer than up_drain_s: applied to the end.
    monkeypatch.setattr(drain, "measure_lag", reads(list(range(40, -1, -1))))
    assert await drain.drain_events(settings, asyncio.Event()) == 0
    # Stuck at 1 while a batch is applied, then done: the busy batch counts as progress.
    state = {"reads": 0}

    async def lane(_: object) -> LagReport:
        state["reads"] += 1
        left = 1 if state["reads"] < 30 else 0
        return LagReport(lag={"agentmemd.documents": {"memory.documents/0": left}}, dlq=0, past_end={})

    monkeypatch.setattr(drain, "measure_lag", lane)
    assert await drain.drain_events(settings, asyncio.Event(), busy=lambda: True) == 0
    # Stuck at 1 with nothing being applied: cut after up_drain_s, saying how many are left.
    state["reads"] = 0
    assert await drain.drain_events(settings, asyncio.Event(), busy=lambda: False) == 1
    assert state["reads"] < 30
    # A batch in hand while the index is refused retries a write that cannot succeed: no
    # progress, cut after up_drain_s (it held `up`'s stop for minutes).

    async def refused() -> str:
        return "the active index generation 2 was built with chunking 128/32"

    state["reads"] = 0
    assert await drain.drain_events(settings, asyncio.Event(), refused=refused, busy=lambda: True) == 1
    assert state["reads"] < 30
    # Until the reindex the message asks for makes the index usable: the batch then counts again.
    monkeypatch.setattr(drain, "RECHECK_S", 0.0)
    asked = {"n": 0}

    async def reindexed() -> str | None:
        asked["n"] += 1
        return "built with chunking 128/32" if asked["n"] < 3 else None

    state["reads"] = 0
    assert await drain.drain_events(settings, asyncio.Event(), refused=reindexed, busy=lambda: True) == 0
