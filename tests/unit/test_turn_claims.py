"""Claimed turns: written only while the turn holds nothing else, judged in batch order (pure)."""

from __future__ import annotations

from memory.records import MemoryItem
from memory.turn_claims import claimed, claims_apart

DOC = "transcript:a/s/3"


def turn(content: str, *, claim: bool = True, doc_id: str = DOC, op: str = "upsert") -> MemoryItem:
    meta = {"role": "assistant", "turn": 3, "agent_id": "a", "session_id": "s"}
    return MemoryItem(
        op=op,  # type: ignore[arg-type]
        doc_id=doc_id,
        version=None,
        kind="transcript",
        content=content,
        metadata=meta,
        if_absent=claim,
    )


def held(content: str) -> tuple[str, dict[str, object]]:
    return content, {"role": "assistant", "turn": 3, "agent_id": "a", "session_id": "s"}


def test_the_first_claim_of_an_empty_turn_wins_and_a_second_is_refused() -> None:
    a, b = turn("A"), turn("B")
    kept, refused, _ = claims_apart([a, b], {})
    assert kept == [a] and [i for i, _ in refused] == [b]
    assert "turn 3 of this session holds another turn" in refused[0][1]


def test_a_claim_of_what_the_turn_holds_changes_nothing() -> None:
    """A redelivery, or a writer's retry: neither refused nor written again (written, the turn
    would take the retry's time). One in the same batch as the claim it repeats is that
    claim's: it gets its outcome."""
    a = turn("A")
    assert claims_apart([a], {("default", DOC): held("A")}) == ([], [], [(a, None)])
    again = turn("A")
    assert claims_apart([a, again], {}) == ([a], [], [(again, a)])


def test_a_stored_turn_refuses_a_claim_and_a_delete_before_it_frees_the_turn() -> None:
    a = turn("A")
    assert claims_apart([a], {("default", DOC): held("B")}) == (
        [],
        [(a, claims_apart([a], {(a.tenant, DOC): held("B")})[1][0][1])],
        [],
    )
    gone = turn("", op="delete", claim=False)
    assert claims_apart([gone, a], {("default", DOC): held("B")}) == ([gone, a], [], [])


def test_a_write_without_a_claim_is_never_refused_and_counts_for_a_claim_after_it() -> None:
    plain, a = turn("X", claim=False), turn("A")
    kept, refused, _ = claims_apart([plain, a], {})
    assert kept == [plain] and [i for i, _ in refused] == [a]
    assert claims_apart([a, plain], {}) == ([a, plain], [], [])


def test_other_turns_are_left_alone() -> None:
    other = turn("Z", claim=False, doc_id="transcript:a/s/4")
    a = turn("A")
    assert claims_apart([other, a], {}) == ([other, a], [], [])
    assert claimed([other, a, turn("B")]) == [("default", DOC)]


def test_a_turn_holding_the_start_of_a_claims_text_refuses_it() -> None:
    """A turn is written whole, in one transaction: one holding the start of a claim's text
    (a full stop less, a space less) holds another turn, and the claim is refused."""
    a = turn("The build failed today.")
    for stored in ("The build failed today", "The build failed today. "[:-1] + " "):
        kept, refused, _ = claims_apart([a], {("default", DOC): held(stored)})
        assert kept == [] and [i for i, _ in refused] == [a], stored


def test_a_claim_of_what_another_index_holds_is_written() -> None:
    """A reindex judges a claim by the old generation where the new one lacks the turn: a claim
    of what the old one holds is written into the new one, not skipped as unchanged."""
    a = turn("A")
    old = {("default", DOC): held("A")}
    assert claims_apart([a], old, elsewhere={("default", DOC)}) == ([a], [], [])
    assert claims_apart([a], old) == ([], [], [(a, None)])
    again = turn("A")
    assert claims_apart([a, again], old, elsewhere={("default", DOC)}) == ([a], [], [(again, a)])
