"""Token-aware chunking with overlap and deterministic chunk ids (pure).

The tokenizer is an argument: in the daemon it is the embedding model's own tokenizer,
so a chunk never exceeds what the model reads; tests pass a simple one.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

Offsets = Sequence[tuple[int, int]]

_SENTENCE_END = frozenset(".!?;")
# Full-width marks end a sentence with no space after them (Chinese, Japanese).
_WIDE_SENTENCE_END = frozenset("\u3002\uff01\uff1f\uff1b")  # ideographic full stop; full-width ! ? ;


@dataclass(frozen=True, slots=True)
class ChunkSpan:
    """A chunk of a text: its position, character span, text and token count."""

    index: int
    start: int
    end: int
    text: str
    n_tokens: int


def chunk_id(doc_id: str, index: int) -> str:
    """Deterministic chunk id: ``doc_8832`` and 4 give ``doc_8832_p4``."""
    return f"{doc_id}_p{index}"


def chunk_position(chunk_id_: str) -> int:
    """The position in a ``chunk_id``: ``doc_8832_p4`` gives 4 (0 for an id without one)."""
    _, _, n = chunk_id_.rpartition("_p")
    return int(n) if n.isdigit() else 0


def _is_boundary(text: str, offsets: Offsets, k: int) -> bool:
    """True when a chunk may end just before token ``k`` (after a sentence or line).

    A full stop followed by no space is no sentence end: ``3.5``, ``db-01.prod``.
    """
    prev_start, prev_end = offsets[k - 1]
    gap = text[prev_end : offsets[k][0]]
    if "\n" in gap or prev_end <= prev_start:
        return "\n" in gap
    last = text[prev_end - 1]
    return (bool(gap) and last in _SENTENCE_END) or last in _WIDE_SENTENCE_END


def _starts_word(offsets: Offsets, k: int) -> bool:
    """True when token ``k`` starts a word: space (or the text's start) comes before it.
    The model's tokenizer splits words into pieces (``Zürich`` -> ``z``, ``##uri``,
    ``##ch``; ``ERR_CONN_RESET`` -> ``err``, ``_``, ``conn`` ...): a cut between two pieces
    makes fragments that index as words of their own (``errconn``, ``rich``)."""
    return k == 0 or offsets[k][0] != offsets[k - 1][1]


#: Longest character span one token may bring into a chunk. The model's tokenizer reads a
#: word of over 100 characters as one [UNK] token whatever its length, so a 2 MB word was one
#: token and one 2 MB chunk: no reply could carry it, and every pass over the text (analysis,
#: graph patterns) paid for it whole (found by fuzzing). Such a token is cut into pieces of
#: this many characters, each counted as a token; real tokens are never this long.
MAX_TOKEN_CHARS = 100


def split_long_tokens(offsets: Offsets, max_chars: int = MAX_TOKEN_CHARS) -> list[tuple[int, int]]:
    """``offsets`` with every span longer than ``max_chars`` cut into consecutive pieces."""
    out: list[tuple[int, int]] = []
    for start, end in offsets:
        while end - start > max_chars:
            out.append((start, start + max_chars))
            start += max_chars
        out.append((start, end))
    return out


def chunk_spans(text: str, offsets: Offsets, *, max_tokens: int, overlap: int) -> list[ChunkSpan]:
    """Split ``text`` into windows of at most ``max_tokens`` tokens overlapping by ``overlap``.

    A window prefers to end at a sentence or line boundary found in its second half, so
    chunks read as whole sentences; otherwise it cuts before the last word that starts in
    its second half (at ``max_tokens`` only inside one word longer than half a window).
    The next window starts at the word holding its first overlap token, so the overlap
    may be a few tokens longer than ``overlap`` (shorter, when that word began the window)
    but never cuts a word, unless one word is longer than half a window.

    Args:
        text: the full text.
        offsets: ``(start, end)`` character offsets of its tokens, in order.
        max_tokens: the largest chunk, in tokens.
        overlap: tokens repeated from the end of one chunk at the start of the next.

    Returns:
        Chunks in order; empty when the text has no tokens.

    Raises:
        ValueError: if ``max_tokens < 2`` or ``overlap`` is not in ``[0, max_tokens // 2)``.
    """
    if max_tokens < 2:
        raise ValueError("max_tokens must be >= 2")
    if not 0 <= overlap < max_tokens // 2:
        raise ValueError("overlap must be in [0, max_tokens // 2)")
    offsets = split_long_tokens(offsets)  # a chunk holds at most max_tokens * MAX_TOKEN_CHARS characters
    n = len(offsets)
    chunks: list[ChunkSpan] = []
    i = 0
    while i < n:
        j = min(i + max_tokens, n)
        if j < n:
            half = i + max_tokens // 2
            j = next(
                (k for k in range(j, half, -1) if _is_boundary(text, offsets, k)),
                next((k for k in range(j, half, -1) if _starts_word(offsets, k)), j),
            )
        start, end = offsets[i][0], offsets[j - 1][1]
        chunks.append(ChunkSpan(len(chunks), start, end, text[start:end], j - i))
        if j >= n:
            break
        nxt = j - overlap
        # Back to the start of that word; when that word began this window (going back
        # would not advance), forward to the next word instead.
        i = next(
            (k for k in range(nxt, i, -1) if _starts_word(offsets, k)),
            next((k for k in range(nxt + 1, j + 1) if _starts_word(offsets, k)), nxt),
        )
    return chunks


#: Shortest overlap :func:`join_chunks` trusts as one (chunks overlap by a few dozen tokens).
_MIN_OVERLAP_CHARS = 16


def join_chunks(texts: Sequence[str]) -> str:
    """A doc's text again from its chunks in position order: each chunk's overlap with the one
    before it (the longest prefix of it that ends the previous chunk, at least 16 characters)
    is dropped; chunks with no such overlap are joined by a space.
    """
    if not texts:
        return ""
    out = texts[0]
    for prev, nxt in itertools.pairwise(texts):
        cut = 0
        for k in range(min(len(prev), len(nxt)), _MIN_OVERLAP_CHARS - 1, -1):
            if prev.endswith(nxt[:k]):
                cut = k
                break
        out += nxt[cut:] if cut else " " + nxt
    return out
