"""Token-aware chunking with overlap and deterministic chunk ids (pure).

The tokenizer is an argument: in the daemon it is the embedding model's own tokenizer,
so a chunk never exceeds what the model reads; tests pass a simple one.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from memory.config import ChunkingConfig

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


def chunk_doc(chunk_id_: str) -> str:
    """The doc of a ``chunk_id``: ``doc_8832_p4`` gives ``doc_8832``. An id without a position
    is its doc's own and is returned as it is: a community summary's (``community:c0-…``,
    ``graph.communities``), the one chunk id not made by :func:`chunk_id`."""
    doc_id, sep, n = chunk_id_.rpartition("_p")
    return doc_id if sep and n.isdigit() else chunk_id_


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
#: word of over 100 characters as one [UNK] token whatever its length, so a 2 MB word would be
#: one token and one 2 MB chunk: no reply could carry it, and every pass over the text
#: (analysis, graph patterns) would pay for it whole. Such a token is cut into pieces of
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


def join_chunks(
    texts: Sequence[str],
    starts: Sequence[int | None] | None = None,
    gaps: Sequence[str] | None = None,
    tail: str = "",
) -> str:
    """A doc's text again from its chunks in position order.

    With each chunk's ``starts`` (where it starts in the doc) and ``gaps`` (the text between
    it and the chunk before, when they do not overlap; before the first, the text the doc
    opens with), and the ``tail`` after the last chunk, the join is exact: an overlap is
    dropped by its length, a gap put back as it was. A chunk stored without its start (before
    it was kept) is joined by its text: its overlap with the chunk before (the longest
    prefix of it that ends the previous chunk, at least 16 characters) is dropped, and
    chunks with no such overlap are joined by a space.
    """
    if not texts:
        return ""
    out = [(gaps[0] if gaps else "") + texts[0]]
    for k in range(1, len(texts)):
        prev, nxt = texts[k - 1], texts[k]
        a, b = (starts[k - 1], starts[k]) if starts is not None else (None, None)
        if a is not None and b is not None:
            prev_end = a + len(prev)
            out.append(nxt[prev_end - b :] if b < prev_end else (gaps[k] if gaps is not None else "") + nxt)
            continue
        cut = 0
        for n in range(min(len(prev), len(nxt)), _MIN_OVERLAP_CHARS - 1, -1):
            if prev.endswith(nxt[:n]):
                cut = n
                break
        out.append(nxt[cut:] if cut else " " + nxt)
    return "".join(out) + tail


def span_gaps(text: str, spans: Sequence[ChunkSpan]) -> list[str]:
    """The text between each span and the one before it, where they do not overlap ("" otherwise),
    and before the first span the text ``text`` opens with."""
    gaps = [text[: spans[0].start]] if spans else []
    for prev, span in itertools.pairwise(spans):
        gaps.append(text[prev.end : span.start] if span.start > prev.end else "")
    return gaps


def span_tail(text: str, spans: Sequence[ChunkSpan]) -> str:
    """The text after the last span: what ``text`` ends with past its last token."""
    return text[max(s.end for s in spans) :] if spans else ""


# -- boundaries anchored to the content ----------------------------------------------------

#: Boundary strengths between two tokens: none, a sentence end, a line break, a blank line.
_SENTENCE, _LINE, _PARAGRAPH = 1, 2, 3


def _strengths(text: str, offsets: Offsets) -> list[int]:
    """The boundary strength before each token (0 before the first)."""
    out = [0] * len(offsets)
    for k in range(1, len(offsets)):
        newlines = text.count("\n", offsets[k - 1][1], offsets[k][0])
        if newlines >= 2:
            out[k] = _PARAGRAPH
        elif newlines == 1:
            out[k] = _LINE
        elif _is_boundary(text, offsets, k):
            out[k] = _SENTENCE
    return out


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.strip().encode(), digest_size=8).digest(), "big")


def _anchor(text: str) -> bool:
    """Whether a short paragraph may end a chunk that is long enough: decided by its own text
    alone (half of all texts), so a cut found once is found again whatever changed before it."""
    return _hash(text) & 1 == 0


def _local_maxima(
    text: str, offsets: Offsets, units: Sequence[tuple[int, int]], strength: Sequence[int], reach: int
) -> set[int]:
    """The unit starts inside one paragraph where a chunk ends: those whose score (the boundary's
    strength, then a hash of the unit before it) beats every other start within ``reach``
    tokens. Each depends only on the text within ``reach`` of it, never on where a chunk began,
    so an edit moves only the cuts near it; two cuts are at least ``reach`` tokens apart."""
    starts = [a for a, _ in units[1:]]
    score = [
        (strength[a], _hash(text[offsets[pa][0] : offsets[pb - 1][1]]))
        for (pa, pb), (a, _) in itertools.pairwise(units)
    ]
    cuts: set[int] = set()
    lo = 0
    for i, a in enumerate(starts):
        while starts[lo] < a - reach:
            lo += 1
        hi = i
        while hi + 1 < len(starts) and starts[hi + 1] <= a + reach:
            hi += 1
        if all(score[i] > score[j] for j in range(lo, hi + 1) if j != i):
            cuts.add(a)
    return cuts


#: Paragraphs of up to this many chunks are cut into windows from their start: the largest chunks,
#: which BM25 ranks best on abstract-length documents (decision 0026); longer ones by content, so
#: an edit in a wall of text stays local.
WINDOWED_PARAGRAPH_CHUNKS = 4


def stable_spans(text: str, offsets: Offsets, *, max_tokens: int, overlap: int, min_tokens: int) -> list[ChunkSpan]:
    """Split ``text`` into chunks whose boundaries depend on the content near them, not on
    where the text starts: an edit changes only the chunks that hold it (docs/decisions/0026).

    The units are sentences and lines (never cut inside), grouped in order:

    - a paragraph (text between blank lines) ends its chunk once the chunk has ``min_tokens``
      and the paragraph itself does too; shorter ones (headings, list items) join the next,
      ending a chunk only after a paragraph :func:`_anchor` picks;
    - a paragraph of up to ``WINDOWED_PARAGRAPH_CHUNKS`` chunks is cut into overlapping windows
      from its start (:func:`chunk_spans`), with the short paragraphs waiting for it: an edit
      moves only its windows;
    - a longer one is cut at the unit boundaries that :func:`_local_maxima` picks (a third of
      ``max_tokens`` apart at least);
    - a chunk never exceeds ``max_tokens``: the unit that would overflow it starts the next;
    - a single sentence longer than ``max_tokens`` is cut into overlapping windows
      (:func:`chunk_spans`, with ``overlap``), each a chunk of its own.

    Raises:
        ValueError: on the parameters :func:`chunk_spans` refuses, or ``min_tokens`` not in
            ``[1, max_tokens]``.
    """
    if max_tokens < 2:
        raise ValueError("max_tokens must be >= 2")
    if not 0 <= overlap < max_tokens // 2:
        raise ValueError("overlap must be in [0, max_tokens // 2)")
    if not 1 <= min_tokens <= max_tokens:
        raise ValueError("min_tokens must be in [1, max_tokens]")
    offsets = split_long_tokens(offsets)
    n = len(offsets)
    if not n:
        return []
    strength = _strengths(text, offsets)
    cuts = [k for k in range(1, n) if strength[k]]
    units = list(zip([0, *cuts], [*cuts, n], strict=True))  # sentences and lines, as token ranges
    paragraphs = list(itertools.pairwise([0, *(k for k in cuts if strength[k] == _PARAGRAPH), n]))
    # Cuts inside paragraphs too long to be windowed, none within min_tokens of their ends.
    inner: set[int] = set()
    unit_starts = [a for a, _ in units]

    def units_of(pa: int, pb: int) -> list[tuple[int, int]]:
        return units[bisect.bisect_left(unit_starts, pa) : bisect.bisect_left(unit_starts, pb)]

    for pa, pb in paragraphs:
        if pb - pa > WINDOWED_PARAGRAPH_CHUNKS * max_tokens:
            found = _local_maxima(text, offsets, units_of(pa, pb), strength, max(max_tokens // 3, 1))
            inner |= {k for k in found if k - pa >= min_tokens and pb - k >= min_tokens}
    spans: list[tuple[int, int, int]] = []  # (start char, end char, tokens)
    group: tuple[int, int] | None = None  # the chunk being built, as a token range

    def close() -> None:
        nonlocal group
        if group is not None:
            spans.append((offsets[group[0]][0], offsets[group[1] - 1][1], group[1] - group[0]))
            group = None

    def windows(a: int, b: int) -> None:
        for w in chunk_spans(text, offsets[a:b], max_tokens=max_tokens, overlap=overlap):
            spans.append((w.start, w.end, w.n_tokens))

    last_unit = ""
    prev_para = 0  # the tokens of the paragraph before
    for pa, pb in paragraphs:
        if max_tokens < pb - pa <= WINDOWED_PARAGRAPH_CHUNKS * max_tokens:
            # Overlapping windows from the paragraph's start (with the short text waiting for it):
            # as large as chunks get, and an edit moves only this paragraph's windows.
            start = pa
            if group is not None and group[1] - group[0] < min_tokens:
                start, group = group[0], None
            close()
            windows(start, pb)
            last_unit, prev_para = "", pb - pa
            continue
        for a, b in units_of(pa, pb):
            size = b - a
            if size > max_tokens:
                close()
                windows(a, b)
                last_unit = ""
                continue
            if group is not None:
                held = group[1] - group[0]
                overflows = held + size > max_tokens
                ends = a == pa and held >= min_tokens and (prev_para >= min_tokens or _anchor(last_unit))
                if overflows or a in inner or ends:
                    close()
            group = (group[0], b) if group is not None else (a, b)
            last_unit = text[offsets[a][0] : offsets[b - 1][1]]
        prev_para = pb - pa
    close()
    return [ChunkSpan(i, s, e, text[s:e], t) for i, (s, e, t) in enumerate(spans)]


def spans_for(text: str, offsets: Offsets, cfg: ChunkingConfig) -> list[ChunkSpan]:
    """The chunks of ``text`` by the configured strategy."""
    if cfg.strategy == "windows":
        return chunk_spans(text, offsets, max_tokens=cfg.max_tokens, overlap=cfg.overlap)
    return stable_spans(text, offsets, max_tokens=cfg.max_tokens, overlap=cfg.overlap, min_tokens=cfg.min_tokens)
