"""Token-aware chunking with overlap and deterministic chunk ids (pure).

The tokenizer is an argument: in the daemon it is the embedding model's own tokenizer,
so a chunk never exceeds what the model reads; tests pass a simple one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Offsets = Sequence[tuple[int, int]]

_SENTENCE_END = frozenset(".!?;")


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
    """True when a chunk may end just before token ``k`` (after a sentence or line)."""
    prev_start, prev_end = offsets[k - 1]
    gap = text[prev_end : offsets[k][0]]
    return "\n" in gap or (prev_end > prev_start and text[prev_end - 1] in _SENTENCE_END)


def chunk_spans(text: str, offsets: Offsets, *, max_tokens: int, overlap: int) -> list[ChunkSpan]:
    """Split ``text`` into windows of at most ``max_tokens`` tokens overlapping by ``overlap``.

    A window prefers to end at a sentence or line boundary found in its second half, so
    chunks read as whole sentences; otherwise it cuts at ``max_tokens``.

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
    n = len(offsets)
    chunks: list[ChunkSpan] = []
    i = 0
    while i < n:
        j = min(i + max_tokens, n)
        if j < n:
            for k in range(j, i + max_tokens // 2, -1):
                if _is_boundary(text, offsets, k):
                    j = k
                    break
        start, end = offsets[i][0], offsets[j - 1][1]
        chunks.append(ChunkSpan(len(chunks), start, end, text[start:end], j - i))
        if j >= n:
            break
        i = j - overlap
    return chunks
