"""How a batch is cut into work: one item per doc (``coalesce``), then groups of about a
target number of chunks, embedded one after the other (``embedding_groups``). Pure."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from memory.records import MemoryItem


def coalesce(items: Sequence[MemoryItem]) -> list[MemoryItem]:
    """Keep one item per doc: the highest version, or the last one when unversioned.

    Only the final state of a doc matters, and a version at or below the stored one is
    ignored anyway, so earlier items of the same doc in a batch need no work at all.
    Order of first appearance is kept.
    """
    best: dict[tuple[str, str], MemoryItem] = {}
    for item in items:
        cur = best.get((item.tenant, item.doc_id))
        if cur is None or item.version is None or (cur.version is not None and item.version > cur.version):
            best[(item.tenant, item.doc_id)] = item
    return list(best.values())


def passed_over(items: Sequence[MemoryItem], kept: Sequence[MemoryItem]) -> dict[int, list[MemoryItem]]:
    """For each versioned document item of ``kept`` (by ``id``), the items of its doc that
    ``coalesce`` passed over for it and that would have been written had the batch's items
    come one at a time: each above every version before it in the batch (a lower one that
    came after a higher one would have been ignored, and never held). Never written, yet said:
    a document's history keeps them (``memory.index.history``, which also leaves out those at
    or below the stored version). Docs with none are left out (pure)."""
    wanted = {(k.tenant, k.doc_id): k for k in kept if k.version is not None and k.kind == "document"}
    highest: dict[tuple[str, str], int] = {}
    out: dict[int, list[MemoryItem]] = {}
    for item in items:
        doc = (item.tenant, item.doc_id)
        k = wanted.get(doc)
        if item is k:
            highest[doc] = k.version or 0  # what comes after the kept one is below it: ignored
        if k is None or item is k or item.version is None or item.version >= (k.version or 0):
            continue
        if item.version <= highest.get(doc, -1):
            continue  # after a higher version of the batch: ignored, had it come alone
        if item.op == "upsert" and not says_something(item.content):
            continue  # dead-lettered, had it come alone: it never held
        highest[doc] = item.version
        out.setdefault(id(k), []).append(item)
    return out


def says_something(content: str) -> bool:
    """Whether ``content`` holds a character the model's tokenizer reads: one that is not
    whitespace, a control, format or private-use character, a combining mark on its own, or
    the replacement character, all of which it drops (pure)."""
    return any(not ch.isspace() and ch != "\ufffd" and unicodedata.category(ch)[0] not in "CMZ" for ch in content)


def embedding_groups(sizes: Sequence[int], target: int) -> list[range]:
    """Split a batch's docs, in order, into groups of about ``target`` chunks each.

    A group is closed as soon as it holds ``target`` chunks or more, so a doc is never
    split and only the last group may be smaller. Docs without chunks (deletes) ride
    along with their neighbours.

    Args:
        sizes: the number of chunks of each doc.
        target: chunks per group (at least 1).

    Returns:
        Consecutive index ranges covering every doc; empty for an empty batch.
    """
    groups: list[range] = []
    start, chunks = 0, 0
    for i, n in enumerate(sizes):
        chunks += n
        if chunks >= max(target, 1):
            groups.append(range(start, i + 1))
            start, chunks = i + 1, 0
    if start < len(sizes):
        groups.append(range(start, len(sizes)))
    return groups
