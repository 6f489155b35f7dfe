"""The acks of one batch from its report (pure): copies, conflicts and superseded events of
one doc, as each writer hears them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from consumers.acks import build_acks
from consumers.decoding import Decoded
from memory.ingest_report import IngestReport, ItemOutcome
from memory.records import MemoryItem


@dataclass
class Record:
    value: bytes
    headers: list[tuple[str, bytes]]


def batch(*events: tuple[int, str]) -> tuple[dict[Any, Any], list[Decoded]]:
    """Upserts of doc ``d``, as (version, content), at offsets 0, 1, …, each asking for an ack."""
    raw: dict[Any, Any] = {}
    good = []
    for offset, (version, content) in enumerate(events):
        body = {"event_id": f"e{offset}", "op": "upsert", "doc_id": "d", "version": version, "content": content}
        raw[("docs", 0, offset)] = Record(
            json.dumps(body).encode(), [("reply_to", b"replies"), ("correlation_id", f"c{offset}".encode())]
        )
        good.append(Decoded(MemoryItem("upsert", "d", version, content=content), "docs", 0, offset))
    return raw, good


def acked(raw: dict[Any, Any], good: list[Decoded], report: IngestReport) -> list[tuple[str, str | None]]:
    return [(a.status, a.reason) for _, _, _, a in build_acks(raw, good, report, {})]


def test_a_copy_of_the_winner_is_indexed_and_another_content_of_its_version_is_refused() -> None:
    raw, good = batch((5, "A"), (5, "B"), (5, "A"))
    report = IngestReport()
    report.outcomes[id(good[0].item)] = ItemOutcome("indexed", chunks=1, stored_version=5)
    (first, _), (second, why), (third, _) = acked(raw, good, report)
    assert (first, second, third) == ("indexed", "ignored", "indexed")
    assert why is not None and "already written with another content" in why
    assert [a.error_code for *_, a in build_acks(raw, good, report, {})] == [None, "version_conflict", None]


def test_beside_a_winner_that_conflicted_a_copy_says_the_same_and_a_third_content_says_why() -> None:
    raw, good = batch((5, "B"), (5, "B"), (5, "C"))
    report = IngestReport()
    report.outcomes[id(good[0].item)] = ItemOutcome("ignored", stored_version=5, conflict="content")
    said = acked(raw, good, report)
    assert [s for s, _ in said] == ["ignored"] * 3
    assert all("already written with another content" in (r or "") for _, r in said[:2]), said
    assert "judged in its place" in (said[2][1] or "") and "superseded" not in (said[2][1] or "")
    # Each refused, not a retry: an error code says so, for a script to fail on.
    assert [a.error_code for *_, a in build_acks(raw, good, report, {})] == ["version_conflict"] * 3


def test_an_older_version_in_the_batch_is_superseded_by_the_later_one() -> None:
    raw, good = batch((4, "A"), (5, "B"))
    report = IngestReport()
    report.outcomes[id(good[1].item)] = ItemOutcome("indexed", chunks=1, stored_version=5)
    assert acked(raw, good, report)[0] == (
        "ignored",
        "superseded by a later event of the same doc in the same batch (version 5)",
    )


def test_below_a_stored_version_every_event_of_the_batch_says_so() -> None:
    """The doc's highest version of the batch (5) was already below the stored one (7): a copy
    of it, and an older version, are older than what is stored, not superseded by the batch."""
    raw, good = batch((4, "A"), (5, "B"), (5, "B"))
    report = IngestReport()
    report.outcomes[id(good[1].item)] = ItemOutcome("ignored", stored_version=7)
    reasons = [r for _, r in acked(raw, good, report)]
    assert reasons == [
        "version 4 is older than the stored version 7",
        "version 5 is older than the stored version 7",
        "version 5 is older than the stored version 7",
    ]


def test_a_counter_below_a_default_version_is_told_how_to_mend_it() -> None:
    """A writer's own counter (101) below a default version (a delete sent without one: the time
    in microseconds) loses every edit it sends: the reason says why and what to send."""
    stored = 1_796_609_631_947_843
    raw, good = batch((100, "A"), (101, "B"))
    report = IngestReport()
    report.outcomes[id(good[1].item)] = ItemOutcome("ignored", stored_version=stored)
    reasons = [r or "" for _, r in acked(raw, good, report)]
    assert all(f"older than the stored version {stored} (a default version" in r for r in reasons), reasons
    assert all("not both" in r for r in reasons)
    # Counters of one scheme: the reason as before.
    raw, good = batch(
        (6, "A"),
    )
    report = IngestReport()
    report.outcomes[id(good[0].item)] = ItemOutcome("ignored", stored_version=7)
    assert acked(raw, good, report)[0][1] == "version 6 is older than the stored version 7"
