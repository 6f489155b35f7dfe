"""Which neighbours a transcript turn is indexed with (memory.conversation)."""

from __future__ import annotations

import pytest

from memory.conversation import (
    CONTEXT_MARK,
    NEIGHBOUR_CHARS,
    NEXT_TERMS,
    PREV_TERMS,
    PREV_VECTOR,
    VECTOR_CONTEXT_MAX_CHARS,
    TurnRef,
    affected,
    context_of,
    date_words,
    dependents,
    matching_terms,
    parse_turn,
    texts_by_ref,
    vector_text,
    window,
)


@pytest.mark.parametrize(
    ("doc_id", "expected"),
    [
        ("transcript:a/s/12", TurnRef("transcript:a/s/", 12)),
        ("transcript:ops%2Feast/s1/0", TurnRef("transcript:ops%2Feast/s1/", 0)),
        ("transcript:a/s/x", None),
        ("transcript:a12", None),
        ("wiki/a/s/3", None),
        ("community:7", None),
    ],
)
def test_parse_turn(doc_id: str, expected: TurnRef | None) -> None:
    """Only a transcript turn's id names a session position; the doc id round-trips."""
    assert parse_turn(doc_id) == expected
    if expected is not None:
        assert expected.doc_id == doc_id


def test_dependents_are_exactly_the_turns_whose_window_holds_a_turn() -> None:
    """A change re-indexes every turn that reads it, and no other."""
    refs = [TurnRef("transcript:a/s/", n) for n in range(0, 20)]
    for ref in refs:
        readers = {r for r in refs if ref in window(r)}
        assert set(dependents(ref)) & set(refs) == readers
    assert affected([refs[5]]) == {refs[5], *dependents(refs[5])}


def test_context_reads_neighbours_by_turn_number_within_the_session() -> None:
    """Previous turns nearest first, a gap left empty, another session's turn never read."""
    texts = {f"transcript:a/s/{n}": f"turn {n}" for n in range(10) if n != 3}
    texts["transcript:a/other/6"] = "elsewhere"
    ctx = context_of(TurnRef("transcript:a/s/", 5), texts_by_ref(texts))
    assert ctx.prev == ("turn 4", "turn 2")[: PREV_TERMS - 1]
    assert ctx.next == tuple(f"turn {n}" for n in range(6, 6 + NEXT_TERMS))
    assert "elsewhere" not in ctx.stored()
    assert ctx.vector_prefix() == "\n".join(reversed(ctx.prev[:PREV_VECTOR]))


def test_long_neighbours_are_cut_at_a_word() -> None:
    """A previous turn gives its end, a next one its start, each within the bound and never mid-word."""
    long = " ".join(f"w{n}" for n in range(400))
    texts = {"transcript:a/s/1": long, "transcript:a/s/3": long}
    ctx = context_of(TurnRef("transcript:a/s/", 2), texts_by_ref(texts))
    assert len(ctx.prev[0]) <= NEIGHBOUR_CHARS and long.endswith(ctx.prev[0]) and ctx.prev[0].startswith("w")
    assert len(ctx.next[0]) <= NEIGHBOUR_CHARS and long.startswith(ctx.next[0] + " ")


def test_vector_text_keeps_long_chunks_alone() -> None:
    """The vector reads the previous turns before a short chunk, never before one the model would cut."""
    assert vector_text("yes!", "did you go?") == f"did you go?{CONTEXT_MARK}yes!"
    assert vector_text("yes!", "") == "yes!"
    long = "x" * (VECTOR_CONTEXT_MAX_CHARS + 1)
    assert vector_text(long, "did you go?") == long


@pytest.mark.parametrize(
    ("text", "prefix", "expected"),
    [
        (f"a{CONTEXT_MARK}b", "", "a b"),
        (f"a{CONTEXT_MARK}b", "ctx", f"ctx{CONTEXT_MARK}a b"),
        ("b", f"c{CONTEXT_MARK}d", f"c d{CONTEXT_MARK}b"),
    ],
)
def test_only_vector_text_puts_the_context_mark_in(text: str, prefix: str, expected: str) -> None:
    """A mark inside a text or its context is read as a space, so only the one vector_text puts
    between them splits what the model reads from what it pools."""
    assert vector_text(text, prefix) == expected


def test_matching_terms_weigh_the_turns_own_words_first() -> None:
    """Own terms repeated, then the neighbours' once; empty parts add nothing."""
    assert matching_terms("yes", ["pottery class", ""]) == "yes yes yes pottery class"
    assert matching_terms("", ["pottery"]) == "pottery"


@pytest.mark.parametrize(
    ("timestamp", "expected"),
    [(1683554160.0, "Monday 8 May 2023"), (0.0, ""), (-5.0, ""), (1e300, "")],
)
def test_date_words(timestamp: float, expected: str) -> None:
    """The day a turn was said, in words, its weekday too; nothing for a turn without a usable time."""
    assert date_words(timestamp) == expected
