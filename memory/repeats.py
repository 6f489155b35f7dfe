"""Repeats: results that say the same thing word for word fold into the first (pure).

An agent that runs for days writes the same observation many times ("nightly build failed
on test_ledger"), and a document set repeats its boilerplate. A search answering with five
copies of one text fills the asker's context and hides the next memory. So a result whose
text is that of a better-ranked one (compared by :func:`repeat_key`) is not returned as its
own result: it is listed under the first as a repeat, and the next memory takes its place.
"""

from __future__ import annotations


def repeat_key(text: str) -> str:
    """What two texts must share to be repeats: their words, in order, case aside.
    ``"Build  failed.\\n"`` and ``"build failed."`` are repeats; ``"Build failed"`` (no
    stop) is not: only case and spacing are set aside, so no two different sayings fold."""
    return " ".join(text.split()).casefold()
