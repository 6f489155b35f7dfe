"""Dead letters sent again (``agentmemd dlq replay``): which records, and what each republishes.

A DLQ record (``consumers.events.DlqRecord``) keeps the original event's topic, key and bytes.
Once the cause is fixed (a writer's bug, a setting), the event can be sent again as it was,
under its own key, so it keeps its place in its key's order; the daemon judges it as any event.
:func:`replay_of` is pure; :func:`read_dead_letters` reads the named records.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from consumers.kafka_clients import cluster_metadata
from consumers.topic_names import tenant_from_topic, tenant_topic, topic_base
from daemon.explore.dlq import left_out
from daemon.lost_logs import log_ends
from daemon.teardown import bounded
from memory.errors import BackendUnavailable, InvalidRequest


@dataclass(frozen=True, slots=True)
class Replay:
    """What one dead letter sends again: the original's bytes, to its topic, under its key."""

    topic: str
    key: str
    value: bytes


def parse_position(text: str) -> tuple[int, int]:
    """``PARTITION:OFFSET`` of a DLQ record, as the list prints it.

    Raises:
        InvalidRequest: not two whole numbers.
    """
    part, sep, offset = text.partition(":")
    if not sep or not part.isdigit() or not offset.isdigit():
        raise InvalidRequest(f"a dead letter is named PARTITION:OFFSET (as `agentmemd dlq list` shows), got {text!r}")
    return int(part), int(offset)


def replay_of(value: bytes | None, record_key: bytes | None, inputs: Sequence[str], *, kept: bool = True) -> Replay:
    """What a DLQ record's value sends again; ``kept``: its original is needed (not when another
    event is sent in its place: then ``value`` is empty if it was left out).

    Raises:
        InvalidRequest: no DLQ record; (``kept``) its original was left out (too large to
            keep); its topic is none of ``inputs`` (nor a tenant's of one); or it kept no key.
    """
    body = _letter_body(value)
    topic: str = body["topic"]
    where = f"{topic} partition {body.get('partition')} offset {body.get('offset')}"
    if kept and left_out(body):
        raise InvalidRequest(
            f"its original was too large to keep in the DLQ: publish it again from its source, "
            f"or from {where} while that topic retains it"
        )
    if kept and not body.get("original_b64"):
        raise InvalidRequest("its original is an empty message: there is nothing to send again")
    if topic_base(topic, inputs) is None:
        raise InvalidRequest(f"its topic {topic!r} is no input topic of this deployment")
    try:
        original = base64.b64decode(body.get("original_b64") or "", validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise InvalidRequest("its original_b64 is not base64") from None
    key = _key(record_key, body.get("key"))
    if key is None:
        raise InvalidRequest(
            f"it has no UTF-8 key to send it under (published without one, or not kept): republish {where}"
        )
    return Replay(topic=topic, key=key, value=original)


def original_of(value: bytes | None) -> bytes:
    """A DLQ record's original event, byte for byte (empty for an empty message), whatever its
    key (``dlq original`` prints it; sending it again is ``replay_of``'s to judge).

    Raises:
        InvalidRequest: no DLQ record, or its original was left out (too large to keep).
    """
    body = _letter_body(value)
    if left_out(body):
        raise InvalidRequest(
            f"its original was too large to keep in the DLQ: read it from {body['topic']} partition "
            f"{body.get('partition')} offset {body.get('offset')} while that topic retains it"
        )
    try:
        return base64.b64decode(body.get("original_b64") or "", validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise InvalidRequest("its original_b64 is not base64") from None


def _letter_body(value: bytes | None) -> dict[str, Any]:
    """A DLQ record's JSON object, naming its original's topic.

    Raises:
        InvalidRequest: it is none.
    """
    try:
        body: Any = json.loads(value or b"")
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("topic"), str):
        raise InvalidRequest("this record is no dead letter of the daemon's")
    return body


def keyed_as(value: bytes) -> str | None:
    """The key the contract gives an event (pure): a document's ``doc_id``; a turn's, or a
    session's forget's, ``agent_id/session_id``; an agent-wide forget's ``agent_id``. None
    for bytes that name none of these (the daemon judges them)."""
    try:
        body: Any = json.loads(value)
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict):
        return None
    if isinstance(doc := body.get("doc_id"), str):
        return doc
    agent, session = body.get("agent_id"), body.get("session_id")
    if not isinstance(agent, str):
        return None
    return f"{agent}/{session}" if isinstance(session, str) else agent


def corrected(replay: Replay, value: bytes) -> Replay:
    """``replay`` with ``value`` sent in place of its original (``dlq replay --with``).

    Raises:
        InvalidRequest: ``value`` names another document or session than the original's key:
            sent under that key, it would not keep its own key's order.
    """
    key = keyed_as(value)
    if key is not None and key != replay.key:
        raise InvalidRequest(
            f"the corrected event is keyed {key!r}, its dead letter {replay.key!r}: a write keeps its place in "
            "its own key's order, so send an event of another document or session as a new one (agentmemd publish)"
        )
    return Replay(topic=replay.topic, key=replay.key, value=value)


def destination(replay: Replay, tenant: str | None, inputs: Sequence[str], tenancy: str) -> Replay:
    """Where ``replay`` goes (pure): back to its own topic, or, with ``tenant`` (``dlq replay
    --tenant``), to that tenant's, for an event a writer published in topic tenancy on an input
    topic that names no tenant (the bare one, or one like ``memory.documents.a.b``).

    Raises:
        InvalidRequest: without ``tenant``, an event of a topic that names no tenant in topic
            tenancy (sent back, it would be refused again); with it, single tenancy, an event
            whose topic names a tenant already (a dead letter goes back to its own tenant), or
            ``tenant`` no valid tenant name.
    """
    base = topic_base(replay.topic, inputs)
    if base is None:
        raise InvalidRequest(f"its topic {replay.topic!r} is no input topic of this deployment")
    named = tenancy == "single" or tenant_from_topic(replay.topic, base, tenancy) is not None
    if tenant is None:
        if not named:
            raise InvalidRequest(
                f"its topic {replay.topic} names no tenant, which the daemon refuses: send it to its "
                "tenant's with --tenant NAME"
            )
        return replay
    if tenancy == "single":
        raise InvalidRequest(
            "--tenant needs AGENTMEM_CONSUMER__TENANCY=topic: in single mode every event is the 'default' tenant's"
        )
    if named:
        raise InvalidRequest(
            f"its topic {replay.topic!r} names its tenant already: --tenant is for an event published on a "
            f"topic that names none (a bare one, {' or '.join(inputs)}, or one such as {inputs[0]}.a.b)"
        )
    return Replay(topic=tenant_topic(base, tenant), key=replay.key, value=replay.value)


def _key(record_key: bytes | None, body_key: Any) -> str | None:
    if record_key is not None:
        try:
            return record_key.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return body_key if isinstance(body_key, str) else None


async def read_dead_letters(
    *, bootstrap: str, topic: str, options: Mapping[str, Any], positions: Sequence[tuple[int, int]], wait_s: float
) -> dict[tuple[int, int], tuple[bytes | None, bytes | None]]:
    """The value and key of each named DLQ record (those the log still holds).

    Raises:
        BackendUnavailable: the broker could not be asked.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, request_timeout_ms=5000, fetch_max_wait_ms=50, **options
    )
    found: dict[tuple[int, int], tuple[bytes | None, bytes | None]] = {}
    try:
        await asyncio.wait_for(consumer.start(), wait_s)
        parts = (await cluster_metadata(consumer)).partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        ends = await asyncio.wait_for(log_ends(consumer, tps, wait_s=min(1.0, wait_s)), wait_s) if tps else {}
        starts = await consumer.beginning_offsets(tps) if tps else {}
        loop = asyncio.get_running_loop()
        for partition, offset in dict.fromkeys(positions):
            tp = TopicPartition(topic, partition)
            if tp not in ends or not starts.get(tp, 0) <= offset < ends[tp]:
                continue  # no such partition, or the log no longer (or never) held it
            consumer.assign([tp])
            consumer.seek(tp, offset)
            deadline = loop.time() + wait_s
            while (partition, offset) not in found and loop.time() < deadline:
                batch = await consumer.getmany(tp, timeout_ms=200, max_records=1)
                records = batch.get(tp, [])
                for record in records:
                    if record.offset == offset:
                        found[(partition, offset)] = (record.value, record.key)
                if records and records[-1].offset > offset:
                    break  # the log holds no record there (a gap in its offsets)
    except (KafkaError, OSError, TimeoutError) as exc:
        raise BackendUnavailable(f"the DLQ could not be read: {type(exc).__name__}: {exc}") from exc
    finally:
        await bounded("stop the DLQ reader", consumer.stop())
    return found
