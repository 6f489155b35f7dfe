"""Query requests -> search specs, search outcomes -> replies; a failed request answered with its error."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import structlog
from pydantic import ValidationError

from consumers.decoding import parse_event
from consumers.error_replies import crash_reply, error_reply
from consumers.requests import (
    CommunityInfo,
    ContextTurn,
    EarlierVersion,
    ErrorReply,
    GetItem,
    GetReply,
    GetRequest,
    ListReply,
    ListRequest,
    QueryReply,
    QueryRequest,
    RecentReply,
    RecentRequest,
    Repeat,
    ResultItem,
)
from graph import ScopedSearch
from memory.conversation import parse_turn
from memory.errors import InvalidRequest, MemdError
from memory.index.history import Version
from memory.records import DEFAULT_TENANT, StoredChunk
from memory.search_results import Lookup, SearchHit, SearchOutcome
from memory.search_spec import SearchSpec

log = structlog.get_logger()


def _peek(raw: bytes | None) -> dict[str, Any] | None:
    """A request's top-level fields, read leniently (for one that may not validate); None if
    it is no JSON object. Never raises: nesting deep enough for a RecursionError is as
    unreadable as bad JSON."""
    try:
        data: Any = json.loads(raw or b"")
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def guess_query_id(raw: bytes | None) -> str | None:
    """The query_id of a request that failed validation, when one can be read at all."""
    qid = (_peek(raw) or {}).get("query_id")
    if not (isinstance(qid, str) and 0 < len(qid) <= 256):
        return None
    # JSON may escape a lone surrogate ("\ud800"): Python reads it, no reply can carry it, and
    # an error reply holding it would fail to serialize, and the asker would hear nothing.
    try:
        qid.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return qid


def scope_of(raw: bytes | None) -> str:
    """The scope label of a request, for metrics (invalid requests count as 'invalid')."""
    data = _peek(raw)
    if data is not None and data.get("op") in ("get", "list", "recent"):
        return str(data["op"])
    scope = "invalid" if data is None else data.get("scope", "chunks")
    return scope if isinstance(scope, str) and scope in {"chunks", "communities", "all"} else "invalid"


Request = QueryRequest | GetRequest | ListRequest | RecentRequest

_REQUEST_OPS: dict[object, type[GetRequest] | type[ListRequest] | type[RecentRequest]] = {
    "get": GetRequest,
    "list": ListRequest,
    "recent": RecentRequest,
}


def parse_request(raw: bytes | None) -> Request:
    """Validate a request body: a search, (``"op": "get"``) a lookup by id, (``"op": "list"``)
    a listing of document ids or sources, or (``"op": "recent"``) an agent's latest turns.

    Raises:
        InvalidRequest: malformed JSON or UTF-8, or a schema error, with the reason.
    """
    op = (_peek(raw) or {}).get("op")
    if op is not None and not (isinstance(op, str) and op in _REQUEST_OPS):
        shown = repr(op[:40]) if isinstance(op, str) else f"of type {type(op).__name__}"
        raise InvalidRequest(f"unknown op {shown}: a request is a search (no op), or has op get, recent or list")
    model: type[Request] = _REQUEST_OPS[op] if op is not None else QueryRequest
    try:
        return parse_event(raw, model)
    except (ValueError, ValidationError) as exc:
        raise InvalidRequest(str(exc)) from exc


def to_get_reply(req: GetRequest | RecentRequest, found: Sequence[Lookup], took_ms: float) -> GetReply:
    """The reply to a lookup (in the request's order) or, a ``RecentReply``, to a read of
    recent turns."""
    items = []
    for f in found:
        if f.status != "found":
            items.append(GetItem(doc_id=f.doc_id, status=f.status))
            continue
        if f.earlier is not None:
            items.append(_of_earlier(f.doc_id, f.earlier, f.content))
            continue
        first = f.chunks[0]
        items.append(
            GetItem(
                doc_id=f.doc_id,
                status="found",
                kind=first.kind,
                source=first.source,
                version=f.version if first.kind != "transcript" else None,
                content=f.content,
                metadata=first.metadata,
                timestamp=_iso(first.timestamp),
                history=[_earlier(v) for v in f.history] if isinstance(req, GetRequest) and req.history else None,
            )
        )
    reply = RecentReply if isinstance(req, RecentRequest) else GetReply
    return reply(query_id=req.query_id, items=items, took_ms=round(took_ms, 3))


def _of_earlier(doc_id: str, v: Version, content: str) -> GetItem:
    """The item of an earlier version asked for by its number (``content``: from the offset asked)."""
    return GetItem(
        doc_id=doc_id,
        status="found",
        kind="document",
        source=v.source,
        version=v.version,
        content=content,
        metadata=v.metadata,
        timestamp=_iso(v.timestamp),
        until=_iso(v.until),
    )


def _earlier(v: Version) -> EarlierVersion:
    return EarlierVersion(
        version=v.version,
        content=v.content,
        source=v.source,
        metadata=v.metadata,
        timestamp=_iso(v.timestamp),
        until=_iso(v.until),
    )


def to_spec(req: QueryRequest, tenant: str = DEFAULT_TENANT) -> SearchSpec:
    """The search a request asks for, within the tenant its topic names."""
    hp = req.hybrid_params
    since, until = req.time_range.bounds() if req.time_range else (None, None)
    return SearchSpec(
        text=req.search_text,
        top_k=req.top_k,
        dense_weight=hp.dense_weight,
        sparse_weight=hp.sparse_weight,
        identifier_weight=hp.identifier_weight,
        recency_weight=hp.recency_weight,
        speaker_weight=hp.speaker_weight,
        min_similarity=hp.min_similarity,
        rrf_k=hp.rrf_k_constant,
        metadata_filter=req.metadata_filter,
        tenant=tenant,
        since=since,
        until=until,
        context_turns=req.context_turns,
        fold_repeats=req.fold_repeats,
        max_per_doc=req.max_per_doc,
    )


def _community(hit: SearchHit, stale: dict[str, bool]) -> CommunityInfo | None:
    if hit.chunk.kind != "community":
        return None
    meta = hit.chunk.metadata
    cid = str(meta.get("community_id", ""))
    return CommunityInfo(
        community_id=cid,
        level=int(meta.get("level", 0)),
        member_count=int(meta.get("member_count", 0)),
        stale=stale.get(cid, False),
    )


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    try:
        return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):  # a timestamp no datetime can hold
        return None


def _with_context(req: QueryRequest, hit: SearchHit) -> bool:
    return bool(req.context_turns) and hit.chunk.kind == "transcript"


def _context_turn(chunk: StoredChunk) -> ContextTurn:
    ref = parse_turn(chunk.doc_id)
    return ContextTurn(
        doc_id=chunk.doc_id,
        turn=ref.turn if ref is not None else 0,
        role=str(chunk.metadata.get("role", "")),
        text=chunk.text,
        timestamp=_iso(chunk.timestamp),
    )


def to_reply(req: QueryRequest, outcome: SearchOutcome, stale: dict[str, bool] | None = None) -> QueryReply:
    """The reply for a finished search."""
    results = [
        ResultItem(
            chunk_id=h.chunk.chunk_id,
            rrf_score=h.score,
            text=h.chunk.text,
            source=h.chunk.source,
            doc_id=h.chunk.doc_id,
            kind=h.chunk.kind,
            metadata=h.chunk.metadata,
            ranks=h.ranks,
            community=_community(h, stale or {}),
            timestamp=_iso(h.chunk.timestamp),
            section=h.chunk.section or None,
            context=[_context_turn(c) for c in h.context]
            if req.context_turns and h.chunk.kind == "transcript"
            else None,
            repeats=[Repeat(doc_id=r.doc_id, chunk_id=r.chunk_id, timestamp=_iso(r.timestamp)) for r in h.repeats]
            or None,
            repeat_count=h.repeat_count or None,
        )
        for h in outcome.hits
    ]
    return QueryReply(
        query_id=req.query_id, total_retrieved=len(results), results=results, took_ms=round(outcome.took_ms, 3)
    )


async def answer(
    raw: bytes | None, search: ScopedSearch, tenant: str | None = DEFAULT_TENANT, *, max_bytes: int | None = None
) -> QueryReply | GetReply | ListReply | ErrorReply:
    """Answer one raw request: results, or an error reply that says why. Never raises.

    ``max_bytes``: the reply will be cut to that many bytes (``consumers.reply_fit``), so a
    lookup reads no more of its documents' contents than that many characters.

    A request's errors become its reply here, through ``consumers.error_replies``: an asker
    always hears back.
    """
    query_id = None
    try:
        req = parse_request(raw)
        query_id = req.query_id
        if tenant is None:
            raise InvalidRequest(
                "the request topic names no tenant: in topic tenancy questions are asked on "
                "<requests topic>.<tenant> (the client's tenant=, the CLI's --tenant)"
            )
        if isinstance(req, GetRequest):
            t0 = time.monotonic()
            found = await search.lookup(
                req.wanted(),
                tenant=tenant,
                metadata_filter=req.metadata_filter,
                history=req.history,
                content_chars=max_bytes,
                offset=req.content_offset,
                version=req.version,
            )
            return to_get_reply(req, found, (time.monotonic() - t0) * 1000)
        if isinstance(req, RecentRequest):
            t0 = time.monotonic()
            turns = await search.recent(
                req.agent_id,
                req.session_id,
                tenant=tenant,
                limit=req.limit,
                metadata_filter=req.metadata_filter,
            )
            return to_get_reply(req, turns, (time.monotonic() - t0) * 1000)
        if isinstance(req, ListRequest):
            t0 = time.monotonic()
            values = await search.list_values(
                tenant=tenant, field=req.field, source_prefix=req.source_prefix, limit=req.limit, offset=req.offset
            )
            return ListReply(query_id=req.query_id, values=values, took_ms=round((time.monotonic() - t0) * 1000, 3))
        outcome, stale = await search.search(to_spec(req, tenant), req.scope)
        return to_reply(req, outcome, stale)
    except MemdError as exc:
        return error_reply(exc, query_id or guess_query_id(raw))
    except Exception as exc:  # a bug must still answer the asker, and be logged loudly
        qid = query_id or guess_query_id(raw)
        log.exception("query.request_crashed", query_id=qid)
        return crash_reply(exc, qid)
