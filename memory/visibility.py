"""Which chunks of a document queries may see while a large write of it is under way (pure).

A document is normally replaced in one MULTI/EXEC, so a query sees its old version or its
new one, never half of each. But RediSearch indexes every chunk inside that EXEC, and Redis
answers nobody meanwhile: 4.5 s for a 9,400-chunk document (``bench/write_block.py``). A
document of more than ``IndexConfig.write_slice_chunks`` chunks is therefore written in
slices, one transaction each, and a per-document *write marker* tells queries what to show:

* while the slices are written, only chunks of the version that was shown before (the
  ``shown`` version; none for a new document or a delete): a slice overwrites a chunk in
  place, which hides it, so a query sees a subset of the old version, never new text;
* once the last slice is in, one transaction stores the version and flips the marker to the
  new version, kept for :data:`FINISHED_MARKER_TTL_S` so a query whose search straddled the
  flip (it read some old chunks, then the flipped marker) drops the old ones.

Queries read the markers of their hits' documents *after* searching, so whatever mix of
chunks a leg returned, the marker they read filters it to one version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: How long a finished write's marker stays: far longer than any query's searches take.
FINISHED_MARKER_TTL_S = 300


@dataclass(frozen=True, slots=True)
class WriteMarker:
    """A large write of one document: the version queries see, and the one being written.

    ``writing`` is None once the write finished (then ``shown`` is the version written).
    ``token`` tells the writer that began it from any other: a write that finds another's
    token at its next slice was superseded (a newer version, a rebalance's redelivery, a
    reindex's copy) and stops.
    """

    shown: int | None
    writing: int | None
    token: str = ""
    since: float = 0.0  # when the write began (epoch seconds; doctor reports writes that stopped)

    def encode(self) -> str:
        """The marker as stored (JSON)."""
        return json.dumps({"shown": self.shown, "writing": self.writing, "token": self.token, "since": self.since})

    @classmethod
    def decode(cls, raw: str | bytes | None) -> WriteMarker | None:
        """A stored marker, or None for no marker (or one this code cannot read: a
        marker is only ever written by this module, so that means none)."""
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            shown, writing = _int_or_none(data["shown"]), _int_or_none(data["writing"])
            return cls(shown=shown, writing=writing, token=str(data["token"]), since=float(data.get("since", 0.0)))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    @property
    def in_progress(self) -> bool:
        """Whether a writer is still (or was, before it died) writing slices."""
        return self.writing is not None


def _int_or_none(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not a version: {value!r}")
    return value


def visible(chunk_version: int | None, marker: WriteMarker | None) -> bool:
    """Whether a query may return a chunk of this version of a document with this marker."""
    if marker is None:
        return True
    return marker.shown is not None and chunk_version == marker.shown


def supersedes(version: int | None, marker: WriteMarker | None) -> bool:
    """Whether a write of ``version`` may replace the document despite ``marker``.

    An unfinished write of a later version wins (per-key order makes that the next event
    anyway; it was redelivered to another daemon after a rebalance). One of this version or
    an earlier one is taken over: its writer died or was superseded, and this write
    replaces everything it left.
    """
    if marker is None or not marker.in_progress or version is None:
        return True
    assert marker.writing is not None
    return version >= marker.writing


def slices(count: int, size: int) -> list[range]:
    """``range(count)`` cut into consecutive slices of at most ``size``."""
    if size < 1:
        raise ValueError(f"slice size must be >= 1, got {size}")
    return [range(start, min(start + size, count)) for start in range(0, count, size)]
