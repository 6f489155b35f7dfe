"""A LangGraph ``BaseStore`` on the daemon's Kafka contract (docs/langgraph.md).

Needs the ``langgraph`` extra (``pip install 'agent-memory-daemon[langgraph]'``); nothing else in
the project imports this module. How items map onto documents: ``consumers.store_mapping``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Collection, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import structlog
from langgraph.store.base import (
    BaseStore,
    GetOp,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    get_text_at_path,
    tokenize_path,
    validate_op_namespace,
)

from consumers.client import MemoryClient, Receipt
from consumers.errors import QueryFailed
from consumers.requests import MAX_WEIGHT, GetItem, ResultItem
from consumers.store_items import EarlierItem, earlier_item, found_item, search_item, search_item_of
from consumers.store_listing import LIST_PAGE, all_values, list_page
from consumers.store_mapping import (
    DEFAULT_FILTER_KEYS,
    ROOT,
    PushedFilter,
    item_doc_id,
    literal_prefix,
    matches_filter,
    namespace_matches,
    namespace_source,
    pushdown_filter,
    source_namespace,
    value_metadata,
)
from consumers.threaded_client import ThreadedClient
from memory.errors import InvalidRequest

T = TypeVar("T")
log = structlog.get_logger()

#: The contract's caps: ids per ``get``, values per ``list``, sources ORed in one filter, ``top_k``.
GET_BATCH, MAX_SOURCES, MAX_TOP_K = 100, 64, 100
#: How long a read waits for an item whose new version is being written in slices (the
#: contract's ``writing``: ask again shortly), and how long a put's lookup of ``created_at``
#: does. A put waits less: a write in slices whose writer died ends only when a later
#: version takes it over, and the put is that later version.
READ_WRITING_WAIT_S, PUT_WRITING_WAIT_S = 30.0, 5.0


class _Versions:
    """Strictly increasing versions: wall-clock nanoseconds, bumped past the last one given.

    Across processes the later clock wins (as for ``MemoryClient``'s microseconds); within
    one, two puts in the same nanosecond (or a clock stepped back) still get increasing ones.
    """

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        """A version above every one given before, and at least the clock in nanoseconds."""
        with self._lock:
            self._last = max(self._last + 1, time.time_ns())
            return self._last


class MemoryStore(BaseStore):
    """LangGraph's long-term memory store, kept by agentmemd.

    Every put and delete waits for the daemon's ack, so the next get or search sees it; gets
    are lookups by id; searches with a ``query`` are the daemon's hybrid search (BM25 + vector,
    fused), within the namespace prefix before fusion; searches without one list the prefix.
    """

    supports_ttl: bool = False

    def __init__(
        self,
        client: ThreadedClient,
        *,
        index: dict[str, Any] | None = None,
        filter_keys: Collection[str] = DEFAULT_FILTER_KEYS,
        recency_weight: float | None = None,
    ) -> None:
        """A store on ``client``.

        Args:
            client: the connection (its ``MemoryClient`` settings carry the tenant).
            index: LangGraph's index config; only ``fields`` is read (default ``["$"]``, the
                whole value): the daemon embeds with its own model, so ``dims`` and ``embed``
                are ignored.
            filter_keys: value fields copied into filterable metadata, so that a ``filter=`` on
                them is applied inside the daemon's search: keys the daemon can filter on (the
                built-in ones, and its ``AGENTMEM_INDEX__EXTRA_FILTER_KEYS``).
            recency_weight: the recency lift's weight in every query search (LangGraph's
                ``search`` takes none): a newer item passes an older one that matches up to
                ``1 + weight`` times as well (docs/conversation.md, "What is true now"); None:
                the daemon's default.

        Raises:
            ValueError: a negative ``recency_weight``.
        """
        if recency_weight is not None and not 0.0 <= recency_weight <= MAX_WEIGHT:
            raise ValueError(f"recency_weight must be in 0..{MAX_WEIGHT:g}, got {recency_weight}")
        self._recency_weight = recency_weight
        self._client = client
        self._fields = list((index or {}).get("fields") or ["$"])
        self._filter_keys = tuple(filter_keys)
        self._versions = _Versions()

    @classmethod
    def connect(cls, *, bootstrap: str, tenant: str | None = None, **options: Any) -> MemoryStore:
        """A store with its own ``ThreadedClient`` (``options``: ``index``, ``filter_keys``, ``recency_weight``, and
        ``MemoryClient``'s ``topics``, ``reply_partition``, ``timeout_s``)."""
        store_opts = {k: options.pop(k) for k in ("index", "filter_keys", "recency_weight") if k in options}
        return cls(ThreadedClient.connect(bootstrap=bootstrap, tenant=tenant, **options), **store_opts)

    def close(self) -> None:
        """Close the connection (a later call opens it again)."""
        self._client.close()

    def history(self, namespace: tuple[str, ...], key: str) -> list[EarlierItem]:
        """The values the item held before its current one, newest first: each put at its
        ``updated_at`` and held ``until`` a put of another value. As many as the daemon keeps
        (``AGENTMEM_INDEX__HISTORY_VERSIONS``); none after a delete. Not part of LangGraph's
        ``BaseStore``: call it on this store."""
        return self._client.call(lambda c: self._history(c, namespace, key))

    async def ahistory(self, namespace: tuple[str, ...], key: str) -> list[EarlierItem]:
        """``history``, awaited."""
        return await self._client.acall(lambda c: self._history(c, namespace, key))

    async def _history(self, c: MemoryClient, namespace: tuple[str, ...], key: str) -> list[EarlierItem]:
        (found,) = (await c.get([item_doc_id(namespace, key)], history=True)).items
        earlier = [earlier_item(v.metadata, v.timestamp, v.until) for v in found.history or []]
        return [i for i in earlier if i is not None]

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ops in order of kind: every read sees the store before this batch's writes, as in
        ``InMemoryStore``; the writes are acknowledged when this returns."""
        ops = list(ops)
        for op in ops:
            validate_op_namespace(op)
        return self._client.call(lambda c: self._run(c, ops))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """``batch``, awaited."""
        ops = list(ops)
        for op in ops:
            validate_op_namespace(op)
        return await self._client.acall(lambda c: self._run(c, ops))

    async def _run(self, c: MemoryClient, ops: list[Op]) -> list[Result]:
        results: list[Result] = [None] * len(ops)
        reads: list[tuple[int, Awaitable[Result]]] = []
        gets = [(i, op) for i, op in enumerate(ops) if isinstance(op, GetOp)]
        if gets:
            found = await self._lookup(c, [item_doc_id(op.namespace, op.key) for _, op in gets])
            for i, op in gets:
                results[i] = found_item(found.get(item_doc_id(op.namespace, op.key)))
        for i, any_op in enumerate(ops):
            if isinstance(any_op, SearchOp):
                reads.append((i, self._search(c, any_op)))
            elif isinstance(any_op, ListNamespacesOp):
                reads.append((i, self._list_namespaces(c, any_op)))
            elif not isinstance(any_op, GetOp | PutOp):
                raise ValueError(f"unknown store operation {type(any_op).__name__}")
        for (i, _), result in zip(reads, await asyncio.gather(*(r for _, r in reads)), strict=True):
            results[i] = result
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        for put in ops:
            if isinstance(put, PutOp):
                puts[(put.namespace, put.key)] = put  # the last put of a key wins, as in InMemoryStore
        if puts:
            await self._write(c, list(puts.values()))
        return results

    async def _lookup(
        self,
        c: MemoryClient,
        doc_ids: Sequence[str],
        flt: PushedFilter | None = None,
        *,
        writing_wait_s: float = READ_WRITING_WAIT_S,
    ) -> dict[str, GetItem]:
        """Found items by doc id (in ``get``s of 100; items a reply left off are asked again).
        An item's value is in its metadata, which a reply never cuts: a cut content (the text
        searched) does not matter here.

        An item being written in slices (``writing``) exists: it is asked for again until its
        write ends, for up to ``writing_wait_s``, and left out after that (logged).
        """
        wanted = list(dict.fromkeys(doc_ids))
        out: dict[str, GetItem] = {}
        deadline, pause_s = time.monotonic() + writing_wait_s, 0.05
        while wanted:
            writing: list[str] = []
            while wanted:
                reply = await c.get(wanted[:GET_BATCH], metadata_filter=flt or None)
                if not reply.items:
                    raise InvalidRequest(f"{wanted[0]!r} is larger than one reply may carry")
                out.update({i.doc_id: i for i in reply.items if i.status == "found"})
                writing += [i.doc_id for i in reply.items if i.status == "writing"]
                wanted = wanted[len(reply.items) :]
            if writing and time.monotonic() > deadline:
                log.warning("store.write_wait_expired", doc_ids=writing[:10], waited_s=writing_wait_s)
                break
            if writing:
                await asyncio.sleep(pause_s)
                pause_s = min(pause_s * 2, 1.0)
            wanted = writing
        return out

    async def _write(self, c: MemoryClient, puts: list[PutOp]) -> None:
        upserts = [op for op in puts if op.value is not None]
        # One lookup for the batch: an update keeps its item's created_at.
        keys = [item_doc_id(op.namespace, op.key) for op in upserts]
        before = await self._lookup(c, keys, writing_wait_s=PUT_WRITING_WAIT_S) if upserts else {}
        now = datetime.now(UTC)
        sends: list[Awaitable[Receipt]] = []
        for op in puts:
            doc_id = item_doc_id(op.namespace, op.key)
            if op.value is None:
                sends.append(c.delete_document(doc_id, version=self._versions.next(), wait=True))
                continue
            old = found_item(before.get(doc_id))
            metadata = value_metadata(
                op.namespace, op.key, op.value, created_at=old.created_at if old else now, filter_keys=self._filter_keys
            )
            sends.append(
                c.publish_document(
                    doc_id,
                    self._content(op),
                    version=self._versions.next(),
                    source=namespace_source(op.namespace),
                    metadata=metadata,
                    timestamp=now,
                    wait=True,
                )
            )
        for receipt in await asyncio.gather(*sends):
            if receipt.ack is not None and receipt.ack.status == "ignored":
                # A newer version is stored: another process's put of the same key, by a later clock.
                log.info("store.put_superseded", doc_id=receipt.doc_id, stored_version=receipt.ack.stored_version)

    def _content(self, op: PutOp) -> str:
        """What the daemon indexes: the text at the put's ``index`` paths, else the store's."""
        assert op.value is not None
        texts: list[str] = []
        if op.index is not False:
            for path in op.index if op.index is not None else self._fields:
                texts += get_text_at_path(op.value, path if path == "$" else tokenize_path(path))
        text = "\n".join(t for t in texts if t.strip())
        # A document needs content with a word in it: an item with none indexed is found by its key.
        return text if any(ch.isalnum() for ch in text) else (op.key if any(ch.isalnum() for ch in op.key) else "item")

    async def _sources(self, c: MemoryClient, prefix: tuple[str, ...]) -> list[str]:
        """Every namespace source under ``prefix`` (the contract's ``list`` of sources)."""
        return await all_values(c, "source", namespace_source(prefix))

    async def _search(self, c: MemoryClient, op: SearchOp) -> list[SearchItem]:
        if op.limit < 0 or op.offset < 0:
            raise InvalidRequest(f"search: limit and offset must be >= 0, got limit={op.limit} offset={op.offset}")
        if op.query is not None and not isinstance(op.query, str):
            raise InvalidRequest(f"search: query takes a string, got {type(op.query).__name__}: {op.query!r:.80}")
        flt = pushdown_filter(op.filter, self._filter_keys)
        try:
            return await self._search_filtered(c, op, flt)
        except QueryFailed as exc:
            # A key of filter_keys the daemon does not filter on fails the first filtered
            # search: say which setting of whose to change, not only the daemon's words.
            message = exc.reply.error.message
            named = [k for k in flt if f"metadata_filter key {k!r}" in message]
            if exc.error_code != "invalid_request" or not named:
                raise
            raise InvalidRequest(
                f"MemoryStore's filter_keys name {named[0]!r}, which the daemon does not filter on ({message}): "
                "leave it out of filter_keys, or add it to the daemon's AGENTMEM_INDEX__EXTRA_FILTER_KEYS"
            ) from exc

    async def _search_filtered(self, c: MemoryClient, op: SearchOp, flt: PushedFilter) -> list[SearchItem]:
        if op.query and op.query.strip():  # a blank query lists, as an empty one does (the daemon refuses it)
            return await self._query(c, op, flt)
        # Without a query: the prefix's items in doc id order (namespace, then key).
        prefix = namespace_source(op.namespace_prefix)
        if op.limit <= 0:
            return []
        if not op.filter and op.limit <= LIST_PAGE:
            ids, _ = await list_page(c, "doc_id", prefix, op.offset, op.limit)
            found = await self._lookup(c, ids)
            return [s for s in (search_item(found.get(d)) for d in ids) if s is not None]
        kept: list[SearchItem] = []
        offset = 0
        while len(kept) < op.offset + op.limit:
            ids, more = await list_page(c, "doc_id", prefix, offset, LIST_PAGE)
            found = await self._lookup(c, ids, flt)
            for d in ids:
                item = search_item(found.get(d))
                if item is not None and matches_filter(item.value, op.filter):
                    kept.append(item)
            if not more:
                break
            offset += len(ids)
        return kept[op.offset : op.offset + op.limit]

    async def _query(self, c: MemoryClient, op: SearchOp, flt: PushedFilter) -> list[SearchItem]:
        """Hybrid search within the prefix's namespaces (64 to a filter; more run side by side
        and are merged by score), each doc once, then the exact filter, offset and limit."""
        assert op.query is not None
        sources = await self._sources(c, op.namespace_prefix)
        if not sources:
            return []
        want = op.offset + op.limit
        groups = [sources[i : i + MAX_SOURCES] for i in range(0, len(sources), MAX_SOURCES)]
        # One result per doc (max_per_doc 1) while other docs match; asked for more again while
        # fewer items than wanted came back from a reply that had more to give (the value filter
        # below drops some).
        top_k = min(MAX_TOP_K, max(10, want))
        while True:
            replies = await asyncio.gather(
                *(
                    # Every item is its own: two keys holding the same text are two results.
                    c.query(
                        op.query,
                        top_k=top_k,
                        metadata_filter={**flt, "source": g},
                        recency_weight=self._recency_weight,
                        fold_repeats=False,
                        max_per_doc=1,  # one result per item: each is a doc
                    )
                    for g in groups
                )
            )
            best: dict[str, ResultItem] = {}
            for reply in replies:
                for r in reply.results:
                    if r.doc_id not in best or r.rrf_score > best[r.doc_id].rrf_score:
                        best[r.doc_id] = r
            more_to_give = any(len(r.results) >= top_k and not r.truncated for r in replies)
            if len(best) >= want or not more_to_give or top_k >= MAX_TOP_K:
                break
            top_k = min(MAX_TOP_K, 2 * top_k)
        if len(best) < want and any(r.truncated for r in replies):
            # Every chunk carries its item's value: a page of large values does not fit one reply.
            log.warning("store.search_truncated", items=len(best), wanted=want, top_k=top_k)
        ranked = sorted(best.values(), key=lambda r: (-r.rrf_score, r.doc_id))
        kept: list[SearchItem] = []
        for r in ranked:
            item = search_item_of(r.metadata, r.timestamp, r.rrf_score)
            if item is not None and matches_filter(item.value, op.filter):
                kept.append(item)
        return kept[op.offset : want]

    async def _list_namespaces(self, c: MemoryClient, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        """Namespaces holding at least one item, sorted as tuples, matched, cut to ``max_depth``."""
        narrow: tuple[str, ...] = ()
        for cond in op.match_conditions or ():
            if cond.match_type == "prefix" and len(p := literal_prefix(cond.path)) > len(narrow):
                narrow = p
        found = [ns for s in await self._sources(c, narrow) if (ns := source_namespace(s)) is not None]
        conds = op.match_conditions or ()
        kept = [ns for ns in found if all(namespace_matches(ns, m.match_type, m.path) for m in conds)]
        if op.max_depth is not None:
            kept = list({ns[: op.max_depth] for ns in kept})
        return sorted(set(kept))[op.offset : op.offset + op.limit]


__all__ = ["ROOT", "EarlierItem", "MemoryStore"]
