"""Community summaries: one community's summary (the LLM's, or extractive), indexed as
``kind=community`` under a fencing token, and the worker's pass over the stale ones due."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import structlog

from graph.config import GraphConfig
from graph.llm import SUMMARY_SYSTEM, complete, endpoint, summary_prompt
from graph.recompute import Recomputer
from graph.store import GraphStore
from graph.summaries import community_sources, extractive_summary
from memory.activity import IngestActivity
from memory.chunking import chunk_doc
from memory.conversation import vector_text
from memory.embedder import Embedder
from memory.errors import MemdError
from memory.headings import read_alone
from memory.index import ChunkIndex
from memory.metrics import LLM_TOKENS, SUMMARIES_FAILED, SUMMARIES_WRITTEN
from memory.records import COMMUNITY_PREFIX, ChunkRecord
from memory.retrying import doubling, pause

log = structlog.get_logger()

#: Most members an LLM summary's prompt names (the most mentioned first).
PROMPT_MEMBERS = 50


@dataclass
class SummaryPause:
    """The pause after failed summaries, shared by every tenant's summarizer of a process (they
    call one model): how many failed in a row, and until when no summary starts."""

    failing: int = 0
    until: float = float("-inf")  # time.monotonic()


@dataclass
class SummaryResult:
    """One summary written: which community, whether its mark was cleared, its text."""

    community_id: str
    cleared: bool
    text: str
    model: str
    tokens: int = 0


class Summarizer:
    """Writes the summaries of one graph's stale communities, one claim at a time."""

    def __init__(
        self,
        *,
        store: GraphStore,
        index: ChunkIndex,
        embedder: Embedder | None,
        cfg: GraphConfig,
        recomputer: Recomputer,
        owner: str,
        activity: IngestActivity | None = None,
        mock_llm_response: str | None = None,
        pause: SummaryPause | None = None,
    ) -> None:
        self._store = store
        self._index = index
        self._embedder = embedder
        self._cfg = cfg
        # A pass first drops removed communities' summary chunks, and a community left with no
        # live members has its chunk deleted: both under the recompute's lease and tombstones.
        self._recomputer = recomputer
        self._owner = owner
        self._activity = activity
        # Tests pass litellm's own mock_response through here; never set in production.
        self._mock = mock_llm_response
        self.stop = asyncio.Event()
        self.summaries_written = 0
        self.llm_tokens = 0
        self._pause = SummaryPause() if pause is None else pause

    async def _excerpts(self, chunks: Mapping[str, Sequence[str]]) -> list[str]:
        """Chunk texts that mention the most members (``chunks``: each member's chunk ids), best
        first, deduplicated.

        The graph names the chunks, the index holds their texts, and a doc's chunks are
        written before its graph change: in between (longer for a doc written in slices, or
        after a crash until the event comes back), an edit that shifted the chunk ids leaves
        the graph's ids pointing at other passages. Such an edit may change no entity, so
        nothing would mark the summary stale again: the texts are used only if each is of the
        version the graph holds for its doc, and the members' chunks were the same before and
        after the read.

        Raises:
            MemdError: the passages and the graph are out of step (retried after a backoff).
        """
        counts: dict[str, int] = {}
        for ids in chunks.values():
            for cid in ids:
                counts[cid] = counts.get(cid, 0) + 1
        ranked = sorted(counts, key=lambda c: (-counts[c], c))[:30]
        graph_versions = await self._store.contribution_versions(sorted({chunk_doc(c) for c in ranked}))
        read = await self._index.versioned_texts(ranked, self._store.tenant)
        # An unversioned doc (a turn: None in the graph, 0 on its chunks) has no version to compare.
        behind = sorted(
            {d for c, (_, v, _) in read.items() if (g := graph_versions.get(d := chunk_doc(c))) is not None and g != v}
        )
        if behind:
            raise MemdError(
                f"passages out of step with the graph: docs {behind[:3]} changed, their graph change pending"
            )
        if await self._store.chunks_of_each(list(chunks)) != chunks:
            raise MemdError("the graph changed while its passages were read")
        # A passage cut from inside fenced code opens with its fence again: read alone, its
        # code would pass for prose (and its closing fence open a block of the prose after it).
        return [read_alone(text, fence) for c in ranked if c in read for text, _, fence in [read[c]]]

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
            token = await self._store.fence()
        gen = await self._store.mark_count(cid)
        comm = await self._store.community(cid)
        if comm is None:
            await self._store.clear_if_unchanged(cid, gen)
            return None
        doc_id = COMMUNITY_PREFIX + cid
        # Members whose every document was deleted since the last recompute are gone from the
        # graph; membership only changes at a recompute, so drop them here, or the summary
        # would keep naming what no document says any more.
        nodes = await self._store.nodes(sorted(comm.members))
        members = sorted(m for m in comm.members if m in nodes)
        if not members:
            cleared = False
            if await self._recomputer.delete_summary_chunk(cid, token):
                _, cleared = await self._store.summaries.commit(cid, token, gen, None)
            log.info("graph.summary_dropped", community_id=cid, reason="no live members", cleared=cleared)
            return None
        names = {m: nodes[m][0] for m in members}
        chunks = await self._store.chunks_of_each(members)
        weights = {m: float(len(chunks[m])) for m in members}
        excerpts = await self._excerpts(chunks)
        tokens = 0
        central = sorted(members, key=lambda m: (-weights[m], m))
        if self._cfg.llm_model:
            # The most mentioned members, within a quarter of the word budget: a community of
            # 1,500 entities put 75,000 characters of names, in name order, before any excerpt.
            budget, words = self._cfg.summary_token_budget, 0
            shown: list[str] = []
            for m in central[:PROMPT_MEMBERS]:
                n = len(names[m].split())
                if shown and words + n > budget // 4:
                    break
                shown.append(names[m])
                words += n
            picked: list[str] = []
            for e in excerpts:
                n = len(e.split())
                if words + n > budget:
                    break
                picked.append(e)
                words += n
            res = await complete(
                self._cfg.llm_model,
                SUMMARY_SYSTEM,
                summary_prompt(cid, shown, picked, of=len(members)),
                timeout_s=self._cfg.llm_timeout_s,
                mock_response=self._mock,
                **endpoint(self._cfg),
            )
            text, tokens = res.text, res.prompt_tokens + res.completion_tokens
            self.llm_tokens += tokens
            LLM_TOKENS.labels("summary").inc(tokens)
        else:
            text = extractive_summary(
                excerpts,
                names,
                weights,
                max_sentences=self._cfg.summary_sentences,
                word_budget=self._cfg.summary_token_budget,
                sources=community_sources(chunks),
            )
        model = self._cfg.summarizer
        now = time.time()
        top = central[:20]
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
            tenant=self._store.tenant,
        )
        if self._embedder is None:
            raise MemdError("summaries need an embedder")
        vectors = await self._embedder.embed_documents([vector_text(text, "")])
        if await self._store.erased():
            # Erased while this summary was written (an LLM call takes up to a minute): its
            # chunk must not outlive the erase's sweep.
            log.info("graph.summary_dropped", community_id=cid, reason="tenant erased")
            return None
        wrote = await self._index.apply(doc_id, token, [record], vectors, self._store.tenant)
        written = cleared = False
        if wrote.applied:
            written, cleared = await self._store.summaries.commit(
                cid, token, gen, {"text": text, "model": model, "gen": gen, "written_at": now, "level": comm.level}
            )
        if not written:
            # A later claim's summary, or the community's removal, got there first; a removal
            # deletes the chunk under its own (later) token.
            log.info("graph.summary_superseded", community_id=cid, token=token)
            return None
        self.summaries_written += 1
        SUMMARIES_WRITTEN.inc()
        await self._store.incr("summaries_written")
        # community_level: "level" is the log record's own (info, warning).
        log.info(
            "graph.summary_written",
            community_id=cid,
            community_level=comm.level,
            model=model,
            cleared=cleared,
            tokens=tokens,
        )
        return SummaryResult(cid, cleared, text, model, tokens)

    async def due(self, limit: int) -> list[str]:
        """Stale communities whose turn has come: those an edit marked while they had a summary
        first, then the oldest (failed ones after their backoff)."""
        return await self._store.due(time.time(), limit)

    async def work_once(self) -> int:
        """Summarize what is due right now (used by the worker and by tests). Returns how many."""
        done = 0
        await self._recomputer.drop_removed()
        if time.monotonic() < self._pause.until:
            return 0
        for cid in await self.due(max(self._cfg.summarizer_concurrency, 1) * 4):
            await self._yield_to_ingestion()
            if self.stop.is_set():
                break
            # Taken only while still due: another worker may have summarized it since `due`.
            token = await self._store.claim(cid, self._owner, self._cfg.claim_ttl_s)
            if token is None:
                continue
            try:
                if await self.summarize(cid, token) is not None:
                    done += 1
            except Exception as exc:
                # Any failure, a bug's too, backs this community off with its reason: retried at
                # once, one community that always fails would hold the worker for ever.
                why = str(exc) if isinstance(exc, MemdError) else f"{type(exc).__name__}: {exc}"
                # The next community would most likely fail alike (a model down, a rate limit):
                # the worker pauses too, doubling while summaries keep failing, so a failing
                # model is not called for every community in turn.
                self._pause.failing += 1
                pause_s = self._backoff_s(self._pause.failing)
                self._pause.until = time.monotonic() + pause_s
                attempts = await self._store.failures(cid) + 1
                # Tried again no sooner than the pause ends: the stale queue shows when it is.
                delay = max(self._backoff_s(attempts), pause_s)
                await self._store.record_failure(cid, time.time() + delay, self._owner, token, why)
                SUMMARIES_FAILED.inc()
                log.warning("graph.summary_failed", community_id=cid, attempts=attempts, retry_in_s=delay, error=why)
                log.warning("graph.summaries_paused", pause_s=pause_s, failures_in_a_row=self._pause.failing)
                break
            else:
                self._pause.failing = 0
            finally:
                await self._store.release(cid, self._owner, token)
            await self._sleep(60.0 / self._cfg.summarizer_rate_per_min)
        return done

    def _backoff_s(self, failures: int) -> float:
        """The wait after ``failures`` failed summaries in a row, of a community or of the worker."""
        return doubling(failures, self._cfg.summary_retry_initial_s, self._cfg.summary_retry_max_s)

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
        await pause(self.stop, seconds)
