"""Weighted Reciprocal Rank Fusion: pure, deterministic, unit-tested."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class Fused:
    """One fused hit: its id, its RRF score and its 1-based rank in every leg that found it.

    Not frozen: a query fuses up to hundreds of candidates, and a frozen dataclass took
    2.6 times as long to build (116 against 44 µs for 200).
    """

    id: str
    score: float
    ranks: dict[str, int] = field(default_factory=dict)


def fuse_rrf(
    legs: Mapping[str, Sequence[str] | Mapping[str, int]],
    weights: Mapping[str, float],
    k: int = 60,
    weights_of: Mapping[str, Mapping[str, float]] | None = None,
) -> list[Fused]:
    """Weighted reciprocal-rank fusion: ``score(d) = sum_leg w_leg / (k + rank_leg(d))``.

    Ranks are 1-based. A leg whose weight is 0 still reports ranks but adds nothing.
    Duplicate ids inside one leg keep their best (first) rank. Ties break on id so the
    order is stable run to run.

    Args:
        legs: leg name -> ids, best first; or id -> rank for a leg whose hits can tie
            (the identifier leg: see ``memory.identifiers.identifier_ranks``).
        weights: leg name -> weight (a missing leg weighs 1.0).
        k: the RRF constant; larger flattens the head of each list.
        weights_of: id -> leg weights for that id in place of ``weights`` (per-kind defaults:
            a transcript turn's legs are weighed apart from a document's).

    Returns:
        Fused hits, highest score first.

    Raises:
        ValueError: if ``k`` is negative or a weight is negative.
    """
    if k < 0:
        raise ValueError(f"rrf k must be >= 0, got {k}")
    scores: dict[str, float] = defaultdict(float)
    ranks: dict[str, dict[str, int]] = defaultdict(dict)
    own = weights_of or {}
    for weights_table in (weights, *own.values()):
        for leg, weight in weights_table.items():
            if weight < 0:
                raise ValueError(f"weight of leg {leg!r} must be >= 0, got {weight}")
    for leg, ids in legs.items():
        weight = weights.get(leg, 1.0)
        ranked = ids.items() if isinstance(ids, Mapping) else ((d, r) for r, d in enumerate(ids, start=1))
        for doc_id, rank in ranked:
            if leg in ranks[doc_id]:
                continue
            if rank < 1:
                raise ValueError(f"rank of {doc_id!r} in leg {leg!r} must be >= 1, got {rank}")
            ranks[doc_id][leg] = rank
            table = own.get(doc_id)
            scores[doc_id] += (weight if table is None else table.get(leg, weight)) / (k + rank)
    fused = [Fused(id=d, score=s, ranks=ranks[d]) for d, s in scores.items()]
    fused.sort(key=lambda f: (-f.score, f.id))
    return fused


def per_doc_first(fused: Sequence[Fused], doc_of: Callable[[str], str], limit: int) -> list[Fused]:
    """``fused`` with each document's hits past its first ``limit`` moved after all the others:
    results read in this order hold at most ``limit`` of one document's chunks while other
    documents' hits remain (a hit dropped or folded as a repeat is replaced by the next of
    them), and a document's further chunks fill the results only when none remain.

    A long document cut into many chunks matches a question with several of them, and would
    otherwise fill the results with itself and hide every other memory. The order is kept
    within each part; the moved hits keep their scores (so a later result may score above an
    earlier one). The whole list is ordered, whatever the depth asked for, so a shallow
    request's results are the head of a deeper one's.

    Args:
        fused: hits, best first (``fuse_rrf``).
        doc_of: a hit id -> its document's id.
        limit: most hits of one document ahead of the others' (0: no limit, ``fused`` as it is).
    """
    if limit <= 0:
        return list(fused)
    kept: list[Fused] = []
    moved: list[Fused] = []
    seen: dict[str, int] = defaultdict(int)
    for f in fused:
        doc = doc_of(f.id)
        seen[doc] += 1
        (kept if seen[doc] <= limit else moved).append(f)
    return [*kept, *moved]


def recency_ranks(hits: Sequence[tuple[str, float | None]]) -> dict[str, int]:
    """Each hit's rank by time, newest first (what a result reports as its ``recency`` rank).

    Equal times share a rank (competition ranking, as ``identifier_ranks``); a hit without a
    time ranks after every dated one.

    Args:
        hits: ``(id, epoch seconds or None)``; a repeated id keeps its first entry.

    Returns:
        id -> 1-based rank.
    """
    return competition_ranks({h: float("-inf") if t is None else t for h, t in _first_times(hits).items()})


def _first_times(hits: Sequence[tuple[str, float | None]]) -> dict[str, float | None]:
    """id -> its time, a repeated id keeping its first entry."""
    times: dict[str, float | None] = {}
    for hit_id, ts in hits:
        times.setdefault(hit_id, ts)
    return times


def freshness(hits: Sequence[tuple[str, float | None]]) -> dict[str, float]:
    """Each hit's place in time between the oldest and the newest of ``hits``: 1.0 the newest,
    0.0 the oldest and a hit without a time; 1.0 for every dated hit when they share one time.

    Args:
        hits: ``(id, epoch seconds or None)``; a repeated id keeps its first entry.
    """
    times = _first_times(hits)
    dated = [t for t in times.values() if t is not None]
    if not dated:
        return dict.fromkeys(times, 0.0)
    lo, hi = min(dated), max(dated)
    return {h: 0.0 if t is None else (1.0 if hi == lo else (t - lo) / (hi - lo)) for h, t in times.items()}


def boost_recent(fused: Sequence[Fused], times: Mapping[str, float | None], weight: float, top_k: int) -> list[Fused]:
    """``fused`` with its first ``top_k`` hits reordered by recency: each one's score times
    ``1 + weight * freshness`` (``freshness`` among those ``top_k``), and its ``recency`` rank
    recorded. The hits past ``top_k`` follow, unchanged.

    The hits are changed in place (score and ranks): a second call on them lifts them again.

    A multiple of the score, not one more RRF list: a newer hit passes an older one only if it
    matches at least ``1 / (1 + weight)`` as well, so a weak match (small talk that one leg
    found low down) is not lifted above what answers; and hits close together in time, next to
    the spread of the ``top_k`` hits' times, keep the order of how well they match. It never
    brings in another hit.

    Args:
        fused: hits, best first (``fuse_rrf``).
        times: id -> epoch seconds, or None for a hit without a time.
        weight: 0 leaves ``fused`` as it is.
        top_k: how many of the first hits are reordered.

    Raises:
        ValueError: if ``weight`` is negative.
    """
    if weight < 0:
        raise ValueError(f"recency weight must be >= 0, got {weight}")
    if weight == 0 or not fused:
        return list(fused)
    head = list(fused[:top_k])
    dated = [(f.id, times.get(f.id)) for f in head]
    fresh, ranks = freshness(dated), recency_ranks(dated)
    for f in head:
        if fresh[f.id]:  # (0 x an infinite weight would be NaN)
            f.score *= 1.0 + weight * fresh[f.id]
        f.ranks["recency"] = ranks[f.id]
    head.sort(key=lambda f: (-f.score, f.id))
    return [*head, *fused[top_k:]]


def competition_ranks(scores: Mapping[str, float]) -> dict[str, int]:
    """id -> 1-based rank by score, highest first; equal scores share the rank of the first
    of them (competition ranking: 1, 1, 3)."""
    first: dict[float, int] = {}
    for pos, score in enumerate(sorted(scores.values(), reverse=True), start=1):
        first.setdefault(score, pos)
    return {hit_id: first[score] for hit_id, score in scores.items()}
