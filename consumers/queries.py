"""Query requests -> search specs, search outcomes -> replies, errors -> error replies."""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import structlog
from pydantic import ValidationError

from consumers.decoding import parse_event
from consumers.requests import (
    CommunityInfo,
    ContextTurn,
    EarlierVersion,
    ErrorBody,
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
from memory.errors import EmbedderError, InvalidRequest, MemdError, NotFound
from memory.index import IndexError_, QuerySyntaxError
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


def _earlier(v: Version) -> EarlierVersion:
    return EarlierVersion(
        version=v.version,
        content=v.content,
        source=v.source,
        metadata=v.metadata,
        timestamp=_iso(v.timestamp),
        until=_iso(v.until),
    )


def fit_list_reply(reply: ListReply, max_bytes: int) -> ListReply:
    """``reply``, with values left off its end until it fits ``max_bytes`` as JSON (``truncated`` says so)."""
    values = list(reply.values)
    while True:
        fitted = reply.model_copy(update={"values": values, "truncated": len(values) < len(reply.values)})
        if not values or len(json.dumps(fitted.model_dump(mode="json"))) <= max_bytes:
            return fitted
        # Halved, not one by one: a page of 1,000 long ids would otherwise be encoded 1,000 times.
        values = values[: len(values) // 2]


def fit_get_reply(reply: GetReply, max_bytes: int) -> GetReply:
    """``reply``, with items left off until it fits ``max_bytes`` as JSON (``truncated`` says
    so): off its end, or off its start for the oldest-first turns of a ``RecentReply``. An
    item too large alone (the first asked for, or the newest turn) keeps the start of its
    content, and its own ``content_truncated`` says so. Earlier versions go first: the
    oldest of the item whose versions take the most bytes, until it fits
    (``history_truncated`` says so)."""
    reply = _fit_history(reply, max_bytes)
    items = list(reply.items)
    while True:
        fitted = reply.model_copy(update={"items": items, "truncated": len(items) < len(reply.items)})
        size = len(json.dumps(fitted.model_dump(mode="json")))
        if size <= max_bytes or not items:
            return fitted
        if len(items) == 1 and items[0].content:
            cut = _cut_to_fit(reply, items[0], size, max_bytes)
            if cut is not None:
                return cut
        items.pop(0 if isinstance(reply, RecentReply) else -1)


def _fit_history(reply: GetReply, max_bytes: int) -> GetReply:
    """``reply`` with earlier versions left off until it fits ``max_bytes`` or none is left:
    each time the oldest of the item whose versions take the most bytes, so one large
    document's past does not push out every small one's. Sizes are summed per version and
    the reply measured whole once per round: linear in the versions, whatever their number."""
    sizes = [[len(json.dumps(v.model_dump(mode="json"))) + 1 for v in i.history or []] for i in reply.items]
    kept = [len(s) for s in sizes]
    fitted = reply
    excess = len(json.dumps(reply.model_dump(mode="json"))) - max_bytes
    while excess > 0 and any(kept):
        heap = [(-sum(s[:n]), i) for i, (s, n) in enumerate(zip(sizes, kept, strict=True)) if n]
        heapq.heapify(heap)
        while excess > 0 and heap:
            total, i = heapq.heappop(heap)
            kept[i] -= 1
            excess -= sizes[i][kept[i]]
            if kept[i]:
                heapq.heappush(heap, (total + sizes[i][kept[i]], i))
        fitted = _with_versions(reply, kept)
        excess = len(json.dumps(fitted.model_dump(mode="json"))) - max_bytes
    return fitted


def _with_versions(reply: GetReply, kept: Sequence[int]) -> GetReply:
    """``reply`` with each item's first ``kept`` earlier versions (``history_truncated`` where fewer)."""
    items = [
        item
        if n == len(item.history or [])
        else item.model_copy(update={"history": (item.history or [])[:n], "history_truncated": True})
        for item, n in zip(reply.items, kept, strict=True)
    ]
    return reply.model_copy(update={"items": items})


def _cut_to_fit(reply: GetReply, item: GetItem, size: int, max_bytes: int) -> GetReply | None:
    """``reply`` with ``item`` alone, its content cut at the end to fit ``max_bytes``
    (``size``: the JSON's size with all of it), or None if its other fields alone do not fit."""
    text = item.content or ""
    keep, used = len(text), len(json.dumps(text))
    budget = used - (size - max_bytes) - 32  # bytes the content's JSON may take
    while keep > 0 and used > budget:
        # Scaled by the bytes per character of what is kept: a few rounds for any mix of scripts.
        keep = max(0, min(keep - 1, int(keep * budget / used)))
        used = len(json.dumps(text[:keep]))
    cut = item.model_copy(update={"content": text[:keep], "content_truncated": True})
    fitted = reply.model_copy(update={"items": [cut], "truncated": len(reply.items) > 1})
    return fitted if len(json.dumps(fitted.model_dump(mode="json"))) <= max_bytes else None


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


def _size_bound(item: ResultItem) -> int:
    """Bytes one result can take as JSON at most (every character escaped as \\uXXXX)."""
    meta = sum(len(str(k)) + len(str(v)) + 8 for k, v in item.metadata.items())
    around = sum(len(c.text) + len(c.doc_id) + len(c.role) + 80 for c in item.context or ())
    around += sum(len(r.doc_id) + len(r.chunk_id) + 80 for r in item.repeats or ())
    return 6 * (len(item.text) + len(item.source) + len(item.doc_id) + len(item.chunk_id) + meta + around) + 400


def fit_reply(reply: QueryReply, max_bytes: int) -> QueryReply:
    """``reply``, with results left off its end until it fits ``max_bytes`` as JSON
    (``truncated`` then says so).

    Why: a reply over the producer's request limit (1 MiB) cannot be published, and its
    asker would hear nothing (one 2 MB chunk, or top_k results carrying big metadata,
    would do it). A bound computed from the lengths skips the encoding for ordinary replies.
    """
    if sum(_size_bound(r) for r in reply.results) + 1000 <= max_bytes:
        return reply
    results = list(reply.results)
    while True:
        fitted = reply.model_copy(
            update={"results": results, "total_retrieved": len(results), "truncated": len(results) < len(reply.results)}
        )
        # json.dumps escapes non-ASCII, the larger of the encodings a publisher may use.
        if not results or len(json.dumps(fitted.model_dump(mode="json"))) <= max_bytes:
            return fitted
        results.pop()


#: The error codes a reply may carry (docs/contract.md); askers switch on them.
REPLY_CODES = frozenset({"invalid_request", "unavailable", "unauthorized", "expired", "internal"})


def error_reply(exc: MemdError, query_id: str | None) -> ErrorReply:
    """The reply to a request that failed with ``exc`` (logged: an internal code is a bug of
    ours, an operator's business; the rest is the asker's)."""
    code = reply_code(exc)
    emit = log.error if code == "internal" else log.info
    emit("query.request_failed", query_id=query_id, code=code, cause=exc.code, error=str(exc))
    return ErrorReply(query_id=query_id, error=ErrorBody(code=code, message=str(exc)))


def reply_code(exc: MemdError) -> str:
    """The contract's code for an error: its own when it is one of them, else what it means to
    the asker. A missing index (Redis came back empty), an index that refused the command or a
    query embedding that failed are ``unavailable`` (try again later; the message says what);
    anything else is ``internal``.
    """
    if exc.code in REPLY_CODES:
        return exc.code
    if isinstance(exc, QuerySyntaxError):  # ours to fix: asking again would fail again
        return "internal"
    if exc.retryable or isinstance(exc, NotFound | IndexError_ | EmbedderError):
        return "unavailable"
    return "internal"


async def answer(
    raw: bytes | None, search: ScopedSearch, tenant: str | None = DEFAULT_TENANT
) -> QueryReply | GetReply | ListReply | ErrorReply:
    """Answer one raw request: results, or an error reply that says why. Never raises.

    This is the one place where errors become replies: an asker always hears back.
    """
    query_id = None
    try:
        req = parse_request(raw)
        query_id = req.query_id
        if tenant is None:
            raise InvalidRequest("the request topic does not name a valid tenant")
        if isinstance(req, GetRequest):
            t0 = time.monotonic()
            found = await search.lookup(
                req.wanted(), tenant=tenant, metadata_filter=req.metadata_filter, history=req.history
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
        return ErrorReply(
            query_id=qid, error=ErrorBody(code="internal", message=f"internal error: {type(exc).__name__}")
        )
