"""Claimed turns (pure): a writer that numbers a turn from the session's last one sends it
with ``if_absent``, and it is written only if that turn holds nothing else.

Two writers that read the session's last turn at the same moment take the same number. The
turns of a session are one Kafka key, applied in order by one consumer, so the first claim
to be applied wins and the second is refused (``turn_taken``): its writer takes the next
number and sends it again. Without the claim the second would replace the first, and
neither writer would know (decision 0069).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from memory.records import MemoryItem

#: The ``error_code`` of the ack of a claimed turn that held another writer's.
TURN_TAKEN = "turn_taken"

#: What a turn holds: its content and metadata (the role among them), or None when empty.
Held = tuple[str, Mapping[str, object]] | None


def claimed(items: Sequence[MemoryItem]) -> list[tuple[str, str]]:
    """The (tenant, doc id) of every turn ``items`` claim, once each, in order."""
    return list(dict.fromkeys((i.tenant, i.doc_id) for i in items if i.if_absent and i.op == "upsert"))


def claims_apart(
    items: Sequence[MemoryItem],
    stored: Mapping[tuple[str, str], Held],
    *,
    elsewhere: Collection[tuple[str, str]] = (),
) -> tuple[list[MemoryItem], list[tuple[MemoryItem, str]], list[tuple[MemoryItem, MemoryItem | None]]]:
    """``items`` without the claims whose turn holds something else by the time each would
    apply, in batch order (what is ``stored`` for each claimed turn, then what the batch's
    earlier items leave there: a write, a delete or a forget's delete); those refused, with
    why; and the claims of exactly what the turn already holds (a redelivery, a writer's
    retry), which change nothing, each with the earlier item of the batch that writes it
    (None: the stored turn holds it), whose outcome is theirs. Written, the turn would take
    the retry's time, and an agent's "where did I leave off" would find a turn of days ago
    among its latest.

    ``elsewhere``: the turns whose ``stored`` content was read from another index than the
    one being written (a reindex's old generation): a claim of what one holds is written,
    as the new index lacks it.
    """
    now: dict[tuple[str, str], Held] = {k: stored.get(k) for k in claimed(items)}
    # Which item of the batch writes ``now`` (None: nothing of the batch; what is stored).
    writer: dict[tuple[str, str], MemoryItem | None] = {k: None for k in now}
    kept: list[MemoryItem] = []
    refused: list[tuple[MemoryItem, str]] = []
    unchanged: list[tuple[MemoryItem, MemoryItem | None]] = []
    for item in items:
        key = (item.tenant, item.doc_id)
        if key not in now:
            kept.append(item)
            continue
        mine: Held = (item.content, item.metadata) if item.op == "upsert" else None
        there = now[key]
        if item.if_absent and item.op == "upsert":
            if there is not None and there == mine and (writer[key] is not None or key not in elsewhere):
                unchanged.append((item, writer[key]))
                continue
            if not _same_turn(there, mine):
                refused.append((item, taken_reason(item)))
                continue
        now[key], writer[key] = mine, item
        kept.append(item)
    return kept, refused, unchanged


def _same_turn(there: Held, mine: Held) -> bool:
    """Whether a turn that holds ``there`` is free for ``mine``: empty, or the same turn. (A
    turn is written in one transaction, never in slices: one that holds the start of a claim's
    text holds another turn, and "The build failed today" is not "The build failed today.".)"""
    return there is None or there == mine


def taken_reason(item: MemoryItem) -> str:
    """Why a claimed turn was not written."""
    turn = item.metadata.get("turn")
    return (
        f"turn {turn} of this session holds another turn (another writer took the same number, or a write "
        "just before this one did): this event changed nothing; send it again as the next turn"
    )
