"""A dead letter's mark of having been sent again matches that letter only (pure)."""

from __future__ import annotations

import dataclasses

from daemon.dlq_marks import ReplayMark, letter_id, mark_of
from daemon.explore.dlq import DeadLetter

LETTER = DeadLetter(
    partition=1,
    offset=42,
    tenant="default",
    reason="content larger than 1024 bytes",
    code="invalid_event",
    topic="memory.documents",
    original_partition=0,
    original_offset=7,
    failed_at="2026-11-29T18:04:00+00:00",
    attempts=1,
    size=2048,
    preview="{...}",
    preview_kind="text",
    cut=False,
)


def test_a_mark_names_the_letter_at_its_place() -> None:
    mark = ReplayMark(at=1.0, to="memory.documents", said="indexed", letter=letter_id(LETTER))
    marks = {"memory.dlq:1:42": mark}
    assert mark_of(LETTER, "memory.dlq", marks) == mark
    # Another DLQ topic, or another place in it: not this letter's mark.
    assert mark_of(LETTER, "other.dlq", marks) is None
    assert mark_of(dataclasses.replace(LETTER, offset=43), "memory.dlq", marks) is None


def test_a_letter_at_a_reused_place_is_not_marked() -> None:
    """A DLQ topic created anew (the embedded broker forgets its topics when it restarts)
    reuses places: a mark left from before matches no new letter there."""
    mark = ReplayMark(at=1.0, to="memory.documents", said="indexed", letter=letter_id(LETTER))
    marks = {"memory.dlq:1:42": mark}
    newer = dataclasses.replace(LETTER, failed_at="2026-12-01T09:00:00+00:00")
    assert mark_of(newer, "memory.dlq", marks) is None
    elsewhere = dataclasses.replace(LETTER, topic="memory.transcripts")
    assert mark_of(elsewhere, "memory.dlq", marks) is None
