"""Hierarchical Leiden communities with ids that stay stable across recomputes.

Detection is deterministic for the same graph and the same previous communities: nodes and
edges are fed in sorted order, Leiden gets a fixed seed, starts from the last communities
(decision 0058), or, the first time, from every node alone, and runs until it settles (0077).
Ids are matched to the previous run by Jaccard overlap; a genuinely new community gets an id
derived from its level and members, so the same graph built from scratch gets the same ids.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class RawCommunity:
    """A detected community before ids: level, members, and the index of its parent."""

    level: int
    members: frozenset[str]
    parent: int | None = None


@dataclass(frozen=True, slots=True)
class Community:
    """A community with its stable id."""

    id: str
    level: int
    members: frozenset[str]
    parent: str | None = None


@dataclass
class Assignment:
    """Result of matching a new detection to the previous communities."""

    communities: list[Community]
    changed: set[str] = field(default_factory=set)  # new or with different members
    removed: set[str] = field(default_factory=set)  # old ids with no successor
    events: list[dict[str, Any]] = field(default_factory=list)  # merges and splits


@functools.cache
def _cdlib_algorithms() -> Any:
    """cdlib's algorithms module, imported once (stdout redirected only for that import)."""
    with contextlib.redirect_stdout(io.StringIO()):  # cdlib prints notes on import
        from cdlib import algorithms
    return algorithms


def preload() -> None:
    """Import cdlib and its Leiden backend now rather than at the first recompute.

    Why: the import takes seconds of CPU with the GIL held (measured: ~14% of the daemon
    process's samples over the first 30 s of an ingest benchmark, stalling the event loop and
    NER). The daemon calls this at start-up, while the embedding worker loads its model.
    It also keeps the import's stdout redirect (process-wide) out of a running daemon's threads.
    """
    from memory.imports import HEAVY_IMPORTS

    with HEAVY_IMPORTS:  # not at once with the tokenizer's import (see memory.imports)
        _cdlib_algorithms()
        import igraph  # noqa: F401
        import leidenalg  # noqa: F401


def _leiden(
    nodes: Sequence[str],
    edges: Sequence[tuple[str, str, float]],
    seed: int,
    resolution: float,
    start: Mapping[str, int] | None = None,
) -> list[frozenset[str]]:
    """Leiden's communities of the graph, started from ``start`` (each node's community in the
    previous detection, where it had one) rather than from every node alone."""
    import igraph

    algorithms = _cdlib_algorithms()
    # Nodes go in as contiguous ints in sorted-name order: deterministic. The graph is built
    # as igraph's, which cdlib hands to leidenalg as it is: its conversion from networkx took
    # half of a detection's time, once for each of the runs below.
    # Edges are read apart from nodes while ingestion goes on, so an edge may name an entity
    # the node read missed: it exists (an edge is only stored with its ends), so take it in.
    names = sorted({*nodes, *(e[0] for e in edges), *(e[1] for e in edges)})
    ids = {n: i for i, n in enumerate(names)}
    weights: dict[tuple[int, int], float] = {}
    for a, b, w in sorted(edges):
        weights[min(ids[a], ids[b]), max(ids[a], ids[b])] = float(w)  # one edge a pair, the last weight
    if not weights:
        return [frozenset([n]) for n in names]
    g = igraph.Graph(n=len(names), edges=list(weights))
    g.vs["name"] = list(range(len(names)))  # what cdlib reports a community's members by
    g.es["weight"] = list(weights.values())
    initial = None
    if start:
        # The previous communities, numbered anew; a node that was in none starts alone.
        numbers: dict[int, int] = {}
        initial = []
        for name in names:
            key = start.get(name)
            initial.append(numbers.setdefault(key, len(numbers)) if key is not None else -1)
        alone = len(numbers)
        for i, n in enumerate(initial):
            if n == -1:
                initial[i], alone = alone, alone + 1
    # Run again from each result until a run returns what it started from: one run improves on
    # its start without settling (a real graph's rebuilds kept moving communities without any
    # change of the graph), and a partition that is its own result stays put at the next recompute.
    membership = initial
    for _ in range(_MAX_PASSES):
        result = algorithms.leiden(
            g, weights="weight", seed=seed, resolution_parameter=resolution, initial_membership=membership
        )
        found = [0] * len(names)
        for k, c in enumerate(result.communities):
            for i in c:
                found[i] = k
        if membership is not None and _canonical(found) == _canonical(membership):
            break
        membership = found
    groups = (frozenset(names[i] for i in c) for c in result.communities)
    return sorted(groups, key=lambda c: (-len(c), sorted(c)))


#: Leiden runs per detection at most, each from the last one's result (a real graph of 6,240
#: entities settled within 8 from every node alone).
_MAX_PASSES = 20


def _canonical(membership: Sequence[int]) -> tuple[int, ...]:
    """A membership with its communities numbered in order of first appearance: two that
    group the same nodes are equal."""
    numbers: dict[int, int] = {}
    return tuple(numbers.setdefault(m, len(numbers)) for m in membership)


def detect(
    nodes: Sequence[str],
    edges: Sequence[tuple[str, str, float]],
    *,
    seed: int,
    resolution: float = 1.0,
    max_size: int = 10,
    max_levels: int = 3,
    min_size: int = 2,
    previous: Sequence[tuple[int, frozenset[str]]] = (),
) -> list[RawCommunity]:
    """Leiden at level 0; any community above ``max_size`` is re-split into level + 1.

    Args:
        nodes: entity keys.
        edges: ``(a, b, weight)``.
        seed: Leiden seed (same graph + same seed = same communities).
        resolution: Leiden resolution parameter.
        max_size: the largest community left unsplit (GraphRAG uses 10).
        max_levels: how deep the hierarchy may go.
        min_size: smaller communities (isolated entities) are not kept.
        previous: the last detection's communities, as ``(level, members)``: each level's
            Leiden starts from them, so a small change of the graph moves few communities
            (from every node alone, deleting one isolated document regrouped a quarter of them).

    Returns:
        Communities of every level; a child's ``parent`` indexes this list.
    """
    out: list[RawCommunity] = []
    by_node: dict[str, list[tuple[str, str, float]]] = {}
    for e in edges:
        by_node.setdefault(e[0], []).append(e)

    def sub_edges(members: frozenset[str]) -> list[tuple[str, str, float]]:
        return [e for n in members for e in by_node.get(n, ()) if e[1] in members]

    was: dict[int, dict[str, int]] = {}
    for k, (level, members) in enumerate(previous):
        for m in members:
            was.setdefault(level, {})[m] = k

    queue: list[tuple[int, frozenset[str], int | None]] = [
        (0, c, None) for c in _leiden(nodes, edges, seed, resolution, was.get(0))
    ]
    while queue:
        level, members, parent = queue.pop(0)
        if len(members) < min_size:
            continue
        out.append(RawCommunity(level, members, parent))
        me = len(out) - 1
        if len(members) > max_size and level + 1 < max_levels:
            # The subgraph was one community at this resolution; raise it until Leiden
            # finds structure inside (or give up: a clique has none).
            res = resolution
            for _ in range(8):
                res *= 2
                parts = _leiden(sorted(members), sub_edges(members), seed, res, was.get(level + 1))
                if len(parts) > 1:
                    queue.extend((level + 1, p, me) for p in parts)
                    break
    return out


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def fresh_id(level: int, members: frozenset[str]) -> str:
    """The id of a genuinely new community: its level and a hash of its members."""
    digest = hashlib.sha1("\n".join(sorted(members)).encode()).hexdigest()[:10]
    return f"c{level}-{digest}"


def _overlaps(new: Sequence[RawCommunity], old: Sequence[Community]) -> dict[tuple[int, int], int]:
    """Shared members of each (new, old) pair of one level that share any: counted through
    an index of the old communities by member, so the work follows the overlaps, not the
    product of the two counts (comparing every pair took 4.5 s at 3,000 communities)."""
    by_member: dict[tuple[int, str], list[int]] = {}
    for j, o in enumerate(old):
        for m in o.members:
            by_member.setdefault((o.level, m), []).append(j)
    shared: dict[tuple[int, int], int] = {}
    for i, n in enumerate(new):
        for m in n.members:
            for j in by_member.get((n.level, m), ()):
                shared[(i, j)] = shared.get((i, j), 0) + 1
    return shared


def assign_ids(new: Sequence[RawCommunity], old: Sequence[Community], *, threshold: float = 0.3) -> Assignment:
    """Give each new community the id of the old one it best continues, else a fresh id.

    Matching is one-to-one per level, greedily by Jaccard overlap (at least ``threshold``).
    An old community spread over several new ones is recorded as a split; a new one drawn
    from several old ones as a merge.

    Returns:
        The communities with ids, which ids are new or changed, which old ids are gone,
        and merge/split events.
    """
    shared = _overlaps(new, old)
    ids: list[str | None] = [None] * len(new)
    used: set[str] = set()
    pairs = []
    for (i, j), k in shared.items():
        jaccard = k / (len(new[i].members) + len(old[j].members) - k)
        pairs.append((-jaccard, old[j].id, i))
    for neg_j, oid, i in sorted(pairs):
        if -neg_j < threshold:
            break
        if ids[i] is None and oid not in used:
            ids[i] = oid
            used.add(oid)
    old_by_id = {o.id: o for o in old}
    result = Assignment(communities=[])
    for i, n in enumerate(new):
        cid = ids[i]
        if cid is None:
            cid = fresh_id(n.level, n.members)
            k = 1
            while cid in used:
                k += 1
                cid = f"{fresh_id(n.level, n.members)}-{k}"
            used.add(cid)
            ids[i] = cid
            result.changed.add(cid)
        elif old_by_id[cid].members != n.members:
            result.changed.add(cid)
    for i, n in enumerate(new):
        parent = ids[n.parent] if n.parent is not None else None
        result.communities.append(Community(id=str(ids[i]), level=n.level, members=n.members, parent=parent))
    result.removed = {o.id for o in old} - used
    sources: dict[int, list[str]] = {}
    targets: dict[int, list[str]] = {}
    for (i, j), k in shared.items():
        if k / len(new[i].members) >= 0.25:
            sources.setdefault(i, []).append(old[j].id)
        if k / len(old[j].members) >= 0.25:
            targets.setdefault(j, []).append(result.communities[i].id)
    for i, n_c in enumerate(result.communities):
        if len(sources.get(i, ())) >= 2:
            result.events.append({"type": "merge", "into": n_c.id, "from": sorted(sources[i]), "level": n_c.level})
    for j, o in enumerate(old):
        if len(targets.get(j, ())) >= 2:
            result.events.append({"type": "split", "from": o.id, "into": sorted(targets[j]), "level": o.level})
    return result
