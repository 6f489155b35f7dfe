"""A ``MemoryClient`` on a private event loop in a thread of its own, callable from any thread
and from any event loop (the LangGraph store and the LangChain retriever run on it).

Why: a ``MemoryClient`` (its aiokafka producer, its reply reader and their futures) belongs to
the loop it started on, while LangGraph calls a store from a sync graph's worker threads and
from an async graph's loop, often both in one process. One loop that owns the client, fed
with ``run_coroutine_threadsafe``, serves every caller the same connection.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

from consumers.client import MemoryClient

T = TypeVar("T")


class ThreadedClient:
    """Runs calls on one ``MemoryClient``, started lazily on a private loop (a daemon thread)."""

    def __init__(self, make_client: Callable[[], MemoryClient], *, call_timeout_s: float | None = None) -> None:
        """``make_client`` builds the client (on the private loop, the first time a call needs
        it); the tenant, reply partition and timeouts are its settings. ``call_timeout_s``: a
        bound on each sync call beyond the client's own timeouts (None: none)."""
        self._make_client = make_client
        self._call_timeout = call_timeout_s
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: MemoryClient | None = None
        self._start_lock: asyncio.Lock | None = None

    @classmethod
    def connect(cls, *, bootstrap: str, **client_options: Any) -> ThreadedClient:
        """A threaded ``MemoryClient(bootstrap=bootstrap, **client_options)`` (``tenant=``,
        ``topics=``, ``reply_partition=``, ``timeout_s=``: see ``MemoryClient``)."""
        return cls(lambda: MemoryClient(bootstrap=bootstrap, **client_options))

    def __enter__(self) -> ThreadedClient:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                thread = threading.Thread(target=run, name="agentmemd-client", daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
                # A program that never closes the client would end with its producer's and
                # reader's tasks destroyed mid-flight, and aiokafka's warnings on stderr.
                atexit.register(self._close_at_exit)
            return self._loop

    async def _started(self) -> MemoryClient:
        if self._start_lock is None:  # made here: an asyncio.Lock belongs to the loop it is used on
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._client is None:
                client = self._make_client()
                try:
                    await client.start()
                except BaseException:
                    await client.close()
                    raise
                self._client = client
            return self._client

    def _submit(self, fn: Callable[[MemoryClient], Awaitable[T]]) -> Future[T]:
        async def run() -> T:
            return await fn(await self._started())

        return asyncio.run_coroutine_threadsafe(run(), self._running_loop())

    def call(self, fn: Callable[[MemoryClient], Awaitable[T]]) -> T:
        """Run ``fn(client)`` on the private loop and wait for it, from a thread without a loop
        or with one (which then blocks meanwhile, as any sync call does).

        Raises:
            RuntimeError: called from the private loop itself (it would wait for itself).
            Whatever ``fn`` raises (``QueryFailed``, ``BackendUnavailable``, ``TimeoutError``, ...).
        """
        if self._thread is not None and threading.current_thread() is self._thread:
            raise RuntimeError("a sync call from the client's own loop would wait for itself; await acall instead")
        return self._submit(fn).result(self._call_timeout)

    async def acall(self, fn: Callable[[MemoryClient], Awaitable[T]]) -> T:
        """Run ``fn(client)`` on the private loop and await it from the caller's loop
        (a cancellation of the caller cancels it there too)."""
        if asyncio.get_running_loop() is self._loop:
            return await fn(await self._started())
        return await asyncio.wrap_future(self._submit(fn))

    def close(self, *, wait_s: float = 30.0) -> None:
        """Close the client and stop the private loop, both within ``wait_s``; a later call
        starts both again."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        atexit.unregister(self._close_at_exit)

        async def stop() -> None:
            client, self._client = self._client, None
            self._start_lock = None
            if client is not None:
                await client.close()

        deadline = time.monotonic() + wait_s
        try:
            asyncio.run_coroutine_threadsafe(stop(), loop).result(wait_s)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(max(0.0, deadline - time.monotonic()))
            if not thread.is_alive():
                loop.close()

    def _close_at_exit(self) -> None:
        # Briefly: a broker that is down must not hold the program's exit for long.
        try:
            self.close(wait_s=5.0)
        except Exception:  # at exit there is no caller left to tell
            return
