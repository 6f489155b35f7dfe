"""Names a user nearly spelt (pure): the field a misspelt one meant, for a refusal, and the
session, document or tenant a typed name may have meant, for a hint."""

from __future__ import annotations

import difflib
from collections.abc import Collection

#: How alike (difflib's ratio) an unknown name and a field must be to be taken for its misspelling.
MISSPELLING_RATIO = 0.8


def near_spelling(word: str, among: Collection[str]) -> str | None:
    """The one of ``among`` that ``word`` spells nearly right (``metdata``: ``metadata``), if any."""
    near = difflib.get_close_matches(word, list(among), 1, MISSPELLING_RATIO)
    return near[0] if near else None


def near_name(word: str, among: Collection[str]) -> str | None:
    """The one of ``among`` that a name a user typed (a session, a document, a tenant) may have
    meant: :func:`near_spelling`'s, else the one fewest typing slips away (``s-tset``:
    ``s-tests``), as :func:`slips` counts them and :func:`slips_allowed` allows. For hints
    only: a field refused as a misspelling keeps :func:`near_spelling`'s stricter rule."""
    if spelt := near_spelling(word, among):
        return spelt
    limit = slips_allowed(word)
    names = list(among)
    near = [(n, i) for i, other in enumerate(names) if (n := slips(word, other, limit)) <= limit]
    return names[min(near)[1]] if near else None


def slips_allowed(word: str) -> int:
    """Typing slips a name of this length may hold and still be taken for another: none below
    4 characters (``s-1`` and ``s-2`` are two names), 1 up to 5, 2 from 6."""
    return 0 if len(word) < 4 else 1 if len(word) < 6 else 2


def slips(a: str, b: str, limit: int | None = None) -> int:
    """Edits from ``a`` to ``b``: characters inserted, deleted, replaced, or two neighbours
    swapped (the optimal string alignment distance); with ``limit``, any count above it is
    ``limit + 1``, and only the cells within ``limit`` of the diagonal are computed, so a
    thousand names of a thousand characters are compared in a blink."""
    most = max(len(a), len(b)) if limit is None else limit
    over = most + 1
    if abs(len(a) - len(b)) > most:
        return over
    prev2: dict[int, int] = {}
    prev = {j: j for j in range(min(len(b), most) + 1)}
    for i in range(1, len(a) + 1):
        row = {0: i} if i <= most else {}
        for j in range(max(1, i - most), min(len(b), i + most) + 1):
            cost = a[i - 1] != b[j - 1]
            n = min(prev.get(j, over) + 1, row.get(j - 1, over) + 1, prev.get(j - 1, over) + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                n = min(n, prev2.get(j - 2, over) + 1)
            row[j] = min(n, over)
        if min(row.values(), default=over) >= over:
            return over  # every alignment is past the limit already
        prev2, prev = prev, row
    return min(prev.get(len(b), over), over)
