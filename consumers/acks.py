"""Write acknowledgements (pure): which records of a batch want one, and what each says.

An event on the documents or transcripts topic that carries ``reply_to`` and
``correlation_id`` headers is acknowledged once its batch is applied (after the Redis writes,
before the offset commit): a redelivery after a crash is acknowledged again, as ``indexed``
when the version it carries is the stored one. Publishing is the router's (consumers.routers).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from consumers.decoding import Decoded
from consumers.errors import TenantErased
from consumers.events import WriteAck
from consumers.fields import CLOCK_VERSIONS_FROM, MAX_DOC_ID_CHARS, MAX_VERSION
from consumers.requests import TurnKey
from memory.conversation import turn_doc_id
from memory.ingest_report import IngestReport, ItemOutcome
from memory.replays import differs_between

#: (topic, partition, offset) of a record.
Position = tuple[str, int, int]


def ack_route(headers: Sequence[tuple[str, bytes]] | None) -> tuple[str, str] | None:
    """``(reply_to, correlation_id)`` of a record that asks for an ack, else None."""
    found = {k: v for k, v in headers or ()}
    reply_to = (found.get("reply_to") or b"").decode("utf-8", "replace")
    cid = (found.get("correlation_id") or b"").decode("utf-8", "replace")
    return (reply_to, cid) if reply_to and cid else None


_TURN_KEY = TypeAdapter(TurnKey)


def _turn_of(agent: Any, session: Any, turn: Any) -> tuple[str, str, int] | None:
    """``(agent_id, session_id, turn)`` where the three are valid as a turn's, else None."""
    try:
        key = _TURN_KEY.validate_python({"agent_id": agent, "session_id": session, "turn": turn})
    except ValidationError:
        return None
    return key.agent_id, key.session_id, key.turn


def _named(raw: bytes | None) -> dict[str, Any]:
    """The ``event_id``, ``doc_id`` and ``version`` a record's JSON names, where each is valid
    as such: an event refused before it decoded (too large, a bad field) is still acked under
    its names."""
    try:
        data: Any = json.loads(raw or b"")
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        return {"event_id": None}
    eid, doc_id, version = data.get("event_id"), data.get("doc_id"), data.get("version")
    agent, session, turn = data.get("agent_id"), data.get("session_id"), data.get("turn")
    if doc_id is None and (where := _turn_of(agent, session, turn)) is not None:
        doc_id = turn_doc_id(*where)  # a turn is named by where it was said
    return {
        "event_id": eid if isinstance(eid, str) and 0 < len(eid) <= 256 else None,
        "doc_id": doc_id if isinstance(doc_id, str) and 0 < len(doc_id) <= MAX_DOC_ID_CHARS else None,
        "version": version if type(version) is int and 0 <= version <= MAX_VERSION else None,
    }


#: The ``error_code`` of an ``ignored`` ack whose write was refused, not merely a retry: its
#: version already written saying something else (0057), or its tenant erased (0059); a turn
#: claimed that holds another writer's is ``memory.turn_claims.TURN_TAKEN`` (0069).
VERSION_CONFLICT = "version_conflict"
TENANT_ERASED = TenantErased.code


def conflict_reason(version: int | None, what: str) -> str:
    """Why an event of a version already written, saying something else, changed nothing."""
    return (
        f"version {version} of this doc is already written with another {what}: this event changed nothing "
        "(a change needs a higher version)"
    )


def older_reason(version: int | None, stored: int | None) -> str:
    """Why an event older than the stored version changed nothing; where a writer's own
    counter met a default version (a delete or a write sent without one), how to mend it:
    the counter's next edits would all be lost."""
    said = f"version {version} is older than the stored version {stored}"
    if version is not None and stored is not None and version < CLOCK_VERSIONS_FROM <= stored:
        said += (
            " (a default version, the time in microseconds: a document's versions are its writer's own "
            "counter or the defaults, not both; send a version above it, or none)"
        )
    return said


def build_acks(
    raw: Mapping[Position, Any],
    good: Sequence[Decoded],
    report: IngestReport,
    dead: Mapping[Position, tuple[str, str]],
) -> list[tuple[Any, str, str, WriteAck]]:
    """``(record, reply_to, correlation_id, ack)`` for every record of the batch that asks.

    ``raw``: the batch's records by position; ``good``: those that decoded; ``dead``: the
    positions dead-lettered, with (reason, error code).
    """
    decoded = {(g.topic, g.partition, g.offset): g for g in good}
    # The outcome each doc's winning item had: what an item it superseded in the batch reports.
    winners: dict[tuple[str, str], tuple[Decoded, ItemOutcome]] = {}
    for d in good:
        if (won := report.outcomes.get(id(d.item))) is not None:
            winners[(d.item.tenant, d.item.doc_id)] = (d, won)
    out: list[tuple[Any, str, str, WriteAck]] = []
    for position, record in raw.items():
        route = ack_route(getattr(record, "headers", None))
        if route is None:
            continue
        g = decoded.get(position)
        if g is not None:
            ack = WriteAck(event_id=g.event_id, doc_id=g.item.doc_id, version=g.item.version, status="ignored")
        else:
            # Parsed again only when it never decoded: an event's JSON may be megabytes.
            ack = WriteAck(**_named(record.value), status="ignored")
        if position in dead:
            ack.status = "dead_lettered"
            ack.reason, ack.error_code = dead[position]
        elif g is not None and (outcome := report.outcomes.get(id(g.item))) is not None:
            ack.status, ack.chunks, ack.stored_version = outcome.status, outcome.chunks, outcome.stored_version
            ack.embedded = outcome.embedded
            ack.forgotten, ack.removed = outcome.forgotten, outcome.removed
            if outcome.refused is not None:
                ack.error_code, ack.reason = outcome.refused
            elif outcome.conflict is not None:
                ack.reason, ack.error_code = conflict_reason(g.item.version, outcome.conflict), VERSION_CONFLICT
            elif outcome.status == "ignored":
                ack.reason = older_reason(g.item.version, outcome.stored_version)
        elif g is not None:
            winner = winners.get((g.item.tenant, g.item.doc_id))
            ack.stored_version = winner[1].stored_version if winner else None
            copy = winner is not None and winner[1].status == "indexed" and g.item.version is not None
            if copy and winner is not None and g.item.version == winner[1].stored_version:
                if (what := differs_between(g.item, winner[0].item)) is None:
                    ack.status = "indexed"  # a copy of the winner (a producer's retry)
                else:
                    ack.reason, ack.error_code = conflict_reason(g.item.version, what), VERSION_CONFLICT
                out.append((record, *route, ack))
                continue
            same = winner is not None and g.item.version is not None and g.item.version == winner[0].item.version
            if same and winner is not None and winner[1].conflict is not None:
                # Beside a winner of this version that conflicted with the stored one.
                what = differs_between(g.item, winner[0].item)
                ack.error_code = VERSION_CONFLICT
                ack.reason = (
                    conflict_reason(g.item.version, winner[1].conflict)
                    if what is None
                    else (
                        f"another event of version {g.item.version} in the same batch was judged in its place "
                        "(its content differs from this one's): this event changed nothing"
                    )
                )
                out.append((record, *route, ack))
                continue
            below = winner is not None and winner[1].status == "ignored" and winner[1].conflict is None
            if below and winner is not None and g.item.version is not None:
                # The doc's highest version of the batch was already below the stored one.
                ack.reason = older_reason(g.item.version, winner[1].stored_version)
                out.append((record, *route, ack))
                continue
            later = f" (version {winner[0].item.version})" if winner and winner[0].item.version is not None else ""
            ack.reason = f"superseded by a later event of the same doc in the same batch{later}"
        else:
            continue  # neither decoded nor dead-lettered: a record this consumer no longer owns
        out.append((record, *route, ack))
    return out
