"""The order of requests at the embedding thread for documents: a lane's wait for the others'.

The worker embeds one request at a time, and a lane (``consumers.lanes``) sends a request of
``docs_request_max`` chunks after another for minutes. Served in turn, a small write's one
request waited behind every lane's next one; a lane's task marks its requests as those of the
background (``in_background``), and the foreground's go first (decision 0063).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar

_BACKGROUND: ContextVar[bool] = ContextVar("agentmem_background", default=False)


@contextlib.contextmanager
def in_background() -> Iterator[None]:
    """Mark the embedding requests made in this block (and the tasks it starts) as background."""
    token = _BACKGROUND.set(True)
    try:
        yield
    finally:
        _BACKGROUND.reset(token)


def background() -> bool:
    """Whether the current context is background work."""
    return _BACKGROUND.get()


class EmbedOrder:
    """One holder at a time; waiting foreground holders before background ones, each in order."""

    def __init__(self) -> None:
        self._held = False
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        """Holders waiting for their turn."""
        return len(self._waiting)

    @contextlib.asynccontextmanager
    async def turn(self, *, background: bool = False) -> AsyncIterator[None]:
        """Hold the turn for the block; wait for it first if another holds it."""
        if self._held or self._waiting:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (int(background), next(self._order), fut))
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._pass()  # given the turn as it was cancelled: the next takes it
                else:
                    self._waiting = [w for w in self._waiting if w[2] is not fut]
                    heapq.heapify(self._waiting)
                raise
        else:
            self._held = True
        try:
            yield
        finally:
            self._pass()

    def _pass(self) -> None:
        while self._waiting:
            _, _, fut = heapq.heappop(self._waiting)
            if not fut.done():
                fut.set_result(None)  # still held: the turn goes to it
                return
        self._held = False
