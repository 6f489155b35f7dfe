"""Query results as a reply carries them, for the tests of what callers are shown."""

from __future__ import annotations

from typing import Any

from consumers.requests import ResultItem


def result_item(**fields: Any) -> ResultItem:
    """A document chunk's result (``wiki/runbook.md``'s second chunk), with ``fields`` set."""
    base: dict[str, Any] = {
        "chunk_id": "wiki/runbook.md_p1",
        "rrf_score": 0.03,
        "text": "Then repoint the clients.",
        "source": "wiki/runbook.md",
        "doc_id": "wiki/runbook.md",
        "kind": "document",
        "metadata": {},
        "ranks": {"sparse": 1},
    }
    return ResultItem(**{**base, **fields})
