"""What a system under test does (``System``), and what it records when a search breaks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TOP_K = 10


class SearchFailed(Exception):
    """A search that returned no answer (an HTTP error, a dropped connection, a crash)."""


@dataclass
class Breaks:
    """What went wrong in one system's run, query by query."""

    events: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kind: str, mode: str, workload: str, query: str, detail: str) -> None:
        self.events.append({"kind": kind, "mode": mode, "set": workload, "query": query, "detail": detail[:600]})

    def count(self, kind: str, mode: str | None = None) -> int:
        return sum(1 for e in self.events if e["kind"] == kind and (mode is None or e["mode"] == mode))


class System:
    """One memory system under test; subclasses say how it ingests and answers."""

    name = ""

    def __init__(self, modes: list[str]) -> None:
        self.modes = modes
        self.breaks = Breaks()

    async def ingest_docs(self, docs: list[tuple[str, str]]) -> float:
        """Submit every doc; seconds until all are searchable."""
        raise NotImplementedError

    async def ingest_turns(self, turns: list[Any]) -> float:
        raise NotImplementedError

    async def search_docs(self, text: str, mode: str) -> list[str]:
        """SciFact doc ids, best first (at most TOP_K)."""
        raise NotImplementedError

    async def search_turns(self, text: str, agent: str, mode: str) -> list[str]:
        """Turn ids (``<conversation>/session_<N>/<turn>``) of that conversation, best first."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError
