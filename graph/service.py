"""The GraphRAG layer's work: extract on change, recompute communities, summarize stale ones.

``GraphService`` is the façade over its parts: extraction and its cache (``graph.extractor``),
the community recompute (``graph.recompute``) and the summarizer (``graph.summarizer``); it
applies document changes to the store itself.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from graph.compute import Offload, in_thread
from graph.config import GraphConfig
from graph.contribution import Contribution, ContributionResult
from graph.extractor import ExtractionCache, Extractor
from graph.ner import SpacyNer
from graph.recompute import Recomputer, RecomputeReport
from graph.store import GraphStore
from graph.summarizer import Summarizer, SummaryPause, SummaryResult
from memory.activity import IngestActivity
from memory.chunking import chunk_position
from memory.embedder import Embedder
from memory.headings import read_alone
from memory.index import ChunkIndex
from memory.records import ChunkRecord, MemoryItem

log = structlog.get_logger()

#: Communities whose withdrawal this process remembers (to skip one withdrawn already); past
#: this many it forgets them all and withdraws again where asked.
_WITHDRAWN_KEPT = 100_000


@dataclass(frozen=True, slots=True)
class ResummarizeReport:
    """What ``GraphService.resummarize`` marked."""

    summarizer: str  # what the workers write summaries with now (``GraphConfig.summarizer``)
    marked: int  # communities marked stale for a new summary
    queued: int  # of those, already waiting for one (a change or an earlier request marked them)
    kept: int  # summaries left as they are: written by that summarizer, or none written yet


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
        extraction_cache: ExtractionCache | None = None,
        summary_pause: SummaryPause | None = None,
    ) -> None:
        self._store = store
        self._cfg = cfg
        # One owner for this service's summary claims and recompute leases.
        owner = uuid.uuid4().hex
        self._extractor = Extractor(ner=ner, cfg=cfg, mock_llm_response=mock_llm_response, cache=extraction_cache)
        self._recomputer = Recomputer(store=store, index=index, cfg=cfg, owner=owner, offload=offload)
        self._withdrawn: dict[str, int] = {}  # community -> the fencing token it was withdrawn under
        self._summarizer = Summarizer(
            store=store,
            index=index,
            embedder=embedder,
            cfg=cfg,
            recomputer=self._recomputer,
            owner=owner,
            activity=activity,
            mock_llm_response=mock_llm_response,
            pause=summary_pause,
        )

    @property
    def store(self) -> GraphStore:
        """The tenant's graph store; its parts hold the same one, so it is never replaced."""
        return self._store

    @property
    def stop(self) -> asyncio.Event:
        """Set to end the summary worker's pass and its waits (``TenantGraphs`` shares one)."""
        return self._summarizer.stop

    @stop.setter
    def stop(self, event: asyncio.Event) -> None:
        self._summarizer.stop = event

    @property
    def summaries_written(self) -> int:
        """Summaries this service wrote."""
        return self._summarizer.summaries_written

    @property
    def llm_tokens(self) -> int:
        """Tokens this service's LLM calls spent, extraction and summaries together."""
        return self._extractor.llm_tokens + self._summarizer.llm_tokens

    @property
    def chunks_extracted(self) -> int:
        """Chunk texts extracted (NER, LLM); a text found in the cache is not counted."""
        return self._extractor.chunks_extracted

    # -- extraction and change ---------------------------------------------------------

    async def extract_many(self, docs: Sequence[Sequence[ChunkRecord]]) -> list[Contribution]:
        """Each doc's contribution (identifiers + NER [+ LLM] per chunk, co-occurrence edges).

        One NER call covers every chunk of every doc: spaCy batches them, and the caller
        pays one hop to the NER thread instead of one per doc.
        """
        # Each chunk as read on its own: its code, after the fence it starts inside, reads as code.
        return await self.extract_chunks(
            [[(c.chunk_id, read_alone(c.text, c.fence)) for c in chunks] for chunks in docs]
        )

    async def extract_chunks(self, docs: Sequence[Sequence[tuple[str, str]]]) -> list[Contribution]:
        """``extract_many`` over ``(chunk_id, text)`` pairs per doc; only texts not seen lately
        are extracted (NER, LLM), each distinct one once."""
        return await self._extractor.extract_chunks(docs)

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
        out = await self._store.apply(item.doc_id, item.version, contrib)
        if item.op == "delete" and out.withdraw:
            # A replay too: a withdrawal that failed or was cut short by a crash is redone
            # when the delete comes again, before it is acknowledged.
            await self._withdraw_summaries(out.withdraw)
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

    async def _withdraw_summaries(self, cids: Sequence[str]) -> None:
        """Take the summaries of ``cids`` out of the index and the store, leaving them stale:
        after a delete or a forget, a summary may quote what was removed (extractive ones
        do, word for word), and no query may find it once the change is acknowledged. Each
        is written again from what is left.

        Under a fresh fencing token, so a summary being written from passages read before
        the removal (an older token) is refused; one written since (a newer token) read
        them after it. A community this process withdrew with nothing stored since (its
        token is still the last) is only taken out of the set.
        """
        for cid in cids:
            mine = self._withdrawn.get(cid)
            if mine is None or await self._store.summaries.token(cid) != mine:
                token = await self._store.fence()
                if await self._recomputer.delete_summary_chunk(cid, token):
                    # A gen no mark has: the community stays stale, queued to be summarized anew.
                    await self._store.summaries.commit(cid, token, "", None)
                    if len(self._withdrawn) >= _WITHDRAWN_KEPT:
                        self._withdrawn.clear()
                    self._withdrawn[cid] = token
                    log.info("graph.summary_withdrawn", community_id=cid)
            await self._store.summaries.withdrawn(cid)

    async def docs_under(self, tenant: str, prefix: str) -> set[str]:
        """The docs under ``prefix`` with a contribution here (this service's store is one tenant's)."""
        return await self._store.doc_ids_under(prefix) if tenant == self._store.tenant else set()

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
        tenant = self._store.tenant
        refreshed = 0
        doc_ids = await self._store.doc_ids()
        for start in range(0, len(doc_ids), page):
            page_ids = doc_ids[start : start + page]
            before = await index.versions(page_ids, tenant)
            read: dict[str, list[tuple[str, str]]] = {}
            for doc_id in before:
                ids = sorted(await index.chunk_ids(doc_id, tenant), key=chunk_position)
                texts = await index.versioned_texts(ids, tenant)
                read[doc_id] = [(cid, read_alone(texts[cid][0], texts[cid][2])) for cid in ids if cid in texts]
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
                out = await self._store.apply(doc_id, version, contrib, refresh=True)
                refreshed += out.applied
        log.info("graph.chunks_repointed", tenant=tenant, docs=len(doc_ids), refreshed=refreshed)
        return refreshed

    async def on_change(self, item: MemoryItem, chunks: Sequence[ChunkRecord]) -> ContributionResult:
        """Apply one document change to the graph: ``prepare`` and ``apply`` in one call."""
        (contrib,) = await self.prepare([(item, chunks)])
        return await self.apply(item, contrib)

    # -- communities and summaries -----------------------------------------------------

    async def recompute(self, *, force: bool = False) -> RecomputeReport | None:
        """Recompute communities when drift passed the threshold (or ``force``), once cluster-wide.

        Returns:
            The report, or ``None`` when not needed or another daemon holds the lock.
        """
        return await self._recomputer.recompute(force=force)

    async def drop_removed(self, *, locked: bool = False) -> int:
        """Delete the summary chunks of removed communities from the index; returns how many
        (see ``Recomputer.drop_removed``)."""
        return await self._recomputer.drop_removed(locked=locked)

    async def summarize(self, cid: str, token: int | None = None) -> SummaryResult | None:
        """Write one community's summary, index it as ``kind=community``, clear its mark.

        See ``Summarizer.summarize`` for the fencing by ``token``.

        Returns:
            The result, or ``None`` when the community no longer exists (it is dropped) or
            a later summary or removal superseded this one.

        Raises:
            MemdError: the summary could not be written (the caller retries with backoff).
        """
        return await self._summarizer.summarize(cid, token)

    async def resummarize(self, *, everything: bool = False, summarizer: str | None = None) -> ResummarizeReport:
        """Mark stale the communities whose summary another summarizer wrote (``everything``:
        every summarized community), so the workers write each again with the one configured
        now: after switching between extractive and an LLM, or between models. Summaries
        otherwise change only with their communities.

        A community with no summary yet is already queued, or has no member left to summarize:
        it is not marked. Each mark takes a new generation, so a summary that a worker is
        writing meanwhile with the old settings does not clear it. ``summarizer``: what the
        daemons' workers write with (``GraphConfig.summarizer`` of their settings), when not
        this service's own.
        """
        live = [c.id for c in await self._store.named(await self._store.communities())]
        writers = await self._store.summaries.writers(live)
        now_by = summarizer or self._cfg.summarizer
        wanted = [cid for cid in live if writers[cid] is not None and (everything or writers[cid] != now_by)]
        marked, queued = await self._store.mark(wanted)
        log.info("graph.resummarize_marked", summarizer=now_by, marked=marked, queued=queued, everything=everything)
        return ResummarizeReport(summarizer=now_by, marked=marked, queued=queued, kept=len(live) - marked)

    async def due(self, limit: int) -> list[str]:
        """Stale communities whose turn has come: those an edit marked while they had a summary
        first, then the oldest (failed ones after their backoff)."""
        return await self._summarizer.due(limit)

    async def work_once(self) -> int:
        """Summarize what is due right now (used by the worker and by tests). Returns how many."""
        return await self._summarizer.work_once()
