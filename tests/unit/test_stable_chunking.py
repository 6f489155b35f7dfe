"""Chunks anchored to the content: sizes, coverage, and what each kind of edit changes."""

from __future__ import annotations

import random
import re

import pytest

from memory.chunking import chunk_spans, spans_for, stable_spans
from memory.config import ChunkingConfig


def offsets(text: str) -> list[tuple[int, int]]:
    """A simple tokenizer: words and punctuation marks."""
    return [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", text)]


WORDS = "pool timeout retry cache worker queue drain ledger lock billing replica shard index query budget".split()


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def paragraph(rng: random.Random) -> str:
    """Three to six sentences: 30 to 140 tokens, so at least min_tokens=24 and at most max_tokens=160."""
    return " ".join(sentence(rng, rng.randint(9, 22)) for _ in range(rng.randint(3, 6)))


def chunks(paras: list[str]) -> list[str]:
    text = "\n\n".join(paras)
    return [c.text for c in stable_spans(text, offsets(text), max_tokens=160, overlap=16, min_tokens=24)]


def changed(before: list[str], after: list[str]) -> int:
    """Chunks of ``after`` whose exact text ``before`` did not have: what an edit must embed."""
    old = set(before)
    return sum(1 for c in after if c not in old)


@pytest.mark.parametrize("seed", range(6))
def test_chunks_respect_size_and_cover_every_token(seed: int) -> None:
    rng = random.Random(seed)
    paras = [paragraph(rng) if rng.random() < 0.7 else "## " + sentence(rng, 3) for _ in range(30)]
    paras.append(" ".join(WORDS * 30))  # one sentence longer than a chunk: windows
    text = "\n\n".join(paras)
    offs = offsets(text)
    spans = stable_spans(text, offs, max_tokens=160, overlap=16, min_tokens=24)
    assert all(0 < s.n_tokens <= 160 for s in spans)
    covered = {i for s in spans for i, (a, b) in enumerate(offs) if s.start <= a and b <= s.end}
    assert covered == set(range(len(offs)))
    assert [s.index for s in spans] == list(range(len(spans)))
    assert spans == stable_spans(text, offs, max_tokens=160, overlap=16, min_tokens=24)


def test_a_paragraph_is_a_chunk_and_a_heading_joins_the_next() -> None:
    rng = random.Random(7)
    body = [paragraph(rng) for _ in range(3)]
    text = "\n\n".join(["# Runbook: pool exhaustion", body[0], body[1], "## Rollback", body[2]])
    got = [c.text for c in stable_spans(text, offsets(text), max_tokens=160, overlap=16, min_tokens=24)]
    assert got == ["# Runbook: pool exhaustion\n\n" + body[0], body[1], "## Rollback\n\n" + body[2]]


def test_a_sentence_longer_than_a_chunk_is_cut_into_overlapping_windows() -> None:
    text = " ".join(WORDS * 40)
    got = stable_spans(text, offsets(text), max_tokens=100, overlap=10, min_tokens=24)
    assert got == chunk_spans(text, offsets(text), max_tokens=100, overlap=10)


@pytest.mark.parametrize("seed", range(20))
def test_an_edit_changes_only_the_chunks_that_hold_it(seed: int) -> None:
    """With paragraphs between min_tokens and max_tokens, each is its own chunk: an edit of one
    paragraph, an inserted, deleted or appended one, re-chunks that one alone."""
    rng = random.Random(seed)
    paras = [paragraph(rng) for _ in range(rng.randint(15, 40))]
    before = chunks(paras)
    i = rng.randrange(len(paras))
    words = paras[i].split(" ")
    j = rng.randrange(len(words))
    words[j] = words[j].replace(words[j][0], "x", 1)
    assert changed(before, chunks([*paras[:i], " ".join(words), *paras[i + 1 :]])) == 1  # a typo
    assert changed(before, chunks([*paras[:i], paragraph(rng), *paras[i + 1 :]])) == 1  # a rewrite
    assert changed(before, chunks([*paras[:i], paragraph(rng), *paras[i:]])) == 1  # an insert
    assert changed(before, chunks(paras[:i] + paras[i + 1 :])) == 0  # a delete
    assert changed(before, chunks([*paras, paragraph(rng)])) == 1  # an append


@pytest.mark.parametrize("seed", range(10))
def test_cuts_inside_a_long_paragraph_resynchronize_after_an_edit(seed: int) -> None:
    """One paragraph of many sentences: a sentence inserted near its start changes at most
    the chunk that holds it and the next."""
    rng = random.Random(seed)
    sentences = [sentence(rng, rng.randint(8, 20)) for _ in range(80)]
    edited = [*sentences[:3], sentence(rng, 12), *sentences[3:]]
    before, after = " ".join(sentences), " ".join(edited)
    stable = [stable_spans(t, offsets(t), max_tokens=160, overlap=16, min_tokens=24) for t in (before, after)]
    assert changed([c.text for c in stable[0]], [c.text for c in stable[1]]) <= 2


def test_windows_from_the_start_move_after_an_insert() -> None:
    """What the stable chunker is for: windows packed from the text's start all move when a
    paragraph is inserted near the top."""
    rng = random.Random(11)
    paras = [paragraph(rng) for _ in range(30)]
    edited = [*paras[:1], paragraph(rng), *paras[1:]]
    texts = ["\n\n".join(p) for p in (paras, edited)]
    windows = [[c.text for c in chunk_spans(t, offsets(t), max_tokens=160, overlap=16)] for t in texts]
    assert changed(*windows) > 10
    assert changed(chunks(paras), chunks(edited)) == 1


def test_the_strategy_setting_picks_the_chunker() -> None:
    rng = random.Random(3)
    text = "\n\n".join(paragraph(rng) for _ in range(10))
    offs = offsets(text)
    assert spans_for(text, offs, ChunkingConfig(strategy="windows")) == chunk_spans(
        text, offs, max_tokens=254, overlap=32
    )
    assert spans_for(text, offs, ChunkingConfig()) == stable_spans(
        text, offs, max_tokens=254, overlap=32, min_tokens=64
    )


def test_a_text_without_tokens_has_no_chunks() -> None:
    assert stable_spans("\u200b  ", [], max_tokens=16, overlap=2, min_tokens=4) == []


def test_bad_parameters() -> None:
    with pytest.raises(ValueError, match="min_tokens"):
        stable_spans("a b", offsets("a b"), max_tokens=16, overlap=2, min_tokens=17)
    with pytest.raises(ValueError, match="min_tokens"):
        ChunkingConfig(max_tokens=64, min_tokens=65)
