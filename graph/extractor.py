"""Extraction of documents' contributions: NER over every chunk in one batch, the LLM when
configured, and the pure merge of ``graph.extraction`` in a thread; a bounded cache of recent
chunk texts' entities spares an edit's unchanged chunks the work."""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import structlog

from graph.config import GraphConfig
from graph.contribution import Contribution
from graph.errors import LlmFailed
from graph.extraction import Entity, cap_contribution, chunk_entities, contribution_from, fingerprints
from graph.llm import EXTRACT_SYSTEM, complete, endpoint, parse_entities
from graph.ner import SpacyNer
from memory.errors import MemdError
from memory.headings import prose
from memory.metrics import LLM_EXTRACTION_SKIPPED, LLM_TOKENS

log = structlog.get_logger()


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


#: Chunk text digest -> its entities, least recently used first.
ExtractionCache = OrderedDict[str, list[Entity]]


class Extractor:
    """Turns documents' chunk texts into their contributions to the graph."""

    def __init__(
        self,
        *,
        ner: SpacyNer | None,
        cfg: GraphConfig,
        mock_llm_response: str | None = None,
        cache: ExtractionCache | None = None,
    ) -> None:
        self._ner = ner
        self._cfg = cfg
        # Tests pass litellm's own mock_response through here; never set in production.
        self._mock = mock_llm_response
        self.llm_tokens = 0
        # An edit's unchanged chunks are not extracted again (no NER, no LLM call). Bounded by
        # extraction_cache_chunks, empty after a restart, and one per process (every tenant's
        # extractor is given the same: what a text holds does not depend on whose it is).
        self._extracted: ExtractionCache = OrderedDict() if cache is None else cache
        self.chunks_extracted = 0

    async def _llm_entities(self, texts: Sequence[str]) -> list[list[tuple[str, str]] | None]:
        """The LLM's entities of each text, ``llm_concurrency`` calls at a time (ingestion waits
        for them); None where the call was skipped (not to be cached)."""
        out: list[list[tuple[str, str]] | None] = [None] * len(texts)
        gate = asyncio.Semaphore(self._cfg.llm_concurrency)
        failed: list[str] = []

        async def one(i: int, text: str) -> None:
            async with gate:
                if failed:
                    return  # the model failed this batch: the rest do not call it again
                try:
                    res = await complete(
                        self._cfg.llm_model,
                        EXTRACT_SYSTEM,
                        text,
                        timeout_s=self._cfg.llm_timeout_s,
                        mock_response=self._mock,
                        **endpoint(self._cfg),
                    )
                except MemdError as exc:
                    # A refusal, a bad key, a rate limit, a timeout or an unreachable model:
                    # raised, it redelivered the batch at once and without end (no attempt
                    # counts, nothing dead-lettered), and a refusal tied to the input held the
                    # partition for good. These chunks keep their identifier and NER entities.
                    failed.append(f"{type(exc).__name__}: {exc}")
                    return
            self.llm_tokens += res.prompt_tokens + res.completion_tokens
            LLM_TOKENS.labels("extraction").inc(res.prompt_tokens + res.completion_tokens)
            try:
                out[i] = parse_entities(res.text)
            except LlmFailed as exc:
                # A reply that is not the JSON asked for would fail the same way on every
                # redelivery and hold the partition for good: this chunk keeps its
                # identifier and NER entities instead, and the miss is logged.
                log.warning("graph.llm_reply_rejected", error=str(exc))
                out[i] = []

        await asyncio.gather(*(one(i, t) for i, t in enumerate(texts)))
        if failed:
            skipped = sum(1 for x in out if x is None)
            log.warning("graph.llm_extraction_skipped", chunks=skipped, error=failed[0])
            LLM_EXTRACTION_SKIPPED.inc(skipped)
        return out

    async def extract_chunks(self, docs: Sequence[Sequence[tuple[str, str]]]) -> list[Contribution]:
        """Each doc's contribution from its ``(chunk_id, text)`` pairs; only texts not seen
        lately are extracted (NER, LLM), each distinct one once."""
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
        ner = await self._ner.entities([prose(t) for t in texts]) if self._ner is not None else [[] for _ in texts]
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
