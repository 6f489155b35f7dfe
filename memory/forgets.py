"""A ``forget``: the deletes of every doc it covers, made in its place, and their outcomes
folded back into the forget's own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog

from memory.change_hook import ChangeHook
from memory.conversation import parse_turn
from memory.errors import MemdError
from memory.index import ChunkIndex
from memory.ingest_report import IngestReport, ItemOutcome
from memory.records import MemoryItem
from memory.retrying import Retrying

log = structlog.get_logger()


async def expand_forgets(
    items: Sequence[MemoryItem], *, index: ChunkIndex, retrying: Retrying, hook: ChangeHook[Any] | None = None
) -> tuple[list[MemoryItem], dict[int, MemoryItem]]:
    """Each ``forget`` replaced, in its place, by a delete of every doc it covers: those
    stored (listed by their tags), those the ``hook`` still holds (a doc whose chunks an
    earlier delivery deleted before it crashed, its graph contribution not yet), and those
    earlier in this batch (not written yet). Returns the items and, for each delete made,
    the forget it stands for.

    A later item of a forgotten doc in the batch still applies after the delete, as
    the turn of a session that goes on after the forget. A forget of one turn (its doc id a
    turn's) covers the docs of its session with that turn number: the turn's id, and the
    one it was stored under before ids were percent-encoded.
    """
    if not any(i.op == "forget" for i in items):
        return list(items), {}
    out: list[MemoryItem] = []
    origin: dict[int, MemoryItem] = {}
    for item in items:
        if item.op != "forget":
            out.append(item)
            continue
        one = parse_turn(item.doc_id)
        prefix = item.doc_id if one is None else one.session
        stored = await retrying(
            "forget listing",
            lambda item=item: index.doc_ids_where(item.tenant, item.tags),  # type: ignore[misc]
        )
        if hook is not None:
            stored |= await retrying(
                "forget listing",
                lambda item=item, prefix=prefix: hook.docs_under(item.tenant, prefix),  # type: ignore[misc]
            )
        # Stored docs are matched by their tags (exactly, in doc_ids_where), not by the id
        # prefix: turns stored before ids were percent-encoded carry the same tags under
        # another id. The batch's own turns are not stored yet: matched by prefix.
        earlier = {i.doc_id for i in out if i.tenant == item.tenant and i.op == "upsert"}
        covered = sorted(stored | {d for d in earlier if d.startswith(prefix)})
        if one is not None:
            covered = [d for d in covered if (ref := parse_turn(d)) is not None and ref.turn == one.turn]
        log.info("ingest.forget_planned", prefix=item.doc_id, docs=len(covered), tenant=item.tenant)
        for doc_id in covered:
            delete = MemoryItem(
                op="delete", doc_id=doc_id, version=None, kind=item.kind, tags=item.tags, tenant=item.tenant
            )
            origin[id(delete)] = item
            out.append(delete)
    return out, origin


def fold_forgets(report: IngestReport, forgets: dict[int, MemoryItem], asked: Sequence[MemoryItem]) -> None:
    """Report the batch's forgets as the events they are, in place.

    Args:
        report: the batch's report, its deletes' outcomes among them.
        forgets: for each delete made (by ``id``), the forget it stands for (``expand_forgets``).
        asked: the batch's forget items.
    """
    removed: dict[int, int] = {}  # forget (by id) -> the turns its deletes removed
    for delete_id, origin in forgets.items():
        if (done := report.outcomes.get(delete_id)) is not None and done.status == "indexed":
            removed[id(origin)] = removed.get(id(origin), 0) + 1
    if forgets:
        # A delete a forget stood for failed: the forget (the event) failed, once.
        by_event: dict[int, tuple[MemoryItem, MemdError]] = {}
        for item, exc in report.failed:
            origin = forgets.get(id(item), item)
            by_event.setdefault(id(origin), (origin, exc))
        report.failed = list(by_event.values())
        for delete_id in forgets:
            report.outcomes.pop(delete_id, None)
    # A forget that covered nothing (an empty session, a redelivery) did all it had to.
    failed_now = {id(i) for i, _ in report.failed}
    for forget in asked:
        if id(forget) not in failed_now:
            report.outcomes[id(forget)] = ItemOutcome("indexed", chunks=0, forgotten=removed.get(id(forget), 0))
