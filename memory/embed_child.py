"""The embedding worker process's entry point (``serve``) and its side of the protocol.

Protocol: one duplex pipe per channel ("query", "docs"), so a large ingest batch never
queues in front of an asker's query. The parent sends a list of texts and blocks on the
answer in that channel's executor thread (``recv`` releases the GIL); the worker answers
``("ok", float32 array)``, ``("error", message)`` or ``("unavailable", message)`` (out of
memory). The worker exits when its pipes close, so it never outlives the daemon, even one
killed with SIGKILL. The parent's side is ``memory.embed_worker``.
"""

from __future__ import annotations

import os
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any

from memory.config import EmbeddingConfig
from memory.embed_model import encode, load
from memory.loaded_model import LoadedModel

CHANNELS = ("query", "docs")
# Fault injection for the test suite: the worker aborts, as a crash in native code would,
# on any text containing this variable's value. Never set in a deployment.
CRASH_MARKER_ENV = "AGENTMEM_TEST_EMBED_CRASH_MARKER"


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


def _abort() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file of a model-sized process
    os.abort()


def _serve_channel(w: LoadedModel, tok: Any, conn: Connection, threads: int, traced: bool) -> None:
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
                reply: tuple[str, Any] = ("ok", encode(w, tok, texts, traced=traced))
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

    # What a setting of 0 means: torch's own default, read before load() sets anything.
    default_threads = torch.get_num_threads()
    try:
        loaded, toks = load(path, cfg, CHANNELS)
    except Exception as exc:
        ready.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    ready.send(
        (
            "ready",
            loaded.dims(),
            loaded.bf16,
            loaded.direct,
            loaded.traced is not None,
            loaded.in_context,
            loaded.window(),
        )
    )
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
