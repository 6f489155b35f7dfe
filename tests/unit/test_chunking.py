"""Token-aware chunking: sizes, overlap, coverage, boundaries and ids."""

from __future__ import annotations

import itertools
import re

import pytest

from graph.communities import fresh_id
from memory.chunking import MAX_TOKEN_CHARS, chunk_doc, chunk_id, chunk_position, chunk_spans, join_chunks
from memory.records import COMMUNITY_PREFIX


def offsets(text: str) -> list[tuple[int, int]]:
    """A simple tokenizer: words and punctuation marks."""
    return [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", text)]


TEXT = " ".join(f"Sentence number {i} talks about pools and timeouts." for i in range(40))


@pytest.mark.parametrize(("max_tokens", "overlap"), [(16, 0), (16, 4), (50, 10), (200, 32), (7, 2)])
def test_chunks_respect_size_and_cover_the_text(max_tokens: int, overlap: int) -> None:
    """No chunk exceeds max_tokens; together they cover every token; the overlap is as set,
    or one token more where it would begin at a full stop (the next chunk starts at a word)."""
    offs = offsets(TEXT)
    chunks = chunk_spans(TEXT, offs, max_tokens=max_tokens, overlap=overlap)
    assert all(c.n_tokens <= max_tokens for c in chunks)
    assert chunks[0].start == offs[0][0]
    assert chunks[-1].end == offs[-1][1]
    starts = [c.start for c in chunks]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    for a, b in itertools.pairwise(chunks):
        shared = [o for o in offs if a.start <= o[0] and o[1] <= a.end and b.start <= o[0]]
        assert overlap <= len(shared) <= overlap + 1, (a.text, b.text)
        assert b.text[0] != "."  # here the only token that starts no word
    assert [c.index for c in chunks] == list(range(len(chunks)))


def test_chunks_prefer_sentence_boundaries() -> None:
    """A window ends after a sentence when one falls in its second half."""
    chunks = chunk_spans(TEXT, offsets(TEXT), max_tokens=20, overlap=0)
    assert all(c.text.endswith(".") for c in chunks)


def test_short_and_empty_texts() -> None:
    """A short text is one chunk; a text without tokens has none."""
    (only,) = chunk_spans("hello world", offsets("hello world"), max_tokens=16, overlap=2)
    assert only.text == "hello world"
    assert chunk_spans("   ", offsets("   "), max_tokens=16, overlap=2) == []


def test_chunking_is_deterministic() -> None:
    """Same input, same chunks."""
    a = chunk_spans(TEXT, offsets(TEXT), max_tokens=30, overlap=5)
    assert a == chunk_spans(TEXT, offsets(TEXT), max_tokens=30, overlap=5)


@pytest.mark.parametrize(("max_tokens", "overlap"), [(1, 0), (16, 8), (16, -1)])
def test_bad_parameters(max_tokens: int, overlap: int) -> None:
    """Overlap must stay under half a window so chunking always advances."""
    with pytest.raises(ValueError):
        chunk_spans(TEXT, offsets(TEXT), max_tokens=max_tokens, overlap=overlap)


def test_chunk_ids() -> None:
    """Chunk ids are the doc id and the position."""
    assert chunk_id("doc_8832", 4) == "doc_8832_p4"


def test_chunk_position_reads_the_id_back() -> None:
    """The position comes back from an id, also when the doc id itself holds ``_p``."""
    assert chunk_position(chunk_id("doc_8832", 4)) == 4
    assert chunk_position(chunk_id("runbook_part_p2", 13)) == 13
    assert chunk_position("no-position") == 0


def test_chunk_doc_reads_the_id_back() -> None:
    """The doc comes back from an id whatever the doc id holds (the search legs read it so)."""
    for doc_id in ("doc_8832", "runbook_part_p2", "a:b/c_p", "_p7", "planner/s1#12", "", "é_p_p1"):
        for n in (0, 3, 120):
            assert chunk_doc(chunk_id(doc_id, n)) == doc_id
    assert chunk_doc("no-position") == "no-position"
    # A community summary's chunk id is its doc id, made without chunk_id.
    community = COMMUNITY_PREFIX + fresh_id(2, frozenset({"billing", "pgbouncer"}))
    assert chunk_doc(community) == community


def test_chunks_never_cut_inside_a_word() -> None:
    """Word pieces (here: letters, digits and the pieces of snake_case names are separate
    tokens, as the model's tokenizer splits them): a window that finds no sentence end cuts
    before a word, and the next starts at one, so no chunk holds a fragment such as ``CONN``
    of ``ERR_CONN_RESET_4F2A`` or ``rich`` of ``Zürich``."""
    words = [f"ERR_CONN_RESET_{i:04X}" if i % 3 == 0 else f"Zürich{i}" for i in range(60)]
    text = " ".join(words)
    offs = [(m.start(), m.end()) for m in re.finditer(r"[A-Za-zü]+|\d|_", text)]
    chunks = chunk_spans(text, offs, max_tokens=23, overlap=5)
    assert len(chunks) > 10
    for c in chunks:
        assert c.n_tokens <= 23
        assert set(c.text.split()) <= set(words), c.text  # whole words only
    assert chunks[0].start == 0 and chunks[-1].end == len(text)


def test_a_full_stop_inside_a_word_is_no_sentence_end() -> None:
    """``3.5`` and ``db-01.prod`` do not end a sentence; ``。`` does, with no space after it."""
    text = "version 3.5 runs on db-01.prod now " * 6 + "第一句。第二句。" * 6
    offs = [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", text)]
    for c in chunk_spans(text, offs, max_tokens=12, overlap=0):
        assert not c.text.endswith(("3.", "db-01.")), c.text
    cjk = "第一句。第二句。" * 6
    cjk_offs = [(i, i + 1) for i in range(len(cjk))]
    assert all(c.text.endswith("。") for c in chunk_spans(cjk, cjk_offs, max_tokens=6, overlap=0))


def test_a_token_longer_than_any_word_is_cut_into_pieces() -> None:
    """The model reads a word of over 100 characters as one [UNK] token, so a 2 MB word would be
    one 2 MB chunk (no reply could carry it). Such a token counts as pieces of MAX_TOKEN_CHARS
    characters; the chunks cover it in order, overlapping as usual."""
    word = "x" * 200_000
    text = f"before the blob. {word} after the blob."
    offs = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]  # the blob: one token
    chunks = chunk_spans(text, offs, max_tokens=254, overlap=32)
    assert max(len(c.text) for c in chunks) <= 254 * MAX_TOKEN_CHARS
    assert chunks[0].start == 0 and chunks[-1].end == len(text)
    assert all(a.start < b.start < a.end for a, b in itertools.pairwise(chunks))  # overlapping, in order
    assert len(chunks) == 10


@pytest.mark.parametrize(
    ("texts", "expected"),
    [
        ([], ""),
        (["one chunk"], "one chunk"),
        (["the first part of it, then the overlap", "then the overlap and the rest"], None),
        (["no overlap here", "at all"], "no overlap here at all"),
    ],
)
def test_join_chunks_drops_each_overlap_once(texts: list[str], expected: str | None) -> None:
    """Chunks joined back: an overlap of 16+ characters is kept once; chunks without one are joined by a space."""
    if expected is None:
        expected = "the first part of it, then the overlap and the rest"
    assert join_chunks(texts) == expected


def test_join_chunks_restores_what_chunk_spans_cut() -> None:
    """The spans chunk_spans cuts (with overlap) join back to the original text."""
    text = " ".join(f"word{n}." if n % 9 == 8 else f"word{n}" for n in range(400))
    spans = chunk_spans(text, offsets(text), max_tokens=40, overlap=8)
    assert len(spans) > 3
    assert join_chunks([s.text for s in spans]) == text


_PIECES = ["Alpha", "beta.", "gamma!", "ERR_X_1", "\n", "\n\n", "\n\n\n", " ", "  ", "\t", "x" * 150, "naïve", "3.5"]


@pytest.mark.parametrize("strategy", ["windows", "stable"])
@pytest.mark.parametrize("seed", range(40))
def test_a_doc_joins_back_exactly_from_its_chunks_starts_and_gaps(strategy: str, seed: int) -> None:
    """Blank lines, line breaks, runs of spaces and words cut inside, and what the text opens
    and ends with (an indent, a final newline): with each chunk's start and gap, and the
    last one's tail, the chunks join back to the content exactly."""
    import random

    from memory.chunking import span_gaps, span_tail, spans_for
    from memory.config import ChunkingConfig

    rng = random.Random(seed)
    parts = [rng.choice(_PIECES) for _ in range(rng.randint(1, 900))]
    text = "".join(p if p.isspace() or not k or parts[k - 1].isspace() else " " + p for k, p in enumerate(parts))
    text = rng.choice(["", "\n\n    ", "  "]) + text + rng.choice(["", "\n", " \n\n"])
    offs = offsets(text)
    if not offs:
        return
    size = rng.choice([16, 20, 64])
    cfg = ChunkingConfig(strategy=strategy, max_tokens=size, overlap=rng.choice([0, 2, 3]), min_tokens=size // 2)
    spans = spans_for(text, offs, cfg)
    joined = join_chunks([s.text for s in spans], [s.start for s in spans], span_gaps(text, spans))
    assert joined == text[: offs[-1][1]]
    assert (
        join_chunks([s.text for s in spans], [s.start for s in spans], span_gaps(text, spans), span_tail(text, spans))
        == text
    )


def test_chunks_stored_without_their_starts_join_as_before() -> None:
    """A chunk written before starts were kept (start None) is joined by its text, as it
    always was: by its overlap with the chunk before, else by a space; a doc mixing both
    joins each pair by what that pair has."""
    assert join_chunks(["no overlap here", "at all"], [None, None], ["", ""]) == "no overlap here at all"
    overlapping = ["the first part of it, then the overlap", "then the overlap and the rest"]
    assert join_chunks(overlapping, [None, None], ["", ""]) == "the first part of it, then the overlap and the rest"
    assert join_chunks(["para one.", "para two.", "three"], [0, 11, None], ["", "\n\n", ""]) == (
        "para one.\n\npara two. three"
    )


def test_chunks_with_their_starts_put_back_gaps_and_drop_overlaps_by_length() -> None:
    assert join_chunks(["a\n", "b"], [0, 2], ["", ""]) == "a\nb"  # touching: no gap stored
    assert join_chunks(["para one.", "para two."], [0, 11], ["", "\n\n"]) == "para one.\n\npara two."
    assert join_chunks(["abcdef", "defgh"], [0, 3], ["", ""]) == "abcdefgh"  # a 3-character overlap, below 16
