"""What the MCP server's tools do, over the Kafka contract only (``MemoryClient``).

No MCP SDK here: each tool is a plain async method taking the tool's arguments and returning
JSON-ready data, or raising ``ToolFailure`` with the contract's error code, so the SDK
wiring in ``daemon.mcp_server`` stays thin and these can be read (and tested) on their own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

import structlog
from pydantic import ValidationError

from consumers.client import MemoryClient
from consumers.client_writes import Receipt, turn_taken
from consumers.decoding import validation_reason
from consumers.errors import QueryFailed, WriteRejected
from consumers.events import TranscriptEvent
from daemon.mcp_config import MCPConfig
from daemon.mcp_views import (
    CUT_SEARCH,
    MCP_MAX_CHARS,
    Noted,
    ToolFailure,
    ack_view,
    in_tool_words,
    item_view,
    parse_time,
    read_on_view,
    result_view,
)
from memory.errors import MemdError
from memory.filters import BASE_FILTER_KEYS

T = TypeVar("T")

log = structlog.get_logger()


class MemoryTools:
    """The tools, on one lazily started ``MemoryClient`` (a broker down at startup is an
    error of the calls made then, not of the server, which starts anyway)."""

    def __init__(
        self,
        make_client: Callable[[], MemoryClient],
        cfg: MCPConfig,
        *,
        status_url: str | None = None,
        tenant: str | None = None,
        filter_keys: Sequence[str] = BASE_FILTER_KEYS,
    ) -> None:
        self._make_client = make_client
        self.filter_keys = tuple(filter_keys)  # what search_memory's filters may name (the index's settings)
        self._cfg = cfg
        self._status_url = status_url
        self._tenant = tenant
        self._client: MemoryClient | None = None
        self._start_lock = asyncio.Lock()

    async def close(self) -> None:
        """Stop the client, if one was started."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def _started(self) -> MemoryClient:
        async with self._start_lock:
            if self._client is None:
                client = self._make_client()
                try:
                    await client.start()  # BackendUnavailable when the broker is down: retried next call
                except BaseException:
                    # The deadline can cancel a start that hangs (a black-holed broker): its
                    # producer would stay open, one more with every call.
                    await client.close()
                    raise
                self._client = client
            return self._client

    async def _call(
        self, what: str, fn: Callable[[MemoryClient], Awaitable[T]], *, write: bool | Callable[[], str | None] = False
    ) -> T:
        """Run ``fn`` with the client within the deadline; every failure becomes a ToolFailure.

        ``write``: whether ``fn`` writes; a callable says what a timeout leaves unsure, None when
        nothing was sent yet (a write that looks something up first may time out before).
        """
        started = time.monotonic()
        try:
            async with asyncio.timeout(self._cfg.timeout_s):
                return await fn(await self._started())
        except ToolFailure:
            raise
        except QueryFailed as exc:
            raise ToolFailure(exc.error_code, in_tool_words(what, exc.reply.error.message)) from exc
        except WriteRejected as exc:
            reason = in_tool_words(what, exc.ack.reason or "")
            raise ToolFailure(exc.error_code, f"the daemon refused the write: {reason}") from exc
        except MemdError as exc:
            raise ToolFailure(exc.code, f"{in_tool_words(what, str(exc))}{_retry_hint(exc.code)}") from exc
        except TimeoutError as exc:
            took = time.monotonic() - started
            if not write:
                hint = " Retry later." if what == "memory_status" else " Retry later, or check memory_status."
            elif callable(write) and (unsure := write()) is None:
                hint = " Nothing was written: retrying is safe."
            elif callable(write):
                hint = f" The write was sent: {unsure}."
            else:
                hint = " The write may still be applied: check with get_document or search_memory before retrying."
            raise ToolFailure(
                "timeout",
                f"{what}: no answer from the memory daemon within {took:.1f} s; it may be down or busy.{hint}",
            ) from exc

    async def search_memory(
        self,
        query: str,
        top_k: int = 10,
        filters: Mapping[str, str | list[str] | Mapping[str, str | list[str]]] | None = None,
        scope: Literal["chunks", "communities", "all"] = "chunks",
        since: str | None = None,
        until: str | None = None,
        context_turns: int = 0,
        min_similarity: float | None = None,
        recency_weight: float | None = None,
        fold_repeats: bool = True,
        max_per_doc: int | None = None,
    ) -> list[dict[str, Any]] | Noted:
        """Ask a query; each result as ``result_view`` shows it, and, where the daemon cut the
        reply to fit one record, a note that says so (``CUT_SEARCH``).

        Raises:
            ToolFailure: a bad argument (``invalid_request``), an error reply, an outage, the deadline.
        """
        start, end = parse_time(since, "since"), parse_time(until, "until")
        if not query.strip():  # else the contract's check would name its field, search_text
            raise ToolFailure("invalid_request", "query is empty: give words or identifiers to search for")

        async def ask(c: MemoryClient) -> list[dict[str, Any]] | Noted:
            reply = await c.query(
                query,
                top_k=top_k,
                metadata_filter=filters or None,
                scope=scope,
                since=start,
                until=end,
                context_turns=context_turns,
                min_similarity=min_similarity,
                recency_weight=recency_weight,
                fold_repeats=fold_repeats,
                max_per_doc=max_per_doc,
            )
            rows = [result_view(r) for r in reply.results]
            return Noted(rows, CUT_SEARCH) if reply.truncated else rows

        return await self._call("search_memory", ask)

    async def remember(
        self,
        text: str,
        agent_id: str,
        session_id: str,
        role: str = "assistant",
        turn: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        timestamp: str | None = None,
        if_absent: bool = False,
    ) -> dict[str, Any]:
        """Publish a turn and wait for its ack; without ``turn``, the session's next free one,
        claimed (docs/mcp.md, "Turn numbers"). ``timestamp``: when it was said (ISO 8601), for
        importing past conversations; now if None. ``if_absent``: a ``turn`` given is written
        only if it holds nothing else (the retry of a call that timed out).

        Raises:
            ToolFailure: as for ``search_memory``; ``conflict`` when other writers kept taking
                the next turn, or the ``turn`` given with ``if_absent`` holds another's.
        """
        try:  # the contract's own checks, before the turn lookup would fail on them in its own words
            TranscriptEvent(
                event_id="check", agent_id=agent_id, session_id=session_id, turn=turn or 0, role=role,
                content=text, metadata=dict(metadata or {}),
            )  # fmt: skip
        except ValidationError as exc:
            # A turn the daemon would dead-letter, as upsert_document's are: invalid_event.
            raise ToolFailure("invalid_event", in_tool_words("remember", validation_reason(exc))) from exc
        said_at = parse_time(timestamp, "timestamp")
        sent: int | None = None  # the turn last sent: a timeout in the lookup before it wrote nothing

        async def say(c: MemoryClient) -> dict[str, Any]:
            nonlocal sent

            async def claim(n: int, only_if_free: bool) -> Receipt:
                nonlocal sent
                sent = n
                receipt = await c.publish_observation(
                    agent_id=agent_id, session_id=session_id, turn=n, content=text, role=role, metadata=metadata,
                    timestamp=said_at, wait=True, timeout_s=self._cfg.client_timeout_s, if_absent=only_if_free,
                )  # fmt: skip
                if turn_taken(receipt):
                    sent = None  # not written: nothing of it can land any more
                return receipt

            async with c.turns.writing(c.turn_key(agent_id, session_id)):
                if turn is not None:
                    receipt = await claim(turn, if_absent)
                    if turn_taken(receipt):
                        raise ToolFailure(
                            "conflict",
                            f"turn {turn} holds another turn: nothing was written; call remember without turn "
                            "to write it as the next one",
                        )
                    return {**ack_view(receipt.ack, receipt.doc_id), "turn": turn}
                # The next free turn, claimed: another writer that took the same number first
                # keeps it, and this one moves on (docs/mcp.md, "Turn numbers").
                receipt = await c.claim_next_turn(agent_id, session_id, lambda n: claim(n, True))
                if turn_taken(receipt):
                    raise ToolFailure(
                        "conflict", "other writers kept taking this session's next turn: nothing was written; try again"
                    )
                return {**ack_view(receipt.ack, receipt.doc_id), "turn": receipt.turn}

        def unsure() -> str | None:
            """What a timeout leaves unknown: whether the turn last sent was written."""
            if sent is None:
                return None
            return (
                f"turn {sent} of session {session_id!r} may still be written: call remember again with "
                f"turn={sent} and if_absent=true (stored once if it landed, refused if another writer's is "
                "there), not without a turn, which would store it twice; a long text may need longer than the "
                "deadline (AGENTMEM_MCP__TIMEOUT_S) to be embedded"
            )

        return await self._call("remember", say, write=unsure)

    async def upsert_document(
        self, doc_id: str, content: str, metadata: Mapping[str, Any] | None = None, timestamp: str | None = None
    ) -> dict[str, Any]:
        """Upsert a document (a wall-clock version) and wait for its ack; ``timestamp``: when it
        was written (ISO 8601), now by default."""
        when = parse_time(timestamp, "timestamp")

        async def put(c: MemoryClient) -> dict[str, Any]:
            r = await c.publish_document(
                doc_id, content, metadata=metadata, timestamp=when, wait=True, timeout_s=self._cfg.client_timeout_s
            )
            return ack_view(r.ack, r.doc_id)

        return await self._call("upsert_document", put, write=True)

    async def delete_document(self, doc_id: str) -> dict[str, Any]:
        """Delete a document and wait for its ack."""

        async def drop(c: MemoryClient) -> dict[str, Any]:
            r = await c.delete_document(doc_id, wait=True, timeout_s=self._cfg.client_timeout_s)
            view = ack_view(r.ack, r.doc_id)
            if r.ack is not None and r.ack.removed == 0:
                # Nothing was stored under that id, a misspelt one most likely: say so, and which is.
                view["note"] = (
                    "nothing was stored under this doc_id: nothing was removed (the delete is kept as its "
                    "stored_version: a later write of this doc_id needs a higher version, or none)"
                )
                if (near := await c.doc_hint(doc_id)) is not None:
                    view["did_you_mean"] = near
            return view

        return await self._call("delete_document", drop, write=True)

    async def forget(
        self, agent_id: str, session_id: str | None = None, all_sessions: bool = False, turn: int | None = None
    ) -> dict[str, Any]:
        """Forget a session's turns, one of them (``turn``), or every session's, and wait for the ack."""

        async def drop(c: MemoryClient) -> dict[str, Any]:
            r = await c.forget(
                agent_id=agent_id, session_id=session_id, all_sessions=all_sessions, turn=turn, wait=True,
                timeout_s=self._cfg.client_timeout_s,
            )  # fmt: skip
            view = ack_view(r.ack, r.doc_id)
            # Nothing was stored there, a misspelt id most likely: say what is.
            missed = r.ack is not None and r.ack.forgotten == 0
            if session_id is not None and missed and (hint := await c.session_hint(agent_id, session_id)) is not None:
                view["latest_sessions"] = hint.latest[:20]
                if hint.near:
                    view["did_you_mean"] = hint.near
            return view

        return await self._call("forget", drop, write=True)

    async def get_document(
        self,
        doc_id: str,
        history: bool = False,
        version: int | None = None,
        content_offset: int = 0,
        max_chars: int = MCP_MAX_CHARS,
    ) -> dict[str, Any]:
        """One document's (or turn's) current version, content and metadata, or ``not_found``;
        with ``history``, a document's earlier versions too; ``version`` and ``content_offset``
        as ``MemoryClient.get`` reads them, and at most ``max_chars`` of the content, a cut one
        saying where to read on (``read_on_view``)."""

        async def look(c: MemoryClient) -> dict[str, Any]:
            reply = await c.get([doc_id], history=history, version=version, content_offset=content_offset)
            if not reply.items or (reply.items[0].content_truncated and not reply.items[0].content):
                raise MemdError(f"{doc_id!r}: its metadata alone leaves one reply no room for its content")
            return read_on_view(reply.items[0], content_offset, max_chars)

        return await self._call("get_document", look)

    async def recent_turns(self, agent_id: str, session_id: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """An agent's latest turns, whole, oldest first (``MemoryClient.recent``)."""

        async def read(c: MemoryClient) -> list[dict[str, Any]]:
            return [item_view(i) for i in (await c.recent(agent_id, session_id, limit=limit)).items]

        return await self._call("recent_turns", read)

    async def memory_status(self) -> dict[str, Any]:
        """The broker round trip (a ``get`` of no real id) and the daemon's /readyz, if configured."""
        status: dict[str, Any] = {"tenant": self._tenant}
        started = time.monotonic()
        try:
            await self._call("memory_status", lambda c: c.get(["__mcp_status_probe__"]))
            status["daemon"] = {"answering": True, "round_trip_ms": round((time.monotonic() - started) * 1000, 1)}
        except ToolFailure as exc:
            status["daemon"] = {"answering": False, "error_code": exc.code, "error": str(exc)}
        status["http"] = await self._http_status()
        if status["daemon"].get("error_code") == "timeout" and status["http"].get("ready") is True:
            # Up and ready, yet silent on our topics (a tenancy mismatch is answered with its reason).
            status["hint"] = (
                "the daemon is up but nobody answered on this server's topics: give this server the daemon's "
                "broker (AGENTMEM_KAFKA_BOOTSTRAP) and topics (AGENTMEM_TOPICS__*), and in topic tenancy "
                "its --tenant, whose topics exist (agentmemd topics --tenant T)"
            )
        return status

    async def _http_status(self) -> dict[str, Any]:
        if self._status_url is None:
            return {"configured": False, "detail": "AGENTMEM_HTTP_PORT is 0: the daemon serves no /readyz"}
        import aiohttp  # here, not at the top: the settings import this module

        url = f"{self._status_url}/readyz"
        try:
            timeout = aiohttp.ClientTimeout(total=min(self._cfg.timeout_s, 3.0))
            async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url) as resp:
                body: dict[str, Any] = await resp.json()
                return {"configured": True, "url": url, **body}
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return {"configured": True, "url": url, "reachable": False, "error": f"{type(exc).__name__}: {exc}"}


def _retry_hint(code: str) -> str:
    if code == "unavailable":
        return " (the Kafka broker or the daemon is down: retry later)"
    return ""
