"""Embedding groups of an ingest batch (pure)."""

from __future__ import annotations

import pytest

from memory.batch_plan import embedding_groups


@pytest.mark.parametrize(
    ("sizes", "target", "groups"),
    [
        ([], 4, []),
        ([3], 4, [[0]]),
        ([1, 1, 1, 1], 4, [[0, 1, 2, 3]]),
        ([2, 2, 2, 2, 2], 4, [[0, 1], [2, 3], [4]]),
        ([5, 1, 1], 4, [[0], [1, 2]]),  # a doc is never split, even when larger than a group
        ([0, 0, 4, 0], 4, [[0, 1, 2], [3]]),  # deletes ride along with their neighbours
        ([1, 2, 3], 1, [[0], [1], [2]]),
        ([1, 2, 3], 0, [[0], [1], [2]]),  # a target below 1 means one doc per group
        ([2, 2, 2], 100, [[0, 1, 2]]),
    ],
)
def test_groups_are_consecutive_whole_docs_of_about_target_chunks(
    sizes: list[int], target: int, groups: list[list[int]]
) -> None:
    """Groups cover every doc once, in order, and close as soon as they reach the target."""
    got = embedding_groups(sizes, target)
    assert [list(g) for g in got] == groups
    assert [i for g in got for i in g] == list(range(len(sizes)))
