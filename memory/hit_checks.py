"""The exact checks on the legs' hits before fusion: the filter's exact values, the time
range and the write markers (``memory.visibility``), each leg's ranked list of the hits that
pass, and the version check a winner read whole passes too. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from memory.filters import TagFilter, in_time
from memory.identifiers import identifier_ranks
from memory.index import LegHit
from memory.records import StoredChunk
from memory.search_spec import SearchSpec
from memory.visibility import WriteMarker, visible


def marker_docs(results: Iterable[Iterable[StoredChunk | LegHit]], tenant: str) -> set[tuple[int, str, str]]:
    """The write markers that may hide hits of ``results``: ``(generation, tenant, doc_id)``,
    each hit's own generation."""
    return {(h.generation, tenant, h.doc_id) for found in results for h in found if h.generation is not None}


def shown(hit: StoredChunk | LegHit, markers: Mapping[tuple[int, str, str], WriteMarker], tenant: str) -> bool:
    """Whether ``markers`` let a query show ``hit`` (a hit of no generation: always)."""
    if hit.generation is None:
        return True
    return visible(hit.version, markers.get((hit.generation, tenant, hit.doc_id)))


def leg_lists(
    names: Sequence[str],
    results: Sequence[Sequence[LegHit]],
    spec: SearchSpec,
    flt: TagFilter,
    idents: Sequence[str],
    markers: Mapping[tuple[int, str, str], WriteMarker],
) -> tuple[dict[str, list[str] | dict[str, int]], dict[str, LegHit]]:
    """Each leg's ranked ids of the hits that pass the exact checks (and ``markers``), and
    every such hit by id."""
    by_id: dict[str, LegHit] = {}
    legs: dict[str, list[str] | dict[str, int]] = {}
    for name, found in zip(names, results, strict=True):
        # A hash collision could let a text leg return a chunk outside the filter: every
        # hit is checked against the exact values (the tenant above all) before fusion.
        hits = [
            h
            for h in found
            if flt.matches(h.tags)
            and in_time(h.timestamp, spec.since, spec.until)
            and (not markers or shown(h, markers, spec.tenant))
        ]
        if name == "identifier":
            # An exact identifier match says which chunks, not in what order: hits naming
            # as many of the query's identifiers tie, and the other legs order them.
            legs[name] = identifier_ranks([(h.chunk_id, h.idents) for h in hits], list(idents))
        else:
            legs[name] = [h.chunk_id for h in hits]
        for h in hits:
            by_id.setdefault(h.chunk_id, h)
    return legs, by_id
