"""Repeats: results that say the same thing word for word fold into the first (pure).

An agent that runs for days writes the same observation many times ("nightly build failed
on test_ledger"), and a document set repeats its boilerplate. A search answering with five
copies of one text fills the asker's context and hides the next memory. So a result whose
text is that of a better-ranked one (compared by :func:`repeat_key`) is not returned as its
own result: it is listed under the first as a repeat, and the next memory takes its place.
"""

from __future__ import annotations

from memory.records import StoredChunk

#: What may close a sentence: full stops, exclamation and question marks, an ellipsis, and
#: their full-width forms.
CLOSING_STOPS = ".!?\u2026\u3002\uff01\uff1f "

#: Most repeats a result lists; ``repeat_count`` counts them all.
MAX_LISTED_REPEATS = 20


def repeat_key(text: str) -> str:
    """What two texts must share to be repeats: their words, in order, case aside, and
    without the stop that ends them. ``"Build  failed.\n"``, ``"build failed"`` and ``"Build
    failed!"`` are repeats; ``"Build, failed"`` is not: only case, spacing and the closing
    stop are set aside, so no two different sayings fold."""
    return " ".join(text.split()).casefold().rstrip(CLOSING_STOPS)


def newest_first(repeats: tuple[StoredChunk, ...]) -> tuple[StoredChunk, ...]:
    """The repeats a result lists: the newest ``MAX_LISTED_REPEATS`` (the same text ranks by
    little but its time, and "when was this last said?" reads the first)."""
    ordered = sorted(repeats, key=lambda c: c.timestamp if c.timestamp is not None else float("-inf"), reverse=True)
    return tuple(ordered[:MAX_LISTED_REPEATS])


def fold_key(chunk: StoredChunk, context_turns: int) -> str:
    """What a result must share with a better one to fold into it ("": it never folds).

    The kind and, for a turn, the speaker's role are part of it: a user's "Bye!" and the
    assistant's stay two memories. A turn asked for with its exchange (``context_turns``)
    never folds, since the same words answer different exchanges ("Yes, do it.")."""
    if chunk.kind == "transcript" and context_turns:
        return ""
    role = str(chunk.metadata.get("role", "")) if chunk.kind == "transcript" else ""
    return f"{chunk.kind}\x1f{role}\x1f{repeat_key(chunk.text)}"
