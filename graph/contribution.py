"""What one document adds to the graph (``Contribution``), in the JSON form the apply script
reads, and what applying it did (``ContributionResult``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Contribution:
    """What one document adds to the graph."""

    entities: dict[str, tuple[str, str, list[str]]]  # key -> (name, type, chunk ids)
    edges: dict[tuple[str, str], int]
    # key -> digest of the texts naming it (graph.extraction.fingerprints): an entity whose digest,
    # presence and edges an edit leaves alone is not touched by it (its communities stay fresh).
    fingerprints: dict[str, str] = field(default_factory=dict)

    def size(self) -> int:
        """Entities, their chunk ids and edges: what encoding it costs (an entity of a 9,400-chunk
        document carries 9,400 ids)."""
        return len(self.entities) + sum(len(c) for _, _, c in self.entities.values()) + len(self.edges)

    def to_json(self, version: int | None) -> str:
        """The stored form; versions travel as decimal strings (Lua numbers are doubles)."""
        return json.dumps(
            {
                "v": str(version) if version is not None else None,
                "e": {
                    k: [n, t, sorted(c), *([self.fingerprints[k]] if k in self.fingerprints else [])]
                    for k, (n, t, c) in sorted(self.entities.items())
                },
                "x": [[a, b, w] for (a, b), w in sorted(self.edges.items())],
            },
            separators=(",", ":"),
        )


@dataclass(frozen=True, slots=True)
class ContributionResult:
    """Whether the change applied, which entities it touched, which communities it marked,
    and (answering a delete) whose summaries await withdrawal."""

    applied: bool
    touched: list[str]
    marked: list[str]
    withdraw: list[str] = field(default_factory=list)
