"""Which dead letters were sent again (``agentmemd dlq replay``), kept in Redis
(``memory.keys.replayed_key``): a Kafka record cannot be changed, and an operator who sends one
twice may undo what came after it (a forget sent again removes the turns written since).

A mark is keyed by the DLQ record's place and keeps what the letter said of its original
(topic, partition, offset, when it failed): a DLQ topic created anew (the embedded broker
forgets its topics when it restarts) reuses places, and a mark then matches no letter.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from daemon.explore.dlq import DeadLetter
from memory.index import translate_errors
from memory.keys import replayed_key
from memory.schema import as_str


@dataclass(frozen=True, slots=True)
class ReplayMark:
    """A dead letter sent again: when (Redis's clock), to which topic, what its ack said (or
    ``sent``), the letter it was (``letter_id``), and whether its ack refused it (``refused``:
    nothing was applied, so it may be sent once more without ``--again``)."""

    at: float
    to: str
    said: str
    letter: list[Any]
    refused: bool = False

    @property
    def when(self) -> str:
        """When, as the dead letters' own times are shown (ISO 8601, UTC, to the second)."""
        return datetime.fromtimestamp(self.at, UTC).isoformat(timespec="seconds")


def letter_id(letter: DeadLetter) -> list[Any]:
    """What tells one dead letter from another at the same place (pure)."""
    return [letter.topic, letter.original_partition, letter.original_offset, letter.failed_at]


def _field(dlq_topic: str, letter: DeadLetter) -> str:
    return f"{dlq_topic}:{letter.partition}:{letter.offset}"


def mark_of(letter: DeadLetter, dlq_topic: str, marks: Mapping[str, ReplayMark]) -> ReplayMark | None:
    """``letter``'s mark among ``marks`` (``read_marks``), if it was sent again (pure)."""
    mark = marks.get(_field(dlq_topic, letter))
    return mark if mark is not None and mark.letter == letter_id(letter) else None


async def read_marks(client: Any, name: str) -> dict[str, ReplayMark]:
    """Every mark of index ``name``.

    Raises:
        BackendUnavailable: Redis is unreachable.
    """
    async with translate_errors("dead letter marks"):
        raw = await client.hgetall(replayed_key(name))
    marks: dict[str, ReplayMark] = {}
    for key, value in raw.items():
        try:
            d = json.loads(value)
            marks[as_str(key)] = ReplayMark(
                at=float(d["at"]),
                to=str(d["to"]),
                said=str(d["said"]),
                letter=d["letter"],
                refused=d.get("refused") is True,
            )
        except (ValueError, KeyError, TypeError):
            continue  # not ours to read: as if unmarked
    return marks


async def mark_replayed(
    client: Any, name: str, dlq_topic: str, letter: DeadLetter, *, to: str, said: str, refused: bool = False
) -> None:
    """Mark ``letter`` sent again to ``to``, its ack having said ``said`` (``refused``: it
    refused the event, which was dead-lettered again or not applied).

    Raises:
        BackendUnavailable: Redis is unreachable.
    """
    async with translate_errors("dead letter marks"):
        seconds, micros = await client.time()  # Redis's clock, as every time the daemons keep
        body = {"at": seconds + micros / 1e6, "to": to, "said": said, "letter": letter_id(letter), "refused": refused}
        await client.hset(replayed_key(name), _field(dlq_topic, letter), json.dumps(body, ensure_ascii=False))


async def tenant_marks(client: Any, name: str, topics: Sequence[str]) -> None:
    """Delete the marks of the dead letters whose originals came from ``topics`` (an erased
    tenant's), or were sent there.

    Raises:
        BackendUnavailable: Redis is unreachable.
    """
    wanted = set(topics)
    gone = [f for f, m in (await read_marks(client, name)).items() if wanted & {m.to, *map(str, m.letter[:1])}]
    if gone:
        async with translate_errors("dead letter marks"):
            await client.hdel(replayed_key(name), *gone)
