"""The write half of ``MemoryClient``: documents, observations and forgets, each checked as
the daemon would check it before anything is sent."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from consumers.client_core import _ClientCore
from consumers.encoding import delete_body, document_body, encode_request, forget_body, turn_body
from consumers.events import DocumentEvent, ForgetEvent, TranscriptEvent, WriteAck, forget_scope_error, session_key
from consumers.requests import GetItem
from consumers.topic_names import topic_base
from consumers.turn_numbers import Session
from memory.errors import InvalidRequest
from memory.turn_claims import TURN_TAKEN

#: How many times ``publish_observation`` without ``turn`` sends a turn whose claim was
#: refused (another writer took the number) as the next one; before each, a random pause of up
#: to ``CLAIM_PAUSE_S`` doubled per refusal: two writers in step would otherwise meet again at
#: the next number, the same one losing each time (the other needs no lookup first).
CLAIM_TRIES = 8
CLAIM_PAUSE_S = 0.02


def turn_taken(receipt: Receipt) -> bool:
    """Whether ``receipt``'s ack says its claimed turn held another writer's (not written)."""
    return receipt.ack is not None and receipt.ack.error_code == TURN_TAKEN


@dataclass(frozen=True, slots=True)
class Receipt:
    """What a publish sent (its event id, doc id and version) and, when it waited, the ack:
    ``indexed`` (searchable now) or ``ignored`` (an older version than the stored one)."""

    event_id: str
    doc_id: str
    version: int | None
    ack: WriteAck | None = None
    turn: int | None = None  # a turn's number (the one picked, when none was given)


def default_version() -> int:
    """A version that grows with wall-clock time (microseconds), for callers without their own."""
    return time.time_ns() // 1000


class _Writes(_ClientCore):
    """Publishing: what ``MemoryClient`` sends without a reply (an ack when asked to wait)."""

    def document_event(
        self,
        doc_id: str,
        content: str,
        *,
        version: int | None = None,
        source: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        timestamp: datetime | str | None = None,
    ) -> tuple[int, bytes]:
        """The upsert ``publish_document`` sends, checked and encoded, with its version; sends
        nothing (check a batch of documents before sending the first).

        Raises:
            InvalidEvent: the daemon would dead-letter it (blank content, content over the
                limit, a reserved doc_id, metadata out of bounds), with the reason.
        """
        version = default_version() if version is None else version
        payload = document_body(doc_id, content, version, source, metadata, timestamp)
        return version, self.check_event(DocumentEvent, payload)

    async def publish_document(
        self,
        doc_id: str,
        content: str,
        *,
        version: int | None = None,
        source: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        tenant: str | None = None,
        timestamp: datetime | str | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Upsert a document; the receipt has the version used (wall-clock based when not given).

        ``tenant``: publish into this tenant's memory (topic tenancy; see ``query``).
        ``timestamp``: when it was written (what ``query(since=, until=)`` selects on); now
        when None (sent in the event, so a replay keeps it).
        ``wait``: return once the daemon acknowledged it (the receipt's ``ack``): a query sent
        after that finds it. ``timeout_s``: how long to wait (the client's timeout when None).

        Raises:
            InvalidEvent: the daemon would dead-letter it (see ``document_event``); nothing is sent.
            WriteRejected: (``wait``) the daemon dead-lettered it.
            BackendUnavailable: the broker could not take it (with ``wait``, not within
                ``timeout_s``: it may still be sent if the broker is back within 40 s).
            TimeoutError: (``wait``) no ack in time; the event was sent.
        """
        version, value = self.document_event(
            doc_id, content, version=version, source=source, metadata=metadata, timestamp=timestamp
        )
        ack = await self._transport.publish(
            self._topic(self.topics.documents, tenant, answered=wait), value, doc_id, wait=wait, timeout_s=timeout_s
        )
        return Receipt(event_id=json.loads(value)["event_id"], doc_id=doc_id, version=version, ack=ack)

    async def delete_document(
        self,
        doc_id: str,
        *,
        version: int | None = None,
        tenant: str | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Delete a document; the receipt has the version used. ``tenant``, ``wait`` and
        ``timeout_s``: as for ``publish_document``."""
        version = default_version() if version is None else version
        payload = delete_body(doc_id, version)
        event_id = payload["event_id"]
        value = self.check_event(DocumentEvent, payload)  # an empty doc id raises here, not at the daemon
        ack = await self._transport.publish(
            self._topic(self.topics.documents, tenant, answered=wait),
            value,
            doc_id,
            wait=wait,
            timeout_s=timeout_s,
        )
        return Receipt(event_id=event_id, doc_id=doc_id, version=version, ack=ack)

    async def publish_observation(
        self,
        *,
        agent_id: str,
        session_id: str,
        content: str,
        turn: int | None = None,
        role: str = "assistant",
        metadata: Mapping[str, Any] | None = None,
        tenant: str | None = None,
        timestamp: datetime | str | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
        if_absent: bool = False,
    ) -> Receipt:
        """Record one transcript turn or observation. ``tenant``, ``timestamp``, ``wait`` and
        ``timeout_s``: as for ``publish_document``.

        ``turn``: its number in the session; None takes the turn after the session's last
        stored one (looked up once per session, then counted by this client; the receipt says
        which), as a claim: another process may take the same number at the same moment, and
        the daemon writes the first claim it applies and refuses the other (``turn_taken``).
        With ``wait``, a refused claim is sent again as the next turn (up to ``CLAIM_TRIES``
        times; the last receipt's ack says ``turn_taken`` if every one was refused); without,
        nothing tells this writer. ``if_absent``: send a numbered ``turn`` as such a claim too.
        """
        key = self.turn_key(agent_id, session_id, tenant)

        async def send(n: int, claim: bool) -> Receipt:
            payload = turn_body(agent_id, session_id, n, content, role, metadata, timestamp)
            if claim:
                payload["if_absent"] = True
            value = self.check_event(TranscriptEvent, payload)
            topic = self._topic(self.topics.transcripts, tenant, answered=wait)
            self.turns.used(key, n)  # before sending: a write that times out may still land
            ack = await self._transport.publish(
                topic, value, session_key(agent_id, session_id), wait=wait, timeout_s=timeout_s
            )
            doc_id = TranscriptEvent.model_validate_json(value).doc_id
            return Receipt(event_id=payload["event_id"], doc_id=doc_id, version=None, ack=ack, turn=n)

        if turn is not None:
            return await send(turn, if_absent)
        # The contract's own checks first: the lookup would fail on a bad id in its own words.
        self.check_event(TranscriptEvent, turn_body(agent_id, session_id, 0, content, role, metadata, timestamp))
        async with self.turns.writing(key):
            return await self.claim_next_turn(agent_id, session_id, lambda n: send(n, True), tenant=tenant)

    async def claim_next_turn(
        self, agent_id: str, session_id: str, claim: Callable[[int], Awaitable[Receipt]], *, tenant: str | None = None
    ) -> Receipt:
        """Send ``claim(n)`` (a turn sent with ``if_absent``, waited for) at the session's next
        free turn, and at the next one again while its ack says another writer took it, up to
        ``CLAIM_TRIES`` times; the last receipt (``turn_taken`` if every claim was refused).
        Call it inside ``turns.writing(turn_key(...))``."""
        n = await self.next_turn(agent_id, session_id, tenant=tenant)
        for refused in range(CLAIM_TRIES - 1):
            receipt = await claim(n)
            if not turn_taken(receipt):
                return receipt
            await asyncio.sleep(random.uniform(0, CLAIM_PAUSE_S * 2**refused))
            n = await self.next_turn(agent_id, session_id, tenant=tenant, at_least=n + 1)
        return await claim(n)

    def turn_key(self, agent_id: str, session_id: str, tenant: str | None = None) -> Session:
        """The session as ``turns`` knows it: a call's tenant, or this client's."""
        return (self._tenant_of(tenant), agent_id, session_id)

    async def next_turn(self, agent_id: str, session_id: str, *, tenant: str | None = None, at_least: int = 0) -> int:
        """The session's next free turn (``at_least`` or after), as ``publish_observation``
        without ``turn`` takes it; call it inside ``turns.writing(turn_key(...))`` to write it."""
        key = self.turn_key(agent_id, session_id, tenant)
        return await self.turns.free(lambda refs: self._read_turns(refs, tenant), key, at_least)

    async def _read_turns(self, refs: list[tuple[str, str, int]], tenant: str | None) -> Sequence[GetItem]:
        """The turns ``refs`` as ``get`` reads them (``MemoryClient`` does the reading)."""
        raise NotImplementedError

    async def forget(
        self,
        *,
        agent_id: str,
        session_id: str | None = None,
        all_sessions: bool = False,
        turn: int | None = None,
        tenant: str | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Forget every turn of a session, one of them (``turn``), or with ``all_sessions=True``
        every session of the agent.

        Keyed as the session's turns are, so it applies after every turn of it published
        before; turns published later are kept. ``tenant``, ``wait`` and ``timeout_s``: as for
        ``publish_document`` (with ``wait``, once acknowledged no query finds those turns, nor
        a forgotten turn's words in the turns around it).

        Raises:
            InvalidRequest: neither or both of ``session_id`` and ``all_sessions``, or a
                ``turn`` without its ``session_id``.
        """
        if (why := forget_scope_error(session_id, all_sessions, turn)) is not None:
            raise InvalidRequest(why)
        payload = forget_body(agent_id, session_id, turn)
        event_id = payload["event_id"]
        key = session_key(agent_id, session_id)
        topic = self._topic(self.topics.transcripts, tenant, answered=wait)
        ack = await self._transport.publish(topic, encode_request(payload), key, wait=wait, timeout_s=timeout_s)
        if turn is None:  # the session starts over: probe again (one turn's gap changes no next turn)
            self.turns.forgotten(self._tenant_of(tenant), agent_id, session_id)
        prefix = ForgetEvent.model_validate(payload).to_item(()).doc_id  # the turns' common prefix, or the turn's id
        return Receipt(event_id=event_id, doc_id=prefix, version=None, ack=ack)

    async def republish(
        self, topic: str, value: bytes, key: str, *, wait: bool = False, timeout_s: float | None = None
    ) -> WriteAck | None:
        """Send an event's bytes as they are to an input topic (the documents or transcripts
        topic, or a tenant's): a dead letter sent again, once its cause is fixed. The daemon
        judges it as any event; with ``wait``, its ack.

        Raises:
            InvalidRequest: ``topic`` is no input topic of this client's.
            WriteRejected: with ``wait``, the daemon dead-lettered it again.
        """
        bases = (self.topics.documents, self.topics.transcripts)
        if topic_base(topic, bases) is None:
            raise InvalidRequest(f"{topic!r} is not an input topic ({' or '.join(bases)}, or a tenant's)")
        return await self._transport.publish(topic, value, key, wait=wait, timeout_s=timeout_s)
