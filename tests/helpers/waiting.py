"""Waiting for what the daemon does: a condition, chunks stored, docs in the graph."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from memory.keys import chunk_prefix, registry_key

if TYPE_CHECKING:
    pass


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 20.0, what: str = "") -> None:
    """Poll ``check`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not reached within {timeout}s: {what}")


async def in_graph(daemon: Any, doc_ids: Iterable[str], tenant: str = "default") -> bool:
    """Whether every doc has its contribution in the tenant's graph. A doc's chunks are
    written before its graph contribution (extraction finishes after the write), so a
    forced recompute right after the chunks show may find no entities yet."""
    assert daemon.graph is not None
    return set(doc_ids) <= set(await daemon.graph.store(tenant).doc_ids())


async def wait_for_chunks(client: Any, name: str, want: dict[str, str], timeout: float = 120) -> dict[str, str]:
    """Poll Redis until the stored chunk texts of index ``name`` equal ``want``; returns what was seen."""
    deadline = time.monotonic() + timeout
    got: dict[str, str] = {}
    while time.monotonic() < deadline:
        got = await stored_chunks(client, name)
        if got == want:
            break
        await asyncio.sleep(0.5)
    return got


async def stored_chunks(client: Any, name: str) -> dict[str, str]:
    out: dict[str, str] = {}
    active = await client.hget(registry_key(name), "active")
    if active is None:
        return out
    async for key in client.scan_iter(match=chunk_prefix(name, int(active)) + "*", count=1000):
        cid, text, kind = await client.hmget(key, ["chunk_id", "text", "kind"])
        if cid is not None and text is not None and kind != b"community":  # a key may vanish mid-scan
            out[cid.decode()] = text.decode()
    return out
