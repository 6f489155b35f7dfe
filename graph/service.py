"""The GraphRAG layer's work: extract on change, recompute communities, summarize stale ones."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from graph.communities import assign_ids, detect
from graph.compute import Offload, in_thread
from graph.config import GraphConfig
from graph.errors import LeaseLost, LlmFailed
from graph.extraction import Entity, cap_contribution, chunk_entities, contribution_from, fingerprints
from graph.llm import EXTRACT_SYSTEM, SUMMARY_SYSTEM, complete, parse_entities, summary_prompt
from graph.ner import SpacyNer
from graph.store import Contribution, ContributionResult, GraphStore
from graph.summaries import extractive_summary
from memory.activity import IngestActivity
from memory.chunking import chunk_position
from memory.conversation import vector_text
from memory.embedder import Embedder
from memory.errors import MemdError
from memory.index import ChunkIndex
from memory.metrics import LLM_EXTRACTION_SKIPPED, LLM_TOKENS, SUMMARIES_FAILED, SUMMARIES_WRITTEN
from memory.records import COMMUNITY_PREFIX, ChunkRecord, MemoryItem

log = structlog.get_logger()

#: The recompute lease's time to live; renewed every third of it while the work runs, so a
#: daemon that dies mid-recompute holds it at most this long.
LEASE_S = 60.0
#: How long a removed community's summary tombstone (its drop's version) is kept: a day,
#: far beyond any summary writer's claim.
COMMUNITY_TOMBSTONE_S = 86_400


@dataclass
class RecomputeReport:
    """What one community recompute did."""

    communities: int
    levels: int
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    took_ms: float = 0.0


@dataclass
class SummaryResult:
    """One summary written: which community, whether its mark was cleared, its text."""

    community_id: str
    cleared: bool
    text: str
    model: str
    tokens: int = 0


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class GraphService:
    """Keeps the entity graph, communities and summaries in step with the documents."""

    def __init__(
        self,
        *,
        store: GraphStore,
        index: ChunkIndex,
        embedder: Embedder | None,
        ner: SpacyNer | None,
        cfg: GraphConfig,
        activity: IngestActivity | None = None,
        mock_llm_response: str | None = None,
        offload: Offload = in_thread,
    ) -> None:
        self.store = store
        self._activity = activity
        # Where detection and id matching run: the daemon's CommunityComputer (a process
        # of its own, see graph.compute), a thread elsewhere.
        self._offload = offload
        self._index = index
        self._embedder = embedder
        self._ner = ner
        self._cfg = cfg
        self._owner = uuid.uuid4().hex
        # Tests pass litellm's own mock_response through here; never set in production.
        self._mock = mock_llm_response
        self.stop = asyncio.Event()
        self.summaries_written = 0
        self.llm_tokens = 0
        # Chunk text digest -> its entities: an edit's unchanged chunks are not extracted again
        # (no NER, no LLM call). Bounded, least recently used first out; empty after a restart.
        self._extracted: OrderedDict[str, list[Entity]] = OrderedDict()
        self.chunks_extracted = 0

    # -- extraction and change ---------------------------------------------------------

    async def _llm_entities(self, texts: Sequence[str]) -> list[list[tuple[str, str]] | None]:
        """The LLM's entities of each text; None where the call was skipped (not to be cached)."""
        out: list[list[tuple[str, str]] | None] = []
        for text in texts:
            try:
                res = await complete(
                    self._cfg.llm_model,
                    EXTRACT_SYSTEM,
                    text,
                    timeout_s=self._cfg.llm_timeout_s,
                    mock_response=self._mock,
                )
            except MemdError as exc:
                # A refusal, a bad key, a rate limit or an unreachable model: raised, it
                # redelivered the batch at once and without end (no attempt counts, nothing
                # dead-lettered), re-embedding it and calling the model again each time, and
                # a refusal tied to the input held the partition for good. Ingestion does not
                # wait on the LLM: this batch's chunks keep their identifier and NER entities,
                # and the rest of the batch does not call the model again.
                log.warning(
                    "graph.llm_extraction_skipped", chunks=len(texts) - len(out), error=f"{type(exc).__name__}: {exc}"
                )
                LLM_EXTRACTION_SKIPPED.inc(len(texts) - len(out))
                return out + [None for _ in range(len(texts) - len(out))]
            self.llm_tokens += res.prompt_tokens + res.completion_tokens
            LLM_TOKENS.labels("extraction").inc(res.prompt_tokens + res.completion_tokens)
            try:
                out.append(parse_entities(res.text))
            except LlmFailed as exc:
                # A reply that is not the JSON asked for would fail the same way on every
                # redelivery and hold the partition for good: this chunk keeps its
                # identifier and NER entities instead, and the miss is logged.
                log.warning("graph.llm_reply_unusable", error=str(exc))
                out.append([])
        return out

    async def extract_many(self, docs: Sequence[Sequence[ChunkRecord]]) -> list[Contribution]:
        """Each doc's contribution (identifiers + NER [+ LLM] per chunk, co-occurrence edges).

        One NER call covers every chunk of every doc: spaCy batches them, and the caller
        pays one hop to the NER thread instead of one per doc.
        """
        return await self.extract_chunks([[(c.chunk_id, c.text) for c in chunks] for chunks in docs])

    async def extract_chunks(self, docs: Sequence[Sequence[tuple[str, str]]]) -> list[Contribution]:
        """``extract_many`` over ``(chunk_id, text)`` pairs per doc; only texts not seen lately
        are extracted (NER, LLM), each distinct one once."""
        digests = [_digest(text) for chunks in docs for _, text in chunks]
        known: dict[str, list[Entity]] = {}
        todo: dict[str, str] = {}
        for digest, text in zip(digests, (text for chunks in docs for _, text in chunks), strict=True):
            if digest in self._extracted:
                self._extracted.move_to_end(digest)
                known[digest] = self._extracted[digest]
            else:
                todo.setdefault(digest, text)
        texts = list(todo.values())
        ner = await self._ner.entities(texts) if self._ner is not None else [[] for _ in texts]
        llm: list[list[tuple[str, str]] | None] = (
            await self._llm_entities(texts) if self._cfg.llm_extraction and self._cfg.llm_model else [[] for _ in texts]
        )
        self.chunks_extracted += len(texts)
        fresh = {d: (t, n, x) for d, t, n, x in zip(todo, texts, ner, llm, strict=True)}
        # Identifier patterns and merging are pure Python at ~1 ms per chunk: run on the event
        # loop, a 756-chunk document stalled every query for 0.7 s (the largest allowed would
        # stall it ~9 s, near aiokafka's default 10 s session timeout, as heartbeats run on the
        # loop too). In a thread the loop keeps its turns.
        out, found = await asyncio.to_thread(self._contributions, docs, digests, known, fresh)
        for digest, ents in found.items():
            if fresh[digest][2] is not None:  # not when the LLM was skipped: that is not what this text gives
                self._remember(digest, ents)
        return out

    def _contributions(
        self,
        docs: Sequence[Sequence[tuple[str, str]]],
        digests: Sequence[str],
        known: Mapping[str, list[Entity]],
        fresh: Mapping[str, tuple[str, Sequence[tuple[str, str]], list[tuple[str, str]] | None]],
    ) -> tuple[list[Contribution], dict[str, list[Entity]]]:
        """Each doc's contribution, and the entities of each freshly extracted text (pure)."""
        found = {
            digest: chunk_entities(
                text, named, llm_found or [], aliases=self._cfg.aliases, limit=self._cfg.max_entities_per_chunk
            )
            for digest, (text, named, llm_found) in fresh.items()
        }
        out: list[Contribution] = []
        offset = 0
        for chunks in docs:
            mine = digests[offset : offset + len(chunks)]
            offset += len(chunks)
            per_chunk = [found[d] if d in found else known[d] for d in mine]
            entities, pairs = contribution_from([cid for cid, _ in chunks], per_chunk)
            kept, edges = cap_contribution(
                entities, pairs, max_entities=self._cfg.max_entities_per_doc, max_edges=self._cfg.max_edges_per_doc
            )
            if len(kept) < len(entities) or len(edges) < len(pairs):
                log.warning(
                    "graph.contribution_capped",
                    chunks=len(chunks),
                    entities=len(entities),
                    entities_kept=len(kept),
                    edges=len(pairs),
                    edges_kept=len(edges),
                )
            prints = fingerprints(kept, dict(chunks))
            out.append(Contribution(entities=kept, edges=dict(edges), fingerprints=prints))
        return out, found

    def _remember(self, digest: str, entities: list[Entity]) -> None:
        self._extracted[digest] = entities
        self._extracted.move_to_end(digest)
        while len(self._extracted) > self._cfg.extraction_cache_chunks:
            self._extracted.popitem(last=False)

    async def extract(self, chunks: Sequence[ChunkRecord]) -> Contribution:
        """One doc's contribution (see ``extract_many``)."""
        return (await self.extract_many([chunks]))[0]

    async def prepare(self, changes: Sequence[tuple[MemoryItem, Sequence[ChunkRecord]]]) -> list[Contribution | None]:
        """The contribution of each change (``None`` for a delete); writes nothing.

        The Ingestor runs this while it embeds the same chunks, so NER and embedding
        use both cores; ``apply`` then stores each result after its doc's chunks.
        """
        upserts = [chunks for item, chunks in changes if item.op == "upsert"]
        found = iter(await self.extract_many(upserts))
        return [next(found) if item.op == "upsert" else None for item, _ in changes]

    async def apply(self, item: MemoryItem, contrib: Contribution | None) -> ContributionResult:
        """Replace the doc's contribution and mark the communities it touches stale (one Lua call)."""
        t0 = time.monotonic()
        out = await self.store.apply(item.doc_id, item.version, contrib)
        if out.applied:
            log.info(
                "graph.doc_applied",
                doc_id=item.doc_id,
                op=item.op,
                entities=len(contrib.entities) if contrib else 0,
                touched=len(out.touched),
                marked_stale=len(out.marked),
                change_to_stale_ms=round((time.monotonic() - t0) * 1000, 2),
            )
        return out

    async def repoint(self, index: ChunkIndex, *, page: int = 64) -> int:
        """Re-extract every doc of this graph from ``index``'s chunks and replace its
        contribution at the same version: after a reindex that changed the chunking, the
        entities' chunk references (and co-occurrence edges) follow the new chunks.

        Left as they are: a doc the index does not hold; an unversioned doc (a transcript
        turn: nothing orders a refresh against a live edit of it, and a turn is mostly one
        chunk anyway); a doc that changed in the index while it was read, or is being
        written in slices; a doc a live
        daemon has since applied at a newer version (the store's version check). Returns the
        number of docs refreshed.
        """
        tenant = self.store.tenant
        refreshed = 0
        doc_ids = await self.store.doc_ids()
        for start in range(0, len(doc_ids), page):
            page_ids = doc_ids[start : start + page]
            before = await index.versions(page_ids, tenant)
            read: dict[str, list[tuple[str, str]]] = {}
            for doc_id in before:
                ids = sorted(await index.chunk_ids(doc_id, tenant), key=chunk_position)
                texts = await index.texts(ids, tenant)
                read[doc_id] = [(cid, texts[cid]) for cid in ids if cid in texts]
            # A sliced write stores its version only at its end: until then the chunks read
            # may mix two versions under one stored number (memory.visibility). Read after
            # the chunks and before the versions again: one that ends in between changes them.
            writing = await index.writes_in_progress(page_ids, tenant)
            # Versions again, after the chunk reads: a live write between them would pair new
            # text with an old version (or the reverse), and the store could not tell.
            after = await index.versions(page_ids, tenant)
            batch = [(d, v, read[d]) for d, v in before.items() if read[d] and after.get(d) == v and d not in writing]
            contribs = await self.extract_chunks([chunks for _, _, chunks in batch])
            for (doc_id, version, _), contrib in zip(batch, contribs, strict=True):
                out = await self.store.apply(doc_id, version, contrib, refresh=True)
                refreshed += out.applied
        log.info("graph.repointed", tenant=tenant, docs=len(doc_ids), refreshed=refreshed)
        return refreshed

    async def on_change(self, item: MemoryItem, chunks: Sequence[ChunkRecord]) -> ContributionResult:
        """Apply one document change to the graph: ``prepare`` and ``apply`` in one call."""
        (contrib,) = await self.prepare([(item, chunks)])
        return await self.apply(item, contrib)

    # -- communities -------------------------------------------------------------------

    async def recompute(self, *, force: bool = False) -> RecomputeReport | None:
        """Recompute communities when drift passed the threshold (or ``force``), once cluster-wide.

        Returns:
            The report, or ``None`` when not needed or another daemon holds the lock.
        """
        if not force and not await self._recompute_due():
            return None
        async with self._lease("recompute") as lease:
            if lease is None:
                return None
            return await self._recompute_under(lease, force=force)

    @contextlib.asynccontextmanager
    async def _lease(self, name: str) -> AsyncIterator[str | None]:
        """Hold the named singleton lease (``None``: another holds it), renewed every third
        of its time while the work runs, so a long recompute (Leiden on a big graph) is never
        left without it while another daemon starts a second one."""
        lease = await self.store.lock(name, self._owner, ttl_s=LEASE_S)
        if lease is None:
            yield None
            return
        done = asyncio.Event()

        async def renew() -> None:
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), timeout=LEASE_S / 3)
                if done.is_set():
                    return
                try:
                    if not await self.store.renew(name, lease, LEASE_S):
                        log.warning("graph.lease_lost", lease=name)  # the commit will refuse
                        return
                except MemdError as exc:  # Redis away: the lease may lapse; the commit checks it
                    log.warning("graph.lease_renew_failed", lease=name, error=str(exc))

        renewer = asyncio.create_task(renew(), name=f"graph-{name}-lease")
        try:
            yield lease
        finally:
            done.set()
            await asyncio.wait({renewer}, timeout=5)
            await self.store.unlock(name, lease)

    async def _recompute_under(self, lease: str, *, force: bool) -> RecomputeReport | None:
        t0 = time.monotonic()
        # Read again under the lock: another daemon may have recomputed (and subtracted
        # the drift it saw) since the check above; subtracting it twice would take the
        # drift below zero and delay every later recompute.
        if not force and not await self._recompute_due():
            return None
        drift = await self.store.drift()
        nodes, edges = await self.store.graph()
        raw = await self._offload(
            detect,
            sorted(nodes),
            [(a, b, float(w)) for a, b, w in edges],
            seed=self._cfg.seed,
            resolution=self._cfg.resolution,
            max_size=self._cfg.max_community_size,
            max_levels=self._cfg.max_levels,
        )
        old = await self.store.communities()
        # Off the event loop as well: on a graph of thousands of communities, matching
        # takes long enough to stall queries and consumers' heartbeats.
        result = await self._offload(assign_ids, raw, old, threshold=self._cfg.match_threshold)
        now = time.time()
        try:
            await self.store.replace_communities(
                result.communities,
                changed=result.changed,
                removed=result.removed,
                events=result.events,
                drift_seen=drift,
                now=now,
                lease=lease,
            )
        except LeaseLost as exc:
            # Another daemon's recompute holds it now: its result stands, ours is dropped.
            log.warning("graph.recompute_superseded", error=str(exc), took_ms=round((time.monotonic() - t0) * 1000))
            return None
        await self.drop_removed(locked=True)
        report = RecomputeReport(
            communities=len(result.communities),
            levels=len({c.level for c in result.communities}),
            changed=sorted(result.changed),
            removed=sorted(result.removed),
            events=result.events,
            took_ms=(time.monotonic() - t0) * 1000,
        )
        log.info(
            "graph.communities_recomputed",
            communities=report.communities,
            levels=report.levels,
            changed=len(report.changed),
            removed=len(report.removed),
            merges=sum(e["type"] == "merge" for e in report.events),
            splits=sum(e["type"] == "split" for e in report.events),
            nodes=len(nodes),
            edges=len(edges),
            took_ms=round(report.took_ms, 1),
        )
        return report

    async def _recompute_due(self) -> bool:
        if await self.store.drift() < self._cfg.drift_threshold:
            return False
        # During a bulk load drift passes the threshold every few seconds; recomputing that
        # often would spend the cores on Leiden and re-summaries instead of ingestion.
        return time.time() - await self.store.last_recompute() >= self._cfg.recompute_min_interval_s

    async def drop_removed(self, *, locked: bool = False) -> int:
        """Delete the summary chunks of removed communities from the index; returns how many.

        A recompute records removed ids in the same transaction that forgets them, so a
        failure here (or a crash) leaves them for the next pass instead of in the index for
        good. Each delete is versioned with a fresh fencing token: a summary of the old
        community still being written (an earlier token) can no longer land after it.
        """
        pending = await self.store.pending_drops()
        if not pending:
            return 0
        # Under the recompute lock (``locked``: the caller holds it), so that no recompute can
        # bring an id back between the check below and its delete.
        if locked:
            return await self._drop_pending()
        async with self._lease("recompute") as lease:
            return 0 if lease is None else await self._drop_pending()  # None: a recompute drops them

    async def _drop_pending(self) -> int:
        done = 0
        live = {c.id for c in await self.store.communities()}
        for cid in await self.store.pending_drops():
            if cid not in live:  # else the id came back in a later recompute: its summary is live
                await self._delete_summary_chunk(cid, await self.store.fence())
            await self.store.dropped(cid)
            done += 1
        return done

    async def _delete_summary_chunk(self, cid: str, token: int) -> bool:
        """Delete a community's summary chunk, versioned by ``token``; false when a later token won."""
        empty = np.zeros((0, 1), np.float32)
        # The tombstone only has to outlast a summary writer of the removed community still
        # running (claims last minutes); kept for good, community churn grew them unbounded.
        result = await self._index.apply(
            COMMUNITY_PREFIX + cid, token, [], empty, self.store.tenant, version_ttl_s=COMMUNITY_TOMBSTONE_S
        )
        return result.applied

    # -- summaries ---------------------------------------------------------------------

    async def _excerpts(self, members: Sequence[str]) -> list[str]:
        """Chunk texts that mention the most members, best first, deduplicated."""
        counts: dict[str, int] = {}
        for m in members:
            for cid in await self.store.entity_chunks([m]):
                counts[cid] = counts.get(cid, 0) + 1
        ranked = sorted(counts, key=lambda c: (-counts[c], c))[:30]
        texts = await self._index.texts(ranked, self.store.tenant)
        return [texts[c] for c in ranked if c in texts]

    async def summarize(self, cid: str, token: int | None = None) -> SummaryResult | None:
        """Write one community's summary, index it as ``kind=community``, clear its mark.

        The mark is cleared only if the community was not marked again while this ran.
        ``token`` is the claim's fencing token (a fresh one when not given): the chunk and
        the record are stored only if no summary of a later token was, and the record only
        while the community exists, so a worker whose claim expired mid-summary can never
        overwrite a newer summary or bring back a removed community's.

        Returns:
            The result, or ``None`` when the community no longer exists (it is dropped) or
            a later summary or removal superseded this one.

        Raises:
            MemdError: the summary could not be written (the caller retries with backoff).
        """
        if token is None:
            token = await self.store.fence()
        gen = await self.store.mark_count(cid)
        comm = await self.store.community(cid)
        if comm is None:
            await self.store.clear_if_unchanged(cid, gen)
            return None
        doc_id = COMMUNITY_PREFIX + cid
        # Members whose every document was deleted since the last recompute are gone from the
        # graph; membership only changes at a recompute, so drop them here, or the summary
        # would keep naming what no document says any more.
        nodes = await self.store.nodes(sorted(comm.members))
        members = sorted(m for m in comm.members if m in nodes)
        if not members:
            cleared = False
            if await self._delete_summary_chunk(cid, token):
                _, cleared = await self.store.commit_summary(cid, token, gen, None)
            log.info("graph.summary_dropped", community_id=cid, reason="no live members", cleared=cleared)
            return None
        names = {m: nodes[m][0] for m in members}
        weights = {m: float(len(await self.store.entity_chunks([m]))) for m in members}
        excerpts = await self._excerpts(members)
        tokens = 0
        if self._cfg.llm_model:
            budget, picked, words = self._cfg.summary_token_budget, [], 0
            for e in excerpts:
                n = len(e.split())
                if words + n > budget:
                    break
                picked.append(e)
                words += n
            res = await complete(
                self._cfg.llm_model,
                SUMMARY_SYSTEM,
                summary_prompt(cid, [names[m] for m in members], picked),
                timeout_s=self._cfg.llm_timeout_s,
                mock_response=self._mock,
            )
            text, model, tokens = res.text, self._cfg.llm_model, res.prompt_tokens + res.completion_tokens
            self.llm_tokens += tokens
            LLM_TOKENS.labels("summary").inc(tokens)
        else:
            text = extractive_summary(
                excerpts,
                names,
                weights,
                max_sentences=self._cfg.summary_sentences,
                word_budget=self._cfg.summary_token_budget,
            )
            model = "extractive"
        now = time.time()
        top = sorted(members, key=lambda m: (-weights[m], m))[:20]
        record = ChunkRecord(
            chunk_id=doc_id,
            doc_id=doc_id,
            position=0,
            text=text,
            kind="community",
            source="graph",
            tags={"doc_id": doc_id, "kind": "community", "source": "graph"},
            metadata={
                "community_id": cid,
                "level": comm.level,
                "member_count": len(members),
                "members": ", ".join(names[m] for m in top),
                "parent": comm.parent or "",
                "model": model,
            },
            version=int(gen),
            timestamp=now,
            tenant=self.store.tenant,
        )
        if self._embedder is None:
            raise MemdError("summaries need an embedder")
        vectors = await self._embedder.embed_documents([vector_text(text, "")])
        wrote = await self._index.apply(doc_id, token, [record], vectors, self.store.tenant)
        written = cleared = False
        if wrote.applied:
            written, cleared = await self.store.commit_summary(
                cid, token, gen, {"text": text, "model": model, "gen": gen, "written_at": now, "level": comm.level}
            )
        if not written:
            # A later claim's summary, or the community's removal, got there first; a removal
            # deletes the chunk under its own (later) token.
            log.info("graph.summary_superseded", community_id=cid, token=token)
            return None
        self.summaries_written += 1
        SUMMARIES_WRITTEN.inc()
        await self.store.incr("summaries_written")
        log.info(
            "graph.summary_written", community_id=cid, level=comm.level, model=model, cleared=cleared, tokens=tokens
        )
        return SummaryResult(cid, cleared, text, model, tokens)

    async def due(self, limit: int) -> list[str]:
        """Stale communities whose turn has come (oldest first; failed ones after their backoff)."""
        return await self.store.due(time.time(), limit)

    async def work_once(self) -> int:
        """Summarize what is due right now (used by the worker and by tests). Returns how many."""
        done = 0
        await self.drop_removed()
        for cid in await self.due(max(self._cfg.summarizer_concurrency, 1) * 4):
            await self._yield_to_ingestion()
            if self.stop.is_set():
                break
            # Taken only while still due: another worker may have summarized it since `due`.
            token = await self.store.claim(cid, self._owner, self._cfg.claim_ttl_s)
            if token is None:
                continue
            try:
                if await self.summarize(cid, token) is not None:
                    done += 1
            except MemdError as exc:
                attempts = await self.store.failures(cid) + 1
                delay = min(self._cfg.summary_retry_initial_s * 2 ** (attempts - 1), self._cfg.summary_retry_max_s)
                await self.store.record_failure(cid, time.time() + delay)
                SUMMARIES_FAILED.inc()
                log.warning(
                    "graph.summary_failed", community_id=cid, attempts=attempts, retry_in_s=delay, error=str(exc)
                )
            finally:
                await self.store.release(cid, self._owner, token)
            await self._sleep(60.0 / self._cfg.summarizer_rate_per_min)
        return done

    async def _yield_to_ingestion(self) -> None:
        """Wait (bounded) until ingestion is quiet before starting a summary.

        A summary is background work: its Redis reads and Python run on the event loop
        and its embedding on the ingestion embedding thread. Measured in bench/ingest.py,
        the backlog left by a bulk load's last recompute (586 stale communities) pushed
        freshness p95 from ~0.25 s to 1.6 s while it was worked off at full rate.
        """
        if self._activity is None or self._cfg.summarizer_quiet_s <= 0:
            return
        waited = 0.0
        while not self.stop.is_set():
            delay = self._activity.wait_s(
                deferred_s=waited,
                quiet_s=self._cfg.summarizer_quiet_s,
                max_defer_s=self._cfg.summarizer_max_defer_s,
            )
            if delay <= 0:
                return
            await self._sleep(delay)
            waited += delay

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), timeout=seconds)
