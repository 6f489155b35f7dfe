"""The daemon's handle on the embedding model's own process: it starts, supervises and
restarts the worker, and turns its deaths and hangs into errors.

A process, not a thread: torch takes the GIL back between its few hundred ops per forward
pass, so in a thread the encoder and the event loop stall behind each other; in its own
interpreter the model competes for cores only (decision 0003).

The worker's entry point and its side of the pipe protocol are ``memory.embed_child``;
the model code it runs is ``memory.embed_model``.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import structlog

from memory.config import EmbeddingConfig
from memory.embed_child import CHANNELS, CRASH_MARKER_ENV, serve
from memory.errors import (  # the embedder's errors live with the others; importable from here too
    EmbedderError,
    EmbedderUnavailable,
    InputCrashesWorker,
    QueryRefused,
    WorkerCrashed,
)
from memory.watchdog import Watchdog

# The worker's names that callers have always imported from here.
__all__ = [
    "CHANNELS",
    "CRASH_MARKER_ENV",
    "DOCS_DEADLINE_PER_TEXT_S",
    "DOCS_DEADLINE_S",
    "QUERY_DEADLINE_S",
    "READY_TIMEOUT_S",
    "WATCHDOG_GRACE_S",
    "EmbedderError",
    "EmbedderUnavailable",
    "EmbeddingWorker",
    "InputCrashesWorker",
    "QueryRefused",
    "WorkerCrashed",
    "WorkerHung",
]

log = structlog.get_logger()

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
#: The one thread that kills workers past their deadlines, for every worker of the process.
WATCHDOG = Watchdog("embed-watchdog")


# How native code dies; SIGKILL (the OOM killer, kill -9) and SIGTERM say nothing of the input.
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE})


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
        self.direct = False  # whether the worker skips the pipeline's encode() glue (mean_pooled)
        self.traced = False  # whether queries run through the traced transformer (trace_encoder)
        self.in_context = False  # whether texts marked with their context are pooled alone (pooled_in_context)
        self.window = 0  # the most tokens the model reads of a text, its special tokens included
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
        self.in_context, self.window = bool(msg[5]), int(msg[6])
        self._proc, self._conns = proc, {name: parent for name, (parent, _) in pairs.items()}
        log.info(
            "embed.worker_started",
            pid=proc.pid,
            dims=self.dims,
            bf16=self.bf16,
            direct=self.direct,
            traced=self.traced,
            in_context=self.in_context,
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
        watch = WATCHDOG.arm(limit + WATCHDOG_GRACE_S, self._kill_unresponsive, proc, channel, limit)
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
            WATCHDOG.disarm(watch)

    def _kill_unresponsive(self, proc: Any, channel: str, limit: float) -> None:
        # On the watchdog's one thread, which must not block: a reaper may hold the lock
        # for seconds. Killing without it is safe, as a pid is not reused until reaped.
        reaped = self._reap.acquire(timeout=0.5)
        try:
            if reaped and proc.exitcode is not None:
                return
            log.error("embed.worker_unresponsive_killed", channel=channel, pid=proc.pid, deadline_s=limit)
            proc.kill()
        finally:
            if reaped:
                self._reap.release()

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
