"""The order of requests at the embedding thread for documents: a lane's wait for the others'.

The worker embeds one request at a time, and a lane (``consumers.lanes``) sends a request of
``docs_request_max`` chunks after another for minutes. Served in turn, a small write's one
request would wait behind every lane's next one; a lane's task marks its requests as those of the
background (``in_background``), and the foreground's go first (decision 0063).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
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


#: Foreground turns in a row while a background request waits, before it gets one: a steady
#: stream of small writes (or the graph's summaries) slows a lane down, never stops it, and a
#: revocation waiting for the lane is not held past its timeout.
FOREGROUND_RUN = 4


class EmbedOrder:
    """One holder at a time; waiting foreground holders before background ones (but a
    background one at least every ``FOREGROUND_RUN + 1`` turns), each in order."""

    def __init__(self) -> None:
        self._held = False
        self._fore: collections.deque[asyncio.Future[None]] = collections.deque()
        self._back: collections.deque[asyncio.Future[None]] = collections.deque()
        self._run = 0  # foreground turns given in a row while background waited

    @property
    def waiting(self) -> int:
        """Holders waiting for their turn."""
        return len(self._fore) + len(self._back)

    @contextlib.asynccontextmanager
    async def turn(self, *, background: bool = False) -> AsyncIterator[None]:
        """Hold the turn for the block; wait for it first if another holds it."""
        if self._held or self.waiting:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            queue = self._back if background else self._fore
            queue.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._pass()  # given the turn as it was cancelled: the next takes it
                else:
                    with contextlib.suppress(ValueError):  # already passed over as cancelled
                        queue.remove(fut)
                raise
        else:
            self._held = True
        try:
            yield
        finally:
            self._pass()

    def _pass(self) -> None:
        while self._fore or self._back:
            if self._fore and (not self._back or self._run < FOREGROUND_RUN):
                fut = self._fore.popleft()
                self._run = self._run + 1 if self._back else 0
            else:
                fut = self._back.popleft()
                self._run = 0
            if not fut.done():
                fut.set_result(None)  # still held: the turn goes to it
                return
        self._held = False
