"""Who said a transcript turn, and the speaker list a query that names them adds (pure).

Agents ask "what did the planner say about Y?" and "what recipes has Nate made?": most of the
turns that answer are said by the one the question names. A turn's speakers are its ``role``
and the name its text opens with, as transcripts write it (``"Caroline: I went to ..."``),
stored with the turn (:func:`speakers_field`). When a query names a speaker of some of the
candidates the legs found, those candidates form one more RRF list, all at rank 1
(:func:`speaker_ranks`): a small lift among what the legs found, never a find of its own, as
the recency list. Measured on LoCoMo dev: docs/decisions/0039-turns-know-their-speakers.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from memory.text import tokenize

#: A transcript line's speaker label: up to four words, each opening with a letter, then a
#: colon and a space ("Caroline: ", "Dr. Lee: ", "planner-7: ").
_LABEL = re.compile(r"\s*([^\W\d_][\w'.-]*(?: [^\W\d_][\w'.-]*){0,3})\s*:\s")
#: Between the speakers of a turn in its stored ``speaker`` field.
SEPARATOR = "|"


def speakers_field(text: str, role: str) -> str:
    """A turn's ``speaker`` field: its role and the name its text opens with, each as its
    lowercase tokens joined by spaces, the two joined by :data:`SEPARATOR` (``"user|caroline"``);
    empty where it has neither."""
    label = _LABEL.match(text)
    names = (role, label.group(1) if label else "")
    return SEPARATOR.join(dict.fromkeys(n for n in (" ".join(tokenize(x)) for x in names) if n))


def named(field: str, query: str) -> bool:
    """Whether ``query`` (``" "``-joined lowercase tokens, padded with a space each side) names one
    of the speakers of a ``speaker`` field: all of a name's tokens, in order."""
    return any(f" {name} " in query for name in field.split(SEPARATOR) if name)


def query_words(text: str) -> str:
    """A query as :func:`named` reads it."""
    return f" {' '.join(tokenize(text))} "


def speaker_ranks(text: str, hits: Iterable[tuple[str, str]]) -> dict[str, int]:
    """The speaker list of a query: each candidate (``(id, speaker field)``) said by someone the
    query names, at rank 1; empty where the query names none of them."""
    words = query_words(text)
    return {cid: 1 for cid, field in hits if field and named(field, words)}
