"""Model batches cut by length: every index once, capped size, little padding."""

from __future__ import annotations

import random

from memory.length_batches import length_batches


def padded(lengths: list[int], batches: list[list[int]]) -> int:
    return sum(max(lengths[i] for i in b) * len(b) for b in batches)


def test_every_index_once_and_batches_capped() -> None:
    rng = random.Random(3)
    lengths = [rng.randint(1, 256) for _ in range(500)]
    batches = length_batches(lengths, 64)
    assert sorted(i for b in batches for i in b) == list(range(500))
    assert all(1 <= len(b) <= 64 for b in batches)


def test_long_texts_of_mixed_length_pad_far_less_than_fixed_cuts() -> None:
    rng = random.Random(5)
    lengths = [rng.choice([rng.randint(20, 250), 254, 254]) for _ in range(210)]
    ours = padded(lengths, length_batches(lengths, 64))
    ranked = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    fixed = padded(lengths, [ranked[i : i + 64] for i in range(0, len(ranked), 64)])
    assert ours <= 1.06 * sum(lengths) < fixed


def test_short_texts_stay_in_one_batch() -> None:
    # queries: a few more batches would cost more than padding a dozen tokens
    assert length_batches([9, 14, 7, 22, 11, 12], 32) == [[3, 1, 5, 4, 0, 2]]


def test_batch_ends_at_the_size_cap_and_at_a_length_step() -> None:
    assert [len(b) for b in length_batches([200] * 5, 2)] == [2, 2, 1]
    assert length_batches([200, 100, 199], 8) == [[0, 2], [1]]
