"""A small typed async client of the wire contract, on plain aiokafka.

Any language's Kafka client can do the same: publish JSON, set ``reply_to`` and
``correlation_id`` headers (and optionally ``reply_partition``), read the reply topic (or
that partition of it) for the matching ``correlation_id``.

``MemoryClient`` is the typed façade: the records and the reply reader are
``consumers.transport``'s, the bodies and their checks before sending ``consumers.encoding``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from consumers.client_writes import Receipt, _Writes
from consumers.encoding import ClientFilter, TurnRef, get_body, list_body, query_body, recent_body
from consumers.errors import VersionGone
from consumers.requests import GetItem, GetReply, ListReply, QueryReply
from consumers.spelling import near_name
from memory.conversation import MAX_RECENT_TURNS
from memory.errors import MemdError

__all__ = ["MemoryClient", "Receipt", "SessionHint"]


class MemoryClient(_Writes):
    """Publish documents and observations, and ask queries over request/reply.

    The connection is ``consumers.client_core``'s, the writes ``consumers.client_writes``'s;
    the reads (``query``, ``get``, ``list_values``, ``recent``) are here.
    """

    async def _read_turns(self, refs: list[tuple[str, str, int]], tenant: str | None) -> Sequence[GetItem]:
        return (await self.get(turns=refs, tenant=tenant)).items

    async def query(
        self,
        text: str,
        *,
        top_k: int = 5,
        metadata_filter: ClientFilter | None = None,
        dense_weight: float | None = None,
        sparse_weight: float | None = None,
        rrf_k: int | None = None,
        query_id: str | None = None,
        identifier_weight: float | None = None,
        scope: Literal["chunks", "communities", "all"] | None = None,
        tenant: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        recency_weight: float | None = None,
        context_turns: int = 0,
        speaker_weight: float | None = None,
        min_similarity: float | None = None,
        fold_repeats: bool = True,
        max_per_doc: int | None = None,
    ) -> QueryReply:
        """Ask a query and wait for its reply.

        Args:
            text: what to search for.
            top_k: results wanted (1..100).
            metadata_filter: key -> value, values (any of them), or ``{"not": value or values}``
                (none of them).
            dense_weight: weight of the vector leg (0 skips it); the daemon's default if None.
            sparse_weight: weight of the BM25 leg (0 skips it); the daemon's default if None.
            rrf_k: the RRF constant; the daemon's default if None.
            query_id: echoed in the reply; a random one if None.
            identifier_weight: weight of the identifier leg (0 skips it); the daemon's default if None.
            scope: ``chunks``, ``communities`` or ``all`` (see docs/contract.md); the daemon's
                default (``chunks``) if None.
            tenant: ask this tenant's memory, on ``<requests topic>.<tenant>`` (for a daemon in
                topic tenancy); None: the client's tenant, else the requests topic itself. The
                reply goes to this client's reply topic, which the daemon allows for the
                tenant's own (``<replies>.<tenant>``) or the shared one (a client built without
                ``tenant=``); a client of another tenant raises ``InvalidRequest``.
            since: only memories timestamped at or after this time: a datetime (naive: UTC),
                an ISO 8601 string (a date alone: its first instant, and for ``until`` its last),
                an age before now (``"24h"``, ``"7d"``), or ``"today"``, ``"yesterday"`` (UTC days).
            until: only memories timestamped at or before this time (as ``since``).
            recency_weight: weight of the recency lift (the newer results moved up; 0 off);
                the daemon's default (0) if None.
            context_turns: also return this many turns before and after each transcript
                result (its ``context``), so an agent gets the exchange, not a fragment.
            speaker_weight: weight of the speaker list (the candidates said by someone the
                query names; 0 off); the daemon's default (0.2) if None.
            min_similarity: the vector leg keeps only candidates at least this similar
                (cosine, -1..1) to the question; the daemon's default (off) if None.
            fold_repeats: a result whose text is a better one's, word for word (case and
                spacing aside), is listed in that one's ``repeats`` instead of taking a place
                of its own; False returns each as a result.
            max_per_doc: most results of one document while other documents' hits remain
                (its further chunks come after theirs; 0: no limit); the daemon's default
                (3) if None.

        Raises:
            QueryFailed: the daemon replied with an error.
            InvalidRequest: ``tenant`` is no valid tenant name (or none the daemon's tenancy
                reads), an empty ``query_id``, text UTF-8 cannot carry.
            NotFound: the reply topic, or the reply partition, does not exist.
            BackendUnavailable: the broker cannot be reached or took no record within the
                client's timeout, or the reply reader failed or was closed while this query
                waited (the next query starts a new one).
            TimeoutError: no reply within the client's timeout.
        """
        topic = self._topic(self.topics.requests, tenant, answered=True)
        payload = query_body(
            text,
            top_k=top_k,
            metadata_filter=metadata_filter,
            dense_weight=dense_weight,
            sparse_weight=sparse_weight,
            identifier_weight=identifier_weight,
            recency_weight=recency_weight,
            rrf_k=rrf_k,
            query_id=query_id,
            scope=scope,
            since=since,
            until=until,
            context_turns=context_turns,
            speaker_weight=speaker_weight,
            min_similarity=min_similarity,
            fold_repeats=fold_repeats,
            max_per_doc=max_per_doc,
        )
        data = await self._transport.ask(topic, payload)
        return QueryReply.model_validate(data)

    async def get(
        self,
        doc_ids: Sequence[str] | str = (),
        *,
        turns: Sequence[TurnRef] = (),
        metadata_filter: ClientFilter | None = None,
        tenant: str | None = None,
        query_id: str | None = None,
        history: bool = False,
        content_offset: int = 0,
        version: int | None = None,
    ) -> GetReply:
        """Look memories up by id (``doc_ids``: ids, or one id): each doc's (or turn's, as
        ``(agent_id, session_id, turn)`` or the wire's ``{"agent_id": …, "session_id": …,
        "turn": …}``) current version,
        content and metadata, or ``not_found``; in the order asked. With ``history``, each
        found document's earlier versions too (its ``history``, newest first).

        A reply holds about 1 MiB: longer contents come cut (``content_truncated``).
        ``content_offset`` and ``version`` read one item on from a character, in a version
        kept (:meth:`read` reads one whole).

        Raises:
            InvalidRequest: a turn is neither of those shapes (nothing is sent).
            QueryFailed: the daemon replied with an error (no ids, more than 100, a bad filter,
                an offset or version with more than one item).
            BackendUnavailable, NotFound, TimeoutError: as for ``query``.
        """
        topic = self._topic(self.topics.requests, tenant, answered=True)
        payload = get_body(doc_ids, turns, metadata_filter, query_id, history, content_offset, version)
        return GetReply.model_validate(await self._transport.ask(topic, payload))

    async def read(
        self,
        doc_id: str,
        *,
        version: int | None = None,
        metadata_filter: ClientFilter | None = None,
        tenant: str | None = None,
        history: bool = False,
    ) -> GetItem:
        """One document (or turn, by its doc id) whole, however long: its current version, or
        ``version`` if its history keeps it (:meth:`read_on`); with ``history`` (and no
        ``version``), its earlier versions as :meth:`get` gives them. An item not found, or being
        written, comes back as the reply says it. The current version replaced while it is
        read (even by the same content under a new number) is read again from its start, up
        to ``READ_TRIES`` times.

        Raises:
            VersionGone: ``version`` (or, past the tries, each current one) was replaced and is
                no longer kept before its last part was read.
            MemdError: as for :meth:`read_on`.
            QueryFailed, BackendUnavailable, TimeoutError: as for :meth:`get`.
        """
        for attempt in range(1, READ_TRIES + 1):
            reply = await self.get(
                doc_id, metadata_filter=metadata_filter, tenant=tenant, version=version, history=history
            )
            try:
                return await self.read_on(_one(reply, doc_id), metadata_filter=metadata_filter, tenant=tenant)
            except VersionGone:
                if version is not None or attempt == READ_TRIES:
                    raise
        raise AssertionError("unreachable: the last try returns or raises")

    async def read_on(
        self, item: GetItem, *, metadata_filter: ClientFilter | None = None, tenant: str | None = None
    ) -> GetItem:
        """``item`` (of a :meth:`get`'s reply) with its whole content: a content the reply cut is
        read on a reply at a time, each from where the last ended and in the item's version
        (``content_truncated`` then false). Any other item comes back as it is.

        Raises:
            VersionGone: the version read was replaced and is no longer kept before its last
                part was read, or a turn (which has no version) was written again meanwhile
                (read it again for the new one).
            MemdError: its metadata fills a reply, leaving no room for its content.
            QueryFailed, BackendUnavailable, TimeoutError: as for :meth:`get`.
        """
        parts = [item.content or ""]
        read = len(parts[0])
        cut = item.status == "found" and item.content_truncated
        while cut:
            reply = await self.get(
                item.doc_id, metadata_filter=metadata_filter, tenant=tenant, content_offset=read, version=item.version
            )
            part = _one(reply, item.doc_id)
            # A turn has no version to pin: one written again meanwhile has another time.
            replaced = item.version is None and part.timestamp != item.timestamp
            if part.status != "found" or replaced:
                kept = f"version {item.version} of {item.doc_id!r}" if item.version is not None else repr(item.doc_id)
                raise VersionGone(f"{kept} is no longer kept as it was, after {read} characters of it were read")
            if not part.content:  # reading on would never end
                raise MemdError(f"{item.doc_id!r}: its other fields leave a reply no room for its content")
            parts.append(part.content)
            read += len(part.content)
            cut = part.content_truncated
        if len(parts) == 1:
            return item
        return item.model_copy(update={"content": "".join(parts), "content_truncated": False})

    async def list_values(
        self,
        field: Literal["doc_id", "source"] = "doc_id",
        *,
        source_prefix: str = "",
        limit: int = 100,
        offset: int = 0,
        tenant: str | None = None,
        query_id: str | None = None,
    ) -> ListReply:
        """The distinct doc ids (or sources) of the tenant's documents whose source starts with
        ``source_prefix``, sorted, ``limit`` (1..1000) of them from ``offset``.

        Raises:
            QueryFailed: the daemon replied with an error (a limit out of range, say).
            BackendUnavailable, NotFound, TimeoutError: as for ``query``.
        """
        topic = self._topic(self.topics.requests, tenant, answered=True)
        payload = list_body(field, source_prefix, limit, offset, query_id)
        return ListReply.model_validate(await self._transport.ask(topic, payload))

    async def recent(
        self,
        agent_id: str,
        session_id: str | None = None,
        *,
        limit: int = 20,
        metadata_filter: ClientFilter | None = None,
        tenant: str | None = None,
        query_id: str | None = None,
    ) -> GetReply:
        """The agent's latest ``limit`` (1..100) turns, whole, oldest first: in ``session_id``, or
        across its sessions without one (by time; session and turn among equal times). What
        an agent restarted mid-task reads first.

        Raises:
            QueryFailed: the daemon replied with an error (a limit out of range, say).
            BackendUnavailable, NotFound, TimeoutError: as for ``query``.
        """
        topic = self._topic(self.topics.requests, tenant, answered=True)
        payload = recent_body(agent_id, session_id, limit, metadata_filter, query_id)
        return GetReply.model_validate(await self._transport.ask(topic, payload))

    async def latest_sessions(self, agent_id: str, *, tenant: str | None = None) -> list[str]:
        """The sessions of the agent's latest turns (up to 100 turns), newest first: what a
        session id that held nothing (a misspelt one) is told apart from.

        Raises:
            BackendUnavailable, NotFound, TimeoutError: as for ``query``.
        """
        latest = await self.recent(agent_id, limit=MAX_RECENT_TURNS, tenant=tenant)
        found = (str((i.metadata or {}).get("session_id", "")) for i in reversed(latest.items))
        return [s for s in dict.fromkeys(found) if s]

    async def session_hint(self, agent_id: str, session_id: str, *, tenant: str | None = None) -> SessionHint | None:
        """What a forget of ``session_id`` that removed nothing is told: the agent's latest
        sessions and the one the id nearly spells; None when the session is among them (only
        the turn asked for was missing).

        Raises:
            BackendUnavailable, NotFound, TimeoutError: as for ``query``.
        """
        latest = await self.latest_sessions(agent_id, tenant=tenant)
        return None if session_id in latest else SessionHint(latest, near_name(session_id, latest))

    async def doc_hint(self, doc_id: str) -> str | None:
        """The stored doc id ``doc_id`` nearly spells, for a delete that removed nothing: among
        the ids of its folder first, then the first 1,000 of all (a misspelt folder).

        Raises:
            BackendUnavailable, NotFound, TimeoutError: as for ``query``.
        """
        folder = doc_id.rpartition("/")[0]
        ids = [] if not folder else (await self.list_values("doc_id", source_prefix=f"{folder}/", limit=1000)).values
        return near_name(doc_id, ids) or near_name(doc_id, (await self.list_values("doc_id", limit=1000)).values)


@dataclass(frozen=True, slots=True)
class SessionHint:
    """An agent's latest sessions, newest first, and the one a session id nearly spells."""

    latest: list[str]
    near: str | None


#: Reads of a document's current version ``MemoryClient.read`` starts before it gives up,
#: when each is replaced before its last part is read.
READ_TRIES = 3


def _one(reply: GetReply, doc_id: str) -> GetItem:
    """The one item of a get of ``doc_id``.

    Raises:
        MemdError: the reply left it off: its metadata alone fills a reply.
    """
    if not reply.items:
        raise MemdError(f"{doc_id!r} was left off the reply: its metadata alone is larger than one reply may carry")
    return reply.items[0]
