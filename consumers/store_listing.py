"""The store's reads of the contract's ``list`` op: pages of doc ids or sources under a prefix."""

from __future__ import annotations

from typing import Literal

from consumers.client import MemoryClient
from consumers.requests import MAX_LIST_VALUES

#: Values one ``list`` request asks for: the contract's most.
LIST_PAGE = MAX_LIST_VALUES


async def list_page(
    c: MemoryClient, field: Literal["doc_id", "source"], prefix: str, offset: int, limit: int
) -> tuple[list[str], bool]:
    """Up to ``limit`` (at most ``LIST_PAGE``) values of ``field`` under ``prefix`` from
    ``offset``, and whether more may follow (a reply cut to fit one record is asked again from
    where it ended)."""
    values: list[str] = []
    while len(values) < limit:
        reply = await c.list_values(field, source_prefix=prefix, limit=limit - len(values), offset=offset + len(values))
        values += reply.values
        if len(values) < limit and not reply.truncated:
            return values, False
        if not reply.values:  # nothing fitted: no further progress to make
            return values, False
    return values, True


async def all_values(c: MemoryClient, field: Literal["doc_id", "source"], prefix: str) -> list[str]:
    """Every value of ``field`` under ``prefix``, a page at a time."""
    out: list[str] = []
    while True:
        page, more = await list_page(c, field, prefix, len(out), LIST_PAGE)
        out += page
        if not more:
            return out
