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

Queries read the markers of their hits' documents *after* searching, in the generation each
hit came from, so whatever mix of chunks a leg returned, the marker they read filters it to
one version.

Who may write (:func:`decide`): a later version takes over an unfinished earlier one, whose
writer stops at its next slice; an earlier one is skipped; a write of the same version by
another process (a rebalance handed its event over while the old owner still writes it) is
waited for while the marker shows progress, and taken over once it has shown none for
:data:`TAKEOVER_AFTER_S` (its writer died; the event was not committed, so it comes back).
Documents are always versioned; unversioned items (transcript turns, which are small) are
always written in one transaction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

#: How long a finished write's marker stays: far longer than any query's searches take.
FINISHED_MARKER_TTL_S = 300
#: A write of the same version by another process is waited for while its marker shows
#: progress within this long; after that its writer is taken for dead and the write taken
#: over (a slice of the largest document takes well under a second).
TAKEOVER_AFTER_S = 30.0

Decision = Literal["write", "skip", "wait"]


@dataclass(frozen=True, slots=True)
class WriteMarker:
    """A large write of one document: the version queries see, and the one being written.

    ``writing`` is None once the write finished (then ``shown`` is the version written).
    ``token`` tells the write that began it from any other: a write that finds another token
    at its next slice was superseded (a newer version, a redelivery, a reindex's copy) and
    stops. ``owner`` is the writing process (a process takes over its own failed attempt at
    once), ``since`` when the write began and ``beat`` when it last made progress (epoch
    seconds by Redis's clock, so that no two hosts' clocks have to agree).
    """

    shown: int | None
    writing: int | None
    token: str = ""
    owner: str = ""
    since: float = 0.0
    beat: float = 0.0

    def encode(self) -> str:
        """The marker as stored (JSON)."""
        return json.dumps(
            {
                "shown": self.shown,
                "writing": self.writing,
                "token": self.token,
                "owner": self.owner,
                "since": self.since,
                "beat": self.beat,
            }
        )

    @classmethod
    def decode(cls, raw: str | bytes | None) -> WriteMarker | None:
        """A stored marker, or None for no marker (or one this code cannot read: a
        marker is only ever written by this module, so that means none)."""
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            return cls(
                shown=_int_or_none(data["shown"]),
                writing=_int_or_none(data["writing"]),
                token=str(data["token"]),
                owner=str(data.get("owner", "")),
                since=float(data.get("since", 0.0)),
                beat=float(data.get("beat", 0.0)),
            )
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


def same_version(stored: int | None, found: int | None) -> bool:
    """Whether two reads of a version are the same version, one of them maybe a search leg's.

    A leg reads the version as RediSearch returns a NUMERIC field, a double: one above 2**53
    (the LangGraph store's nanosecond versions) comes back rounded, while a hash or a write
    marker holds it exact.
    """
    if stored is None or found is None:
        return stored == found
    return stored == found or float(stored) == float(found)


def visible(chunk_version: int | None, marker: WriteMarker | None) -> bool:
    """Whether a query may return a chunk of this version (exact, or as a leg read it) of a
    document with this marker."""
    if marker is None:
        return True
    return marker.shown is not None and same_version(marker.shown, chunk_version)


def decide(version: int | None, marker: WriteMarker | None, *, owner: str, now: float) -> Decision:
    """What a write of ``version`` by process ``owner`` does about the doc's marker.

    * ``write``: nothing unfinished stands in the way, or it does and this write replaces it:
      a write of an earlier version (its writer stops at its next slice), this process's own
      failed attempt, or a write of this version whose writer stopped making progress.
    * ``skip``: a later version is being written (per-key order makes that the next event
      anyway; this one was redelivered or replayed late).
    * ``wait``: another live process is writing this very version (a rebalance handed the
      event over while the old owner still writes it): retry later, when it has finished
      (the stored version then says so) or stopped.
    """
    if marker is None or not marker.in_progress or version is None:
        return "write"
    assert marker.writing is not None
    if version < marker.writing:
        return "skip"
    if version > marker.writing or marker.owner == owner or not live(marker, now):
        return "write"
    return "wait"


def live(marker: WriteMarker | None, now: float) -> bool:
    """Whether a write under way has a writer that made progress lately. A copied marker
    (a reindex's: no owner) or a stalled one has none: whoever writes that version or a later
    one, or copies it whole, takes the doc over."""
    return marker is not None and marker.in_progress and bool(marker.owner) and now - marker.beat <= TAKEOVER_AFTER_S


def slices(count: int, size: int) -> list[range]:
    """``range(count)`` cut into consecutive slices of at most ``size``."""
    if size < 1:
        raise ValueError(f"slice size must be >= 1, got {size}")
    return [range(start, min(start + size, count)) for start in range(0, count, size)]
