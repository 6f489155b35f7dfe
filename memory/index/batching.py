"""Read commands issued in the same turn of the event loop, sent to Redis in one write.

Concurrent questions resume together (a micro-batch of query embeddings answers them at
once), and each then sends its legs, then its read of the winners. Sent one by one, every
command costs a write on its own connection, a wake-up of Redis, and a read back; on this
class of VM the send and the wake-up it causes cost more CPU than building the command. A
``CommandBatcher`` queues what is asked during one turn and sends it at the next, as one
pipeline (no MULTI: these are independent reads). A command asked alone is sent alone.

Only for reads whose replies need no per-command decoding: each reply is what
``execute_command`` returns for it, and each error goes to its own caller.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aredis

from memory.futures import settle


class CommandBatcher:
    """``execute`` as ``client.execute_command``, coalesced per event-loop turn."""

    def __init__(self, client: aredis.Redis) -> None:
        self._r = client
        self._queue: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        # Flushes in flight: held so the loop does not collect them half-way.
        self._sending: set[asyncio.Task[None]] = set()

    async def execute(self, *args: Any) -> Any:
        """The command's reply; its error (a ``ResponseError``, a lost connection) raised here."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if not self._queue:
            loop.call_soon(self._flush)
        self._queue.append((args, fut))
        return await fut

    def _flush(self) -> None:
        batch, self._queue = self._queue, []
        # A caller cancelled before the send (a request past its deadline) costs nothing.
        live = [(args, fut) for args, fut in batch if not fut.done()]
        if not live:
            return
        task = asyncio.get_running_loop().create_task(self._send(live))
        self._sending.add(task)
        task.add_done_callback(lambda t: self._settle(t, live))

    def _settle(self, task: asyncio.Task[None], batch: list[tuple[tuple[Any, ...], asyncio.Future[Any]]]) -> None:
        # Whatever ended the send (cancelled before its first step, an error while handing
        # out replies), no caller is left waiting.
        self._sending.discard(task)
        for _, fut in batch:
            if fut.done():
                continue
            if task.cancelled():
                fut.cancel()
            else:
                fut.set_exception(RuntimeError("a Redis batch ended without answering this command"))

    async def _send(self, batch: list[tuple[tuple[Any, ...], asyncio.Future[Any]]]) -> None:
        try:
            if len(batch) == 1:
                replies: list[Any] = [await self._one(batch[0][0])]
            else:
                async with self._r.pipeline(transaction=False) as pipe:
                    for args, _ in batch:
                        pipe.execute_command(*args)
                    replies = await pipe.execute(raise_on_error=False)
        except Exception as exc:  # the connection, not a command: every caller gets it
            for _, fut in batch:
                # Each its own copy: one exception raised in several tasks would carry one
                # task's traceback and context into the others' logs.
                settle(fut, _copy(exc))
            return
        for (_, fut), reply in zip(batch, replies, strict=True):
            settle(fut, reply)

    async def _one(self, args: tuple[Any, ...]) -> Any:
        # A command sent alone as a command, not as a pipeline of one: one reply parsed the
        # ordinary way, an error raised as execute_command raises it.
        try:
            return await self._r.execute_command(*args)  # type: ignore[no-untyped-call]
        except aredis.ResponseError as exc:
            return exc


def _copy(exc: Exception) -> Exception:
    try:
        twin = type(exc)(*exc.args)
    except Exception:  # an exception type that will not be rebuilt from its args
        return exc
    twin.__cause__ = exc
    return twin
