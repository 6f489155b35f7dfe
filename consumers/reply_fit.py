"""Replies cut to fit a Kafka record (pure): results, items, values and earlier versions left
off, or documents' contents cut, each saying so in the reply."""

from __future__ import annotations

import heapq
import json
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel

from consumers.requests import EarlierVersion, GetItem, GetReply, ListReply, QueryReply, RecentReply, ResultItem


def fit(reply: QueryReply | GetReply | ListReply, max_bytes: int) -> QueryReply | GetReply | ListReply:
    """Any reply cut to fit ``max_bytes`` as JSON, by its kind's rule (below).

    Measured with ``took_ms`` at 0 and room kept for its digits: the same reply is cut the
    same way however long it took (its digits would move the cut by a character or two)."""
    timed = reply.took_ms
    untimed = reply.model_copy(update={"took_ms": 0.0})
    budget = max_bytes - _TOOK_MS_ROOM
    if isinstance(untimed, QueryReply):
        fitted: QueryReply | GetReply | ListReply = fit_reply(untimed, budget)
    elif isinstance(untimed, GetReply):
        fitted = fit_get_reply(untimed, budget)
    else:
        fitted = fit_list_reply(untimed, budget)
    return fitted.model_copy(update={"took_ms": timed})


#: Bytes kept for a reply's ``took_ms`` beyond its "0.0": rounded to the microsecond, a day's
#: worth of milliseconds takes 12 characters.
_TOOK_MS_ROOM = 16


def _size_bound(item: ResultItem) -> int:
    """Bytes one result can take as JSON at most (every character escaped as \\uXXXX)."""
    meta = sum(len(str(k)) + len(str(v)) + 8 for k, v in item.metadata.items())
    around = sum(len(c.text) + len(c.doc_id) + len(c.role) + 80 for c in item.context or ())
    around += sum(len(r.doc_id) + len(r.chunk_id) + 80 for r in item.repeats or ())
    own = len(item.text) + len(item.source) + len(item.doc_id) + len(item.chunk_id) + len(item.section or "")
    return 6 * (own + meta + around) + 400


def fit_reply(reply: QueryReply, max_bytes: int) -> QueryReply:
    """``reply``, with results left off its end until it fits ``max_bytes`` as JSON, then the
    context turns of as many results as still fit, best first (a result whose context does
    not fit has ``context`` null). ``truncated`` then says so: results count before context.

    Why: a reply over the producer's request limit (1 MiB) cannot be published, and its
    asker would hear nothing (one 2 MB chunk, or top_k results carrying big metadata,
    would do it). A bound computed from the lengths skips the encoding for ordinary replies;
    otherwise each result is encoded once bare and, while room is left, once with its context,
    so the work is bounded by the budget, not by the reply, on the event loop every query
    shares (decision 0074).
    """
    if sum(_size_bound(r) for r in reply.results) + 1000 <= max_bytes:
        return reply
    empty = reply.model_copy(update={"results": [], "truncated": False})
    budget = max_bytes - _json_size(empty)
    bare: list[tuple[ResultItem, ResultItem, int]] = []  # (result, without its context, size)
    for result in reply.results:
        alone = result if result.context is None else result.model_copy(update={"context": None})
        if _least_size(alone) > budget:
            break  # too large whatever its encoding: it and every result after it are left off
        size = _json_size(alone) + 2  # and the ", " before it
        if size > budget:
            break
        bare.append((result, alone, size))
        budget -= size
    kept: list[ResultItem] = []
    for result, alone, size in bare:
        if result is not alone and _least_size(result) - len(alone.text) <= budget:
            whole = _json_size(result) + 2
            if whole - size <= budget:
                kept.append(result)
                budget -= whole - size
                continue
        kept.append(alone)
    cut = len(kept) < len(reply.results) or any(k is not r for k, r in zip(kept, reply.results, strict=False))
    return reply.model_copy(update={"results": kept, "total_retrieved": len(kept), "truncated": cut})


def _json_size(model: BaseModel) -> int:
    """Bytes of ``model`` as JSON, non-ASCII escaped (the larger of the encodings a publisher may use)."""
    return len(json.dumps(model.model_dump(mode="json")))


def _least_size(item: ResultItem) -> int:
    """Bytes a result takes as JSON at least: its text and its context turns' texts, one byte a character."""
    return len(item.text) + sum(len(c.text) for c in item.context or ())


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
    """``reply``, cut until it fits ``max_bytes`` as JSON.

    A get keeps every item it can: items are left off its end (``truncated`` says so) only
    while their other fields alone do not fit. Then earlier versions' contents go, the oldest
    of the item whose versions take the most bytes first (``history_truncated``; each keeps
    its number), and then the contents are cut to one length, the longest that fits, so a
    short content stays whole and the long ones share the rest (``content_truncated``: read
    on with ``content_offset``). Only if the versions' numbers alone do not fit do the
    versions go. A ``RecentReply`` leaves its oldest turns off instead, while more
    than one is left; the newest, too large alone, keeps the start of its content.
    """
    items = list(reply.items)
    # Each item encoded once (the reply's size is the sum), on the event loop every query shares.
    recent = isinstance(reply, RecentReply)
    sizes = [_json_size(_without_history(i) if recent else _bare(i)) + 2 for i in items]
    total = _json_size(reply.model_copy(update={"items": [], "truncated": False})) + sum(sizes)
    first = 0 if recent else -1
    while len(items) > 1 and total > max_bytes:
        items.pop(first)
        total -= sizes.pop(first)
    fitted, size = _fit_history(
        reply.model_copy(update={"items": items, "truncated": len(items) < len(reply.items)}), max_bytes
    )
    if size <= max_bytes or not items:
        return fitted
    cut = _cut_contents(fitted, max_bytes)
    if cut is None and any(i.history for i in fitted.items):
        # Not even the versions' numbers fit beside the items: they go, and the contents are cut.
        cut = _cut_contents(fitted.model_copy(update={"items": [_without_history(i) for i in items]}), max_bytes)
    return cut if cut is not None else fitted.model_copy(update={"items": [], "truncated": True})


def _bare(item: GetItem) -> GetItem:
    """``item`` with no content and no earlier versions: what it takes whatever is cut."""
    return _without_history(item).model_copy(update={"content": "" if item.content is not None else None})


def _without_history(item: GetItem) -> GetItem:
    """``item`` as it is with every earlier version left off (``history_truncated`` then says so)."""
    return item.model_copy(update={"history": [], "history_truncated": True}) if item.history else item


def _fit_history(reply: GetReply, max_bytes: int) -> tuple[GetReply, int]:
    """``reply`` with earlier versions' contents left off until it fits ``max_bytes`` or none
    is left (each version keeps its number and times, with ``content_truncated``: it can be
    read on its own by its number), and its size as JSON.

    Each time the oldest content of the item whose versions' contents take the most bytes
    goes, so one large document's past does not push out every small one's. Sizes are summed
    per version and the reply measured whole once per round: linear in the versions,
    whatever their number."""
    sizes = [[_json_size(v) - _json_size(_emptied(v)) for v in i.history or []] for i in reply.items]
    kept = [len(s) for s in sizes]
    fitted = reply
    excess = _json_size(reply) - max_bytes
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
        excess = _json_size(fitted) - max_bytes
    return fitted, excess + max_bytes


def _emptied(version: EarlierVersion) -> EarlierVersion:
    """``version`` without its content (``content_truncated`` says so)."""
    return version.model_copy(update={"content": "", "content_truncated": True})


def _with_versions(reply: GetReply, kept: Sequence[int]) -> GetReply:
    """``reply`` with the contents of each item's first ``kept`` earlier versions, the others
    emptied (``history_truncated`` where any is)."""
    items = [
        item
        if n == len(item.history or [])
        else item.model_copy(
            update={
                "history": [v if k < n else _emptied(v) for k, v in enumerate(item.history or [])],
                "history_truncated": True,
            }
        )
        for item, n in zip(reply.items, kept, strict=True)
    ]
    return reply.model_copy(update={"items": items})


def _cut_contents(reply: GetReply, max_bytes: int) -> GetReply | None:
    """``reply`` with its items' contents cut to one length, the most characters each that fit
    ``max_bytes`` as measured with every ``content_truncated`` false (a byte an item to spare:
    ``true`` is shorter), a shorter content kept whole; or None if the items do not fit with
    no content at all.

    The length is found by bisection over each content's escaped size per character, summed
    once (``_escaped_sizes``): a cut depends on no text past it, so a lookup may have read
    only as much of a long document as any cut keeps (``Lookups.lookup``).
    """
    texts = [item.content or "" for item in reply.items]
    bare = reply.model_copy(
        update={"items": [i.model_copy(update={"content": "" if i.content is not None else None}) for i in reply.items]}
    )
    budget = max_bytes - _json_size(bare)
    sums = [_escaped_sizes(t) for t in texts if t]
    for _ in range(_CUT_ROUNDS):
        if budget < 0:
            return None
        lo, hi = 0, max(map(len, texts))
        while lo < hi:  # the longest length whose contents take at most the budget
            mid = (lo + hi + 1) // 2
            if sum(int(c[min(mid, len(c) - 1)]) for c in sums) <= budget:
                lo = mid
            else:
                hi = mid - 1
        items = [
            i if len(t) <= lo else i.model_copy(update={"content": t[:lo], "content_truncated": True})
            for i, t in zip(reply.items, texts, strict=True)
        ]
        fitted = reply.model_copy(update={"items": items})
        over = _json_size(fitted) - max_bytes
        if over <= 0:
            return fitted
        budget -= over  # the sizes are an estimate: try again with less
    return None


#: Tries of ``_cut_contents`` before it gives up: the first fits unless ``_escaped_sizes``
#: misjudges a character, which a test rules out for every kind there is.
_CUT_ROUNDS = 3


def _escaped_sizes(text: str) -> np.ndarray:
    """Bytes the first k characters of ``text`` take as JSON with non-ASCII escaped, for each k
    (0 … len): a printable ASCII character is one, a quote, a backslash or a control character
    with a short escape two, another control character or one of the Basic Multilingual Plane
    six (``\\uXXXX``), and one past it twelve (a surrogate pair)."""
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    each = np.where((points >= 0x20) & (points <= 0x7E), 1, np.where(points > 0xFFFF, 12, 6))
    each[np.isin(points, _SHORT_ESCAPES)] = 2
    return np.concatenate(([0], np.cumsum(each)))


#: Characters JSON escapes in two bytes: the quote, the backslash, \b \t \n \f \r.
_SHORT_ESCAPES = np.array([0x22, 0x5C, 0x08, 0x09, 0x0A, 0x0C, 0x0D], dtype=np.uint32)
