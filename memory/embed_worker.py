"""The embedding model's own process, and the daemon's handle on it.

Why a process and not a thread: torch releases the GIL inside each op but takes it back
between ops, and one forward pass of the model is a few hundred ops. In a thread of the
daemon, every one of those hand-overs waits for the event loop (or spaCy, or the stemmer)
to reach the interpreter's switch interval, and the event loop in turn stalls behind the
encoder's Python glue. Measured on this machine: a batch encoded next to one busy Python
thread takes ~20% longer; next to a busy *process*, no longer at all. In its own
interpreter the model competes for cores only, which the OS schedules well.

Protocol: one duplex pipe per channel ("query", "docs"), so a large ingest batch never
queues in front of an asker's query. The parent sends a list of texts and blocks on the
answer in that channel's executor thread (``recv`` releases the GIL); the worker answers
``("ok", float32 array)``, ``("error", message)`` or ``("unavailable", message)`` (out of
memory). The worker exits when its pipes close, so it never outlives the daemon, even one
killed with SIGKILL.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import structlog

from memory.config import EmbeddingConfig
from memory.errors import BackendUnavailable, MemdError

log = structlog.get_logger()

CHANNELS = ("query", "docs")
# Fault injection for the test suite: the worker aborts, as a crash in native code would,
# on any text containing this variable's value. Never set in a deployment.
CRASH_MARKER_ENV = "AGENTMEM_TEST_EMBED_CRASH_MARKER"
READY_TIMEOUT_S = 600.0


class WorkerHung(Exception):
    """A request outlived its deadline (not an OSError, unlike TimeoutError: the worker is
    alive, so it must be killed, not mourned)."""


#: How long one request may take before the worker is taken for hung (stopped, deadlocked,
#: swapping) and killed, so the next request starts a new one. Alive but silent, it would
#: otherwise hold every query and ingestion forever. Documents get a base plus a per-text
#: allowance: a large batch on a busy 2-core machine takes tens of seconds.
QUERY_DEADLINE_S = 60.0
DOCS_DEADLINE_S = 120.0
DOCS_DEADLINE_PER_TEXT_S = 2.0
#: Past a request's deadline, a worker that still holds our thread in a blocked send or
#: read is killed (the poll loop catches the rest at the deadline itself).
WATCHDOG_GRACE_S = 5.0


class EmbedderError(MemdError):
    """The embedding model could not be loaded or failed on an input."""

    code = "embedding_failed"


class EmbedderUnavailable(BackendUnavailable):
    """The worker is gone or cannot be started: an outage, retried (never a dead letter)."""


class WorkerCrashed(EmbedderUnavailable):
    """The worker process died while it was encoding a request: retried like any outage.

    ``attributable`` says whether the input may be the cause: the worker died of a crash
    signal (SIGSEGV, SIGABRT, ...; not SIGKILL, which is the OOM killer or an operator) and
    this request was the only one in flight. Ingestion counts only those against an input.
    """

    def __init__(self, message: str, *, attributable: bool = False, signalled: bool = False) -> None:
        super().__init__(message)
        self.attributable = attributable
        #: Died of a crash signal: the input may be the cause (if it was alone in there).
        self.signalled = signalled


# How native code dies; SIGKILL (the OOM killer, kill -9) and SIGTERM say nothing of the input.
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE})


class InputCrashesWorker(EmbedderError):
    """The worker died every time it was given this input: a verdict on the input."""


class QueryRefused(EmbedderError):
    """A query text known to crash the worker: refused without reaching it. Asking again
    would be refused again, so the asker is told to change the text, not to retry."""

    code = "invalid_request"


def _failure_status(exc: Exception) -> str:
    """How the worker reports an encode failure: ``unavailable`` when the machine ran out of
    memory (MemoryError, or torch's allocator: "DefaultCPUAllocator: can't allocate memory"),
    which says nothing of the input and is waited out like an outage; ``error`` otherwise,
    the input's fault (its doc is dead-lettered)."""
    if isinstance(exc, MemoryError):
        return "unavailable"
    text = str(exc).lower()
    if isinstance(exc, RuntimeError) and ("allocat" in text and "memory" in text):
        return "unavailable"
    return "error"


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (emulated bf16 is slower than float32)."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, p, lambda: False)()) for p in probes)


def use_bf16(cfg: EmbeddingConfig) -> bool:
    """Whether encode() runs under bfloat16 autocast with these settings on this machine."""
    if cfg.precision == "auto":
        return cfg.device == "cpu" and native_bf16()
    return cfg.precision == "bfloat16"


# --- the worker side (runs in the child process) -------------------------------------------


def _load_model(path: str, cfg: EmbeddingConfig) -> Any:
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    model = SentenceTransformer(path, device=cfg.device, local_files_only=True)
    if use_bf16(cfg):
        # Autocast runs Linear layers in bf16 and casts their float32 weights on every call
        # (22 MB, ~1.5-2 ms per encode() here); weights stored in bf16 give the same vectors
        # bit for bit and skip that. LayerNorm and the rest stay float32 as autocast keeps them.
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.to(torch.bfloat16)
    return model


def load_tokenizer(path: str) -> Any:
    """The model's tokenizer, from its local folder only (never a download).

    The daemon and the worker each load their own: a fast tokenizer carries padding state
    that ``encode()`` switches on and off, so one instance is never shared across users.
    """
    from memory.imports import HEAVY_IMPORTS

    with HEAVY_IMPORTS:
        import transformers

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


def length_batches(
    lengths: Sequence[int], batch_size: int, max_waste: float = 0.1, min_slack: int = 16
) -> list[list[int]]:
    """Indices of ``lengths`` cut into model batches of similar length (pure).

    Every sequence of a batch is padded to the batch's longest, and the padding is
    computed like real tokens. sentence-transformers sorts one ``encode()`` call's texts
    and cuts them every ``batch_size``; when a call holds a streaming batch of a few
    hundred chunks of mixed length, those cuts span wide length ranges (measured on the
    ingest benchmark's chunks: 13% padding in 128-doc groups, 3% over the whole corpus
    sorted at once). Here a batch also ends where the next text is more than
    ``max_waste`` (and more than ``min_slack`` tokens) shorter than the batch's first
    (longest) one, so little is padded whatever the call's size. Short texts (queries)
    stay together: for them a batch's fixed cost (a few ms of Python) outweighs padding.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches:
            cur = batches[-1]
            head = lengths[cur[0]]
            if len(cur) < batch_size and head - lengths[i] <= max(max_waste * head, min_slack):
                cur.append(i)
                continue
        batches.append([i])
    return batches


@dataclass(frozen=True)
class _Loaded:
    model: Any
    probe: Any  # a tokenizer of its own for length probes (see _encode)
    cfg: EmbeddingConfig
    bf16: bool
    direct: bool  # whether _mean_pooled computes what the model's pipeline computes
    traced: Any = None  # the transformer traced for the query channel (see _trace_encoder), if any


def _is_mean_pooled_text_model(model: Any) -> bool:
    """Whether the pipeline is Transformer -> mean Pooling [-> Normalize], nothing else.

    That is all-MiniLM-L6-v2's, and most sentence-transformers text models'. Anything else
    (CLS pooling, a Dense head, a lowercasing module, a prompt excluded from pooling) takes
    the library's own encode().
    """
    names = [type(m).__name__ for m in model]
    if names not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return False
    transformer, pooling = model[0], model[1]
    return (
        getattr(pooling, "pooling_mode", None) == "mean"
        and getattr(pooling, "include_prompt", True)
        and not getattr(transformer, "do_lower_case", False)
        and getattr(transformer, "auto_model", None) is not None
    )


def _mean_pooled(w: _Loaded, tok: Any, texts: list[str], *, traced: bool = False) -> np.ndarray:
    """One batch through the bare transformer, mean-pooled and normalized (runs under autocast).

    What the pipeline's encode() computes (equal within 1e-5, checked at load; bit-identical
    on this model here), minus its per-call glue: ~1.5 ms of a 9 ms single-query call, ~4 ms
    of a 16-query one, measured here. Queries are encoded one small batch at a time, so that
    glue is most of what batching cannot amortize. ``traced`` runs the traced transformer
    instead of the eager one (the query channel's; see _trace_encoder); should it ever fail
    on a batch, that batch and every later one run eagerly.
    """
    import torch

    enc = _model_inputs(w, tok, texts)
    with torch.inference_mode():
        hidden = None
        if traced and w.traced is not None and not _TRACE_FAILED.is_set():
            try:
                hidden = w.traced(*(enc[k] for k in _encoder_inputs(enc)))
            except Exception as exc:  # a shape the load-time check did not cover
                _TRACE_FAILED.set()
                log.error("embed.trace_failed_at_run_time", error=f"{type(exc).__name__}: {exc}")
        if hidden is None:
            hidden = w.model[0].auto_model(**enc).last_hidden_state
        # Sums in float32 whatever the hidden states' dtype, as sentence-transformers pools.
        mask = enc["attention_mask"].unsqueeze(-1).expand(hidden.size()).to(hidden.dtype)
        summed = (hidden * mask).sum(1, dtype=torch.float32)
        pooled = summed / mask.sum(1, dtype=torch.float32).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1).cpu().numpy()


# Set once the traced transformer has failed on a batch: the worker then stays eager.
_TRACE_FAILED = threading.Event()


def _model_inputs(w: _Loaded, tok: Any, texts: list[str]) -> Any:
    """``texts`` tokenized for the bare transformer: padded, truncated, on the model's device."""
    enc = tok(texts, padding=True, truncation=True, max_length=w.model.max_seq_length, return_tensors="pt")
    return enc.to(w.cfg.device)


def _encoder_inputs(enc: Any) -> list[str]:
    return [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]


# How far the fast paths may be from the path they replace (max abs difference per component).
_SAME_WITHIN = 1e-5


def _differs(ours: np.ndarray, theirs: np.ndarray, event: str) -> bool:
    """Whether two encodings of the same texts differ by ``_SAME_WITHIN`` or more (logged)."""
    diff = float(np.abs(ours - theirs).max()) if ours.shape == theirs.shape else float("inf")
    if diff >= _SAME_WITHIN:
        log.warning(event, max_abs_diff=diff)
        return True
    return False


def _trace_encoder(w: _Loaded, tok: Any) -> Any:
    """The transformer traced and frozen with TorchScript, or None where that fails or differs.

    Why: at query sizes (a few short texts) the eager forward pass is mostly per-op dispatch,
    not arithmetic. Traced and frozen, the same ops (the autocast casts recorded into the
    graph) run ~25% faster per call at 1-5 queries and ~10-15% at 16, measured on this
    machine, with the same vectors (bit-identical here). For documents (long batches) it measured no faster,
    so only the query channel uses it. The trace is taken on a padded batch: the attention
    mask's code path is recorded, and a batch without padding computes the same through it.
    Verified against the eager path on texts of several lengths before it is used.
    """
    import warnings

    import torch

    class _Hidden(torch.nn.Module):
        def __init__(self, model: Any, keys: list[str]) -> None:
            super().__init__()
            self.model, self.keys = model, keys

        def forward(self, *inputs: Any) -> Any:
            return self.model(**dict(zip(self.keys, inputs, strict=True))).last_hidden_state

    try:
        enc = _model_inputs(w, tok, list(_DIRECT_CHECK[:2]))
        keys = _encoder_inputs(enc)
        device = w.cfg.device.split(":")[0]
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")  # TracerWarnings on shape checks the check below covers
            with torch.autocast(device, dtype=torch.bfloat16, enabled=w.bf16, cache_enabled=False):
                module = torch.jit.trace(  # type: ignore[no-untyped-call]
                    _Hidden(w.model[0].auto_model, keys).eval(), tuple(enc[k] for k in keys), check_trace=False
                )
            module = torch.jit.freeze(module.eval())
        traced = dataclasses.replace(w, traced=module)
        texts = list(_DIRECT_CHECK)
        for batch in (texts, texts[:2], texts[1:2], _QUERY_CHECK):
            ours = _encode(traced, tok, batch, traced=True)
            if _TRACE_FAILED.is_set() or _differs(ours, _encode(w, tok, batch), "embed.trace_differs"):
                return None
        return module
    except Exception as exc:
        log.warning("embed.trace_failed", error=f"{type(exc).__name__}: {exc}")
        return None


def _encode(
    w: _Loaded, tok: Any, texts: Sequence[str], *, direct: bool | None = None, traced: bool = False
) -> np.ndarray:
    """Embed ``texts`` with the calling channel's own tokenizer ``tok`` (see load_tokenizer);
    ``traced``: through the traced transformer where there is one (the query channel)."""
    import torch

    texts = list(texts)
    direct = w.direct if direct is None else direct
    # Not model.tokenizer: transformers switches a fast tokenizer's padding on and off per
    # call, and the other channel's encode() may be using it (with padding) right now.
    lengths = [len(ids) for ids in w.probe(texts, truncation=True, max_length=w.model.max_seq_length)["input_ids"]]
    out: np.ndarray | None = None
    # Autocast state is per thread: this runs in the thread that encodes.
    # No cast cache: the Linear weights are bf16 already, and a traced graph wants none.
    with torch.autocast(w.cfg.device.split(":")[0], dtype=torch.bfloat16, enabled=w.bf16, cache_enabled=False):
        for batch in length_batches(lengths, w.cfg.batch_size):
            chunk = [texts[i] for i in batch]
            if direct:
                rows = _mean_pooled(w, tok, chunk, traced=traced)
            else:
                rows = w.model.encode(
                    chunk,
                    batch_size=len(batch),
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
            if out is None:
                out = np.zeros((len(texts), rows.shape[1]), dtype=np.float32)
            out[batch] = rows
    return out if out is not None else np.zeros((0, 0), dtype=np.float32)


# Texts of different lengths, cases and scripts (an empty one, spaces only, non-ASCII), so
# padding, masking, truncation and the tokenizer's edge cases are all exercised.
_DIRECT_CHECK = (
    "Connection refused: SQLSTATE 08006 after failover",
    "why",
    "The deploy of build 4411 failed twice on the EU cluster while the cache was being warmed, "
    "and the on-call engineer rolled it back after the error budget alarm fired. " * 12,
    "",
    "   ",
    "  Köln → Zürich: ¿qué pasó? 東京のデプロイは失敗した  ",
)
# A query micro-batch as the daemon sends them: several texts of mixed short lengths.
_QUERY_CHECK = (
    "pool timeout",
    "ERR_CONN_RESET_4F2A on db-01",
    "how do I rotate the TLS certificate of the ingress controller",
    "why",
    "deadlock detected SQLSTATE 40P01 in the billing service",
    "latency",
)


def _direct_matches(w: _Loaded, tok: Any) -> bool:
    """Whether the direct path gives the pipeline's vectors on this model (else it is not used)."""
    if not _is_mean_pooled_text_model(w.model):
        return False
    try:
        ours = _encode(w, tok, _DIRECT_CHECK, direct=True)
    except Exception as exc:
        log.warning("embed.direct_path_failed", error=f"{type(exc).__name__}: {exc}")
        return False
    return not _differs(ours, _encode(w, tok, _DIRECT_CHECK, direct=False), "embed.direct_path_differs")


def _abort() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file of a model-sized process
    os.abort()


def _serve_channel(w: _Loaded, tok: Any, conn: Connection, threads: int, traced: bool) -> None:
    import torch

    crash_marker = os.environ.get(CRASH_MARKER_ENV)
    # OpenMP's thread count is a per-thread setting, so the query channel can use more
    # cores than the document channel. get_num_threads() first: torch initializes a
    # thread's count from a process-wide value on its first parallel call, which would
    # undo a setting made before it (and the two channels set different values).
    torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        while True:
            try:
                texts = conn.recv()
            except (EOFError, OSError):
                break  # the daemon closed its end (or died): nothing left to serve
            if crash_marker and any(isinstance(t, str) and crash_marker in t for t in texts):
                _abort()
            try:
                reply: tuple[str, Any] = ("ok", _encode(w, tok, texts, traced=traced))
            except Exception as exc:  # one bad input must not end the worker
                reply = (_failure_status(exc), f"{type(exc).__name__}: {exc}")
            conn.send(reply)
    except (BrokenPipeError, OSError):
        pass
    except BaseException:
        # Anything else (MemoryError, a pickling error) leaves this channel unable to answer:
        # end the whole worker, so the daemon sees it dead and starts a fresh one, rather
        # than a live process that never replies.
        os._exit(1)
    # A channel whose daemon end closed means the daemon is gone or closing: end it all.
    os._exit(0)


def serve(path: str, cfg_json: str, ready: Connection, conns: list[Connection]) -> None:
    """Child process entry point: load the model, report, then answer every channel."""
    # The worker's lifetime is its pipes': a Ctrl-C or a service manager's SIGTERM sent to
    # the whole process group must reach the daemon, which then closes them, not kill the
    # model under a request during a clean stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    cfg = EmbeddingConfig.model_validate_json(cfg_json)
    import tqdm

    # The model loader's progress bar makes tqdm create a multiprocessing lock, a named
    # semaphore registered with the resource tracker that the worker (killed, or ended with
    # its pipes) never unregisters: "leaked semaphore objects" at every daemon's exit. One
    # process, one writer: a thread lock is all tqdm needs here.
    tqdm.tqdm.set_lock(threading.RLock())
    import torch

    # What a setting of 0 means: torch's own default, read before _load_model sets anything.
    default_threads = torch.get_num_threads()
    try:
        model = _load_model(path, cfg)
        probe = load_tokenizer(path)
        # Set the probe's truncation once, here: both channel threads use it, and two first
        # calls at once could both try to switch it ("Already borrowed").
        probe(["warm"], truncation=True, max_length=model.max_seq_length)
        toks = {name: load_tokenizer(path) for name in CHANNELS}  # one per channel (padding state)
        dim_of = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        loaded = _Loaded(model, probe, cfg, use_bf16(cfg), direct=False)
        loaded = dataclasses.replace(loaded, direct=_direct_matches(loaded, toks["query"]))
        if loaded.direct:
            loaded = dataclasses.replace(loaded, traced=_trace_encoder(loaded, toks["query"]))
    except Exception as exc:
        ready.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    ready.send(("ready", int(dim_of()), loaded.bf16, loaded.direct, loaded.traced is not None))
    ready.close()
    threads_of = {"query": cfg.query_torch_threads or default_threads, "docs": cfg.torch_threads or default_threads}
    threads = [
        threading.Thread(
            target=_serve_channel,
            args=(loaded, toks[n], c, threads_of[n], n == "query"),
            name=f"embed-{n}",
            daemon=True,
        )
        for n, c in zip(CHANNELS, conns, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# --- the daemon side ------------------------------------------------------------------------


class EmbeddingWorker:
    """A handle on the worker process; restarts it when it has died.

    Blocking methods: call each channel's ``encode`` from one thread at a time (the
    embedder gives every channel its own single-thread executor).
    """

    def __init__(self, path: str, cfg: EmbeddingConfig) -> None:
        self._path, self._cfg = path, cfg
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conns: dict[str, Connection] = {}
        self.dims = 0
        self.bf16 = False
        self.direct = False  # whether the worker skips the pipeline's encode() glue (_mean_pooled)
        self.traced = False  # whether queries run through the traced transformer (_trace_encoder)
        self.restarts = 0
        self._closed = False
        # Channels with a request in the worker now, and, per dead worker, those that had
        # one when it died: a crash is pinned on an input only if it was alone in there.
        # Guarded by _cv, never by _lock (held through restarts, which take seconds).
        self._cv = threading.Condition()
        self._busy: set[str] = set()
        self._deaths: dict[int, frozenset[str]] = {}
        # Channels whose next request runs alone in the worker, and the channel running (or
        # waiting to run) alone now. Under steady query traffic a crash is rarely alone, so
        # a doc that crashes native code would be retried as an outage forever, its partition
        # blocked; after a crash shared with another request, each one's next try runs alone
        # and a crash then is the input's.
        self._isolate: set[str] = set()
        self._exclusive: str | None = None
        # multiprocessing reaps the worker with waitpid(); of two threads reaping it at once
        # (the docs and query channels both see it die, or one restarts it meanwhile), the
        # loser reads no exit code at all, and a crash would pass for a kill.
        self._reap = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The worker process's pid (None before it starts and after close; a dead worker's
        pid until the next request replaces it)."""
        proc = self._proc
        return None if proc is None else int(proc.pid)

    def start(self) -> None:
        """Spawn the worker and wait until its model is loaded (seconds).

        Raises:
            EmbedderError: the worker could not load the model or died while loading.
        """
        # spawn, not fork: a fork of a process with live threads (asyncio's, torch's) can
        # deadlock in the child.
        ctx = mp.get_context("spawn")
        ready_parent, ready_child = ctx.Pipe(duplex=False)
        pairs = {name: ctx.Pipe(duplex=True) for name in CHANNELS}
        proc = ctx.Process(
            target=serve,
            args=(self._path, self._cfg.model_dump_json(), ready_child, [child for _, child in pairs.values()]),
            name="agentmemd-embed",
            daemon=True,
        )
        proc.start()
        # Close the child's ends here, so that the worker's death shows as EOF on ours.
        ready_child.close()
        for _, child in pairs.values():
            child.close()
        try:
            if not ready_parent.poll(READY_TIMEOUT_S):
                proc.kill()
                raise EmbedderError(f"embedding worker did not load the model within {READY_TIMEOUT_S:.0f} s")
            msg = ready_parent.recv()
        except EOFError as exc:
            proc.join(5)
            raise EmbedderError(f"embedding worker exited while loading (exit code {proc.exitcode})") from exc
        finally:
            ready_parent.close()
        if msg[0] != "ready":
            proc.join(5)
            raise EmbedderError(f"cannot load embedding model {self._cfg.model!r}: {msg[1]}")
        self.dims, self.bf16, self.direct, self.traced = int(msg[1]), bool(msg[2]), bool(msg[3]), bool(msg[4])
        self._proc, self._conns = proc, {name: parent for name, (parent, _) in pairs.items()}
        log.info(
            "embed.worker_started", pid=proc.pid, dims=self.dims, bf16=self.bf16, direct=self.direct, traced=self.traced
        )

    def _channel(self, channel: str) -> tuple[Any, Connection]:
        # A query waits for a restart (another thread loading the model, up to
        # READY_TIMEOUT_S) no longer than for anything else: QUERY_DEADLINE_S.
        if not self._lock.acquire(timeout=QUERY_DEADLINE_S if channel == "query" else -1):
            raise EmbedderUnavailable(
                f"the embedding worker is restarting (a query waited {QUERY_DEADLINE_S:.0f}s): try again shortly"
            )
        try:
            return self._channel_locked(channel)
        finally:
            self._lock.release()

    def _channel_locked(self, channel: str) -> tuple[Any, Connection]:
        if self._closed:
            raise EmbedderUnavailable("the embedder is closed")
        if self._proc is None or not self._alive(self._proc):
            if self._proc is not None:
                log.error("embed.worker_died", exit_code=self._exit_code(self._proc, 0), restarts=self.restarts)
                self._close_conns()
                self._proc = None
                self.restarts += 1
            try:
                self.start()
            except EmbedderError as exc:
                # It loaded once, so this is the machine (memory, a kill), not the model:
                # an outage to wait out, not a verdict on the input.
                raise EmbedderUnavailable(f"the embedding worker could not be restarted: {exc}") from exc
            if self._closed:  # closed while it was loading
                self._discard()
                raise EmbedderUnavailable("the embedder is closed")
        return self._proc, self._conns[channel]

    def encode(self, channel: str, texts: Sequence[str], *, alone: bool = False) -> np.ndarray:
        """Embed ``texts`` on ``channel`` (blocks; run it in that channel's executor thread).

        ``alone``: run with no other request in the worker, so that a crash is this input's.

        Raises:
            EmbedderError: the model failed on this input.
            EmbedderUnavailable: the worker died meanwhile (the next call restarts it), or
                the embedder is closed.
        """
        alone = self._enter(channel, alone)
        ok = False
        try:
            status, payload = self._request(channel, texts)
            ok = True
        finally:
            self._leave(channel, alone, ok)
        if status == "unavailable":
            raise EmbedderUnavailable(f"the embedding worker ran out of memory: {payload}")
        if status != "ok":
            raise EmbedderError(str(payload))
        return np.asarray(payload, dtype=np.float32)

    def isolated(self, channel: str) -> bool:
        """Whether ``channel``'s requests run alone now (after a crash, until one gets through)."""
        with self._cv:
            return channel in self._isolate

    def _enter(self, channel: str, alone: bool = False) -> bool:
        """Mark ``channel`` busy, first waiting its turn to run alone if it must (True then).

        Raises:
            EmbedderUnavailable: a query waited ``QUERY_DEADLINE_S`` for a request running
                alone (documents wait as long as it takes).
        """
        limit = time.monotonic() + QUERY_DEADLINE_S if channel == "query" else None
        with self._cv:
            while self._exclusive not in (None, channel):
                self._wait(limit)
            alone = alone or channel in self._isolate
            if alone:
                # Reserved before the others drain, so that steady traffic on them cannot
                # keep this request waiting.
                self._exclusive = channel
                try:
                    while self._busy - {channel}:
                        self._wait(limit)
                except BaseException:
                    self._exclusive = None
                    self._cv.notify_all()
                    raise
            self._busy.add(channel)
            return alone

    def _wait(self, limit: float | None) -> None:
        """One wait on the condition (its lock held), up to ``limit`` (a monotonic time)."""
        if limit is None:
            self._cv.wait()
            return
        left = limit - time.monotonic()
        if left <= 0:  # the caller's loop comes back here once the last wait ran out
            raise EmbedderUnavailable(
                f"the embedding worker was busy with a request running alone for {QUERY_DEADLINE_S:.0f}s"
            )
        self._cv.wait(left)

    def _leave(self, channel: str, alone: bool, ok: bool) -> None:
        with self._cv:
            self._busy.discard(channel)
            if alone:
                self._exclusive = None
            if ok:  # isolated until a request of the channel gets through
                self._isolate.discard(channel)
            self._cv.notify_all()

    def _request(self, channel: str, texts: Sequence[str]) -> tuple[str, Any]:
        """One request on ``channel``'s pipe, with the worker's death and hangs turned into errors."""
        proc, conn = self._channel(channel)
        limit = QUERY_DEADLINE_S if channel == "query" else DOCS_DEADLINE_S + DOCS_DEADLINE_PER_TEXT_S * len(texts)
        deadline = time.monotonic() + limit
        # The deadline below is checked between polls; a send of a request bigger than the
        # socket's buffer to a stopped worker (SIGSTOP, a freezer), or a read of a reply it
        # stopped in the middle of, blocks before any check. The watchdog kills the worker
        # then, which ends the blocked call with an error.
        watchdog = threading.Timer(limit + WATCHDOG_GRACE_S, self._kill_unresponsive, args=(proc, channel, limit))
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.send(list(texts))
            # Never an unbounded recv(): a worker that is gone must not leave us waiting.
            while not conn.poll(1.0):
                if not self._alive(proc):
                    raise EOFError("worker exited")
                if time.monotonic() > deadline:  # hung: the handler below kills it
                    raise WorkerHung(f"the embedding worker did not answer within {limit:.0f}s")
            result: tuple[str, Any] = conn.recv()
            return result
        except (EOFError, BrokenPipeError, OSError) as exc:
            with self._cv:  # the first channel to see the death records who was in there
                in_flight = self._deaths.setdefault(proc.pid, frozenset(self._busy))
                while len(self._deaths) > 8:
                    del self._deaths[next(iter(self._deaths))]
            # It closed its pipes, so it is exiting; a core dump of a big process takes a while.
            code = self._exit_code(proc, 60)
            crashed = code is not None and code < 0 and -code in CRASH_SIGNALS
            attributable = crashed and in_flight == {channel}
            if crashed:
                # This channel's requests run alone until one gets through: a doc that
                # crashes the worker is then pinned on every try, not every other one.
                with self._cv:
                    self._isolate.add(channel)
            if crashed and not attributable:
                log.warning("embed.crash_shared", channel=channel, in_flight=sorted(in_flight), exit_code=code)
            raise WorkerCrashed(
                f"the embedding worker exited during a request (exit code {code}); it restarts on the next one",
                attributable=attributable,
                signalled=crashed,
            ) from exc
        except BaseException as exc:
            # A reply may still be unread on this pipe: the next request would read it as its
            # own. Discard the worker rather than risk answers out of step.
            with self._lock:
                if self._proc is proc:
                    self._discard()
            raise EmbedderUnavailable(
                f"embedding request interrupted ({type(exc).__name__}: {exc}); worker restarted"
            ) from exc
        finally:
            watchdog.cancel()

    def _kill_unresponsive(self, proc: Any, channel: str, limit: float) -> None:
        with self._reap:
            if proc.exitcode is not None:
                return
            log.error("embed.worker_unresponsive_killed", channel=channel, pid=proc.pid, deadline_s=limit)
            proc.kill()

    def _alive(self, proc: Any) -> bool:
        with self._reap:
            return bool(proc.is_alive())

    def _exit_code(self, proc: Any, timeout: float) -> int | None:
        """Wait up to ``timeout`` for the worker to end; its exit code (None: still running)."""
        with self._reap:
            proc.join(timeout)
            code = proc.exitcode
        return None if code is None else int(code)

    def _close_conns(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns = {}

    def _discard(self) -> None:
        """With the lock held: close the pipes and kill the process (the next call starts anew)."""
        proc, self._proc = self._proc, None
        self._close_conns()
        if proc is not None and self._alive(proc):
            proc.kill()
            self._exit_code(proc, 5)

    def close(self) -> None:
        """Stop the worker: closing the pipes ends it; a stuck one is killed.

        Never waits out a restart in progress (that can take minutes): the restarting
        thread sees the flag and discards what it started.
        """
        self._closed = True
        if not self._lock.acquire(timeout=1.0):
            return
        try:
            proc, self._proc = self._proc, None
            self._close_conns()
        finally:
            self._lock.release()
        if proc is not None:
            self._exit_code(proc, 5)
            if self._alive(proc):
                proc.kill()
                self._exit_code(proc, 5)
