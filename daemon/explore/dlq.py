"""The DLQ's recent records, for people: read with a short-lived consumer, previewed safely.

The reader joins no group and commits nothing: it is assigned every partition of the DLQ
topic, seeks to the last ``limit`` records of each, and reads up to each log's end or a
deadline, whichever comes first. The preview is pure: the original bytes cut short, shown as
text where they are UTF-8 and as hex where they are not (the page escapes either).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from consumers.kafka_clients import cluster_metadata
from consumers.topic_names import tenant_from_topic, topic_base
from daemon.lost_logs import log_ends
from daemon.teardown import bounded
from memory.errors import BackendUnavailable
from memory.tenants import Erasure, refused

#: Bytes of an original record the preview shows.
PREVIEW_BYTES = 2048


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One DLQ record as the explorer shows it; ``tenant`` is that of the original's topic."""

    partition: int  # of the DLQ topic
    offset: int
    tenant: str | None
    reason: str
    code: str
    topic: str  # of the original record
    original_partition: int | None
    original_offset: int | None
    failed_at: str
    attempts: int
    size: int
    preview: str
    preview_kind: str  # "text", "hex", "none" (the bytes were left out of the record)
    cut: bool


@dataclass
class DlqCache:
    """The last whole read of the DLQ, given again while every partition's log still starts and
    ends where it did: a page viewed again reads no record again (each may be ~1 MB)."""

    key: tuple[str, int] | None = None  # (topic, records per partition)
    bounds: dict[int, tuple[int, int]] = field(default_factory=dict)  # partition -> (start, end)
    letters: list[DeadLetter] = field(default_factory=list)
    reads: int = 0  # whole reads made (the cache's hits are the views beyond them)


def preview(raw: bytes, limit: int = PREVIEW_BYTES) -> tuple[str, str, bool]:
    """``(text, kind, cut)``: the first ``limit`` bytes as text (``kind`` "text") when they are
    UTF-8 without control characters but tab and line ends (a character the cut split is
    dropped), else as hex bytes with their printable ASCII (``kind`` "hex")."""
    head, cut = raw[:limit], len(raw) > limit
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Only a character split at the cut: the rest is text.
        if not (cut and exc.start >= len(head) - 3 and exc.reason == "unexpected end of data"):
            return hex_lines(head[:512]), "hex", cut or len(head) > 512
        text = head[: exc.start].decode("utf-8")
    if any((ord(c) < 32 and c not in "\t\n\r") or ord(c) == 127 for c in text):
        return hex_lines(head[:512]), "hex", cut or len(head) > 512
    return text, "text", cut


def hex_lines(raw: bytes, width: int = 16) -> str:
    """Bytes as ``hexdump -C`` shows them: hex, then the printable ASCII (``.`` for the rest)."""
    lines = []
    for at in range(0, len(raw), width):
        row = raw[at : at + width]
        shown = "".join(chr(b) if 32 <= b < 127 else "." for b in row)
        lines.append(f"{at:04x}  {row.hex(' '):<{3 * width - 1}}  |{shown}|")
    return "\n".join(lines)


def dead_letter(partition: int, offset: int, value: bytes | None, *, bases: Sequence[str], tenancy: str) -> DeadLetter:
    """A DLQ record's value read leniently: a record that is no DLQ JSON is shown as bytes."""
    try:
        body: Any = json.loads(value or b"")
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict):
        text, kind, cut = preview(value or b"")
        return DeadLetter(partition, offset, None, "not a DLQ record", "?", "?", None, None, "", 0, 0, text, kind, cut)
    topic = str(body.get("topic", "?"))
    original = _original(body)
    # No bytes: left out of the record (too large), or an empty message (nothing to leave out).
    text, kind, cut = preview(original) if original or not left_out(body) else ("", "none", False)
    return DeadLetter(
        partition=partition,
        offset=offset,
        tenant=tenant_of(topic, bases, tenancy),
        reason=str(body.get("reason", "")),
        code=str(body.get("error_code", "")),
        topic=topic,
        original_partition=_int(body.get("partition")),
        original_offset=_int(body.get("offset")),
        failed_at=str(body.get("failed_at", "")),
        attempts=_int(body.get("attempts")) or 0,
        size=_int(body.get("original_size")) or len(original),
        preview=text,
        preview_kind=kind,
        cut=cut or bool(body.get("original_truncated")),
    )


def erased_letter(letter: DeadLetter, erased: Mapping[str, Erasure]) -> bool:
    """Whether ``letter`` holds an erased tenant's event from before its erasure: never shown,
    nor sent again (a Kafka record cannot be deleted alone, so the DLQ keeps it until its
    retention). Dead-lettered at or before the erasure, or at an unknown time, is before it."""
    try:
        failed = datetime.fromisoformat(letter.failed_at)
    except ValueError:
        return refused(erased, letter.tenant, None)
    if failed.tzinfo is None:  # a time without a zone is UTC, as everywhere in the contract
        failed = failed.replace(tzinfo=UTC)
    return refused(erased, letter.tenant, int(failed.timestamp() * 1000))


def tenant_of(topic: str, bases: Sequence[str], tenancy: str) -> str | None:
    """The tenant of a record of ``topic``: that of the first input topic ``bases`` it belongs to."""
    base = topic_base(topic, bases)
    return None if base is None else tenant_from_topic(topic, base, tenancy)


def left_out(body: Mapping[str, Any]) -> bool:
    """Whether a DLQ record left its original's bytes out (too large to keep; an empty message
    kept nothing, and left nothing out)."""
    return bool(body.get("original_truncated")) or (not body.get("original_b64") and bool(body.get("original_size")))


def _original(body: Mapping[str, Any]) -> bytes:
    b64 = body.get("original_b64")
    if isinstance(b64, str) and b64:
        try:
            return base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            pass
    text = body.get("original_text")
    return text.encode("utf-8", "replace") if isinstance(text, str) else b""


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def recent_dead_letters(
    *,
    bootstrap: str,
    topic: str,
    options: Mapping[str, Any],
    limit: int,
    wait_s: float,
    bases: Sequence[str],
    tenancy: str,
    cache: DlqCache | None = None,
) -> list[DeadLetter]:
    """The last ``limit`` records of each partition of the DLQ ``topic``, newest first
    (``cache``'s, when no log has moved since it was filled).

    Raises:
        BackendUnavailable: the broker could not be asked.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        request_timeout_ms=5000,
        fetch_max_wait_ms=50,
        **options,
    )
    out: list[DeadLetter] = []
    try:
        await asyncio.wait_for(consumer.start(), wait_s)
        parts = (await cluster_metadata(consumer)).partitions_for_topic(topic)
        tps = [TopicPartition(topic, p) for p in sorted(parts or ())]
        if not tps:
            return []
        ends = await asyncio.wait_for(log_ends(consumer, tps, wait_s=min(1.0, wait_s)), wait_s)
        starts = await consumer.beginning_offsets(tps)
        bounds = {tp.partition: (starts.get(tp, 0), ends[tp]) for tp in tps}
        if cache is not None and cache.key == (topic, limit) and cache.bounds == bounds:
            return list(cache.letters)
        for tp in tps:
            consumer.seek(tp, max(starts.get(tp, 0), ends[tp] - limit))
        todo = {tp for tp in tps if ends[tp] > max(starts.get(tp, 0), ends[tp] - limit)}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while todo and loop.time() < deadline:
            batch = await consumer.getmany(*todo, timeout_ms=200)
            for tp, records in batch.items():
                for r in records:
                    if r.offset < ends[tp]:
                        out.append(dead_letter(tp.partition, r.offset, r.value, bases=bases, tenancy=tenancy))
                if records and records[-1].offset + 1 >= ends[tp]:
                    todo.discard(tp)
        out.sort(key=lambda d: (d.failed_at, d.partition, d.offset), reverse=True)
        if cache is not None and not todo:  # a read cut short by the deadline is not kept
            cache.key, cache.bounds, cache.letters = (topic, limit), bounds, list(out)
            cache.reads += 1
    except (KafkaError, OSError, TimeoutError) as exc:
        raise BackendUnavailable(f"the DLQ could not be read: {type(exc).__name__}: {exc}") from exc
    finally:
        await bounded("stop the DLQ reader", consumer.stop())
    return out
