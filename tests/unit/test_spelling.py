"""Names a user nearly spelt (consumers.events): the fields a misspelling refusal names, and the
names a hint may guess."""

from __future__ import annotations

import pytest

from consumers.spelling import near_name, near_spelling, slips


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ("s-tests", "s-tests", 0),
        ("s-tset", "s-test", 1),
        ("s-tset", "s-tests", 2),
        ("abc", "", 3),
        ("ca", "abc", 3),
        ("kitten", "sitting", 3),
    ],
)
def test_slips_count_inserts_deletes_replacements_and_swaps(a: str, b: str, want: int) -> None:
    """Each insert, delete, replacement or swap of two neighbours is one slip."""
    assert slips(a, b) == want == slips(b, a)


@pytest.mark.parametrize(
    ("word", "among", "want"),
    [
        ("metdata", ["metadata", "source"], "metadata"),
        ("s-tset", ["s-tests", "s-deploy"], "s-tests"),
        ("s-deplyo", ["s-tests", "s-deploy"], "s-deploy"),
        ("stagnig-db", ["staging-db", "prod-db"], "staging-db"),
        ("s-1", ["s-2"], None),
        ("abcd", ["wxyz"], None),
        ("billing", [], None),
    ],
)
def test_a_name_is_taken_for_the_one_it_nearly_spells(word: str, among: list[str], want: str | None) -> None:
    """The most alike name by ratio, else the one fewest slips away; short names are never guessed."""
    assert near_name(word, among) == want


def test_a_field_is_refused_as_a_misspelling_by_ratio_alone() -> None:
    """A producer's own field one slip from a missing one (``rule`` beside ``role``) is read
    past, as before: only a hint guesses by slips."""
    assert near_spelling("rule", ["role"]) is None and near_name("rule", ["role"]) == "role"


@pytest.mark.parametrize(
    ("a", "b", "limit", "want"),
    [
        ("kitten", "sitting", 2, 3),
        ("kitten", "sitting", 3, 3),
        ("s-tset", "s-tests", 2, 2),
        ("a" * 500, "b" * 500, 2, 3),
    ],
)
def test_slips_past_a_limit_count_as_one_more(a: str, b: str, limit: int, want: int) -> None:
    """With a limit, a distance beyond it reads ``limit + 1``, and one within it exactly."""
    assert slips(a, b, limit) == want
