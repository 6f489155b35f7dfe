"""mem0 OSS as a system under test: its library behind its REST server's two endpoints, its Redis.

Every memory is added with ``infer=False`` (no LLM: the text is stored as given), one add per
SciFact doc and per LoCoMo turn, eight at a time; ``user_id`` is the namespace (``scifact``, or
the LoCoMo conversation) and the metadata carries the id the benchmark scores. mem0 has one
search, its default: a vector leg and a BM25 leg (RediSearch's, over the stored text, asked
with the query's spaCy lemmas) scored together, plus entity boosts, which stay empty here (only
``infer=True`` adds link entities), with its default threshold 0.1.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

from _common import BENCH_DIR
from _peer_ams import wait_http
from _peer_install import PEERS_DIR
from _peer_system import TOP_K, SearchFailed, System
from _peer_work import turn_id
from _servers import spawn_logged, stop_process

SERVER = BENCH_DIR / "_peer_mem0_server.py"
MEM0_MODES = ["default"]
#: The index mem0's Redis store creates: the server's ``collection_name``.
INDEX = "bench"
#: Adds in flight at once: the server's threads share the 2 cores, as its FastAPI server's do.
SUBMITTERS = 8


class Mem0(System):
    """mem0 over HTTP, with its own Redis and its own copy of the packaged model."""

    name = "mem0"

    def __init__(self, tmp: Path) -> None:
        super().__init__(list(MEM0_MODES))
        self.tmp = tmp
        self.proc: subprocess.Popen[Any] | None = None
        self.redis: Any = None
        self.http: Any = None
        self.rclient: Any = None
        self.expected = 0

    async def start(self) -> None:
        import httpx
        import redis.asyncio as aredis

        from daemon.launcher import free_port, start_redis
        from memory.config import PACKAGED_MODEL
        from memory.embedder import resolve_model_path

        url = f"redis://127.0.0.1:{free_port()}/0"
        self.redis = start_redis(url, data_dir=self.tmp / "redis", appendonly=True)
        port = free_port()
        python = str(PEERS_DIR / "mem0" / "bin" / "python")
        args = [python, str(SERVER), str(port), url, str(resolve_model_path(PACKAGED_MODEL)), str(self.tmp / "h.db")]
        self.proc = spawn_logged(args, self.tmp / "mem0.log", None)
        self.base = f"http://127.0.0.1:{port}"
        await wait_http(f"{self.base}/health", None, 300, self.proc)
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        self.http = httpx.AsyncClient(base_url=self.base, timeout=120, limits=limits)
        self.rclient = aredis.from_url(url)
        # One add before any clock, as a deployment that has run before (its first loads spaCy).
        await self._add_all([("warm-up", "warm-up", {"ref": "warm-up"})])
        self.expected = 1

    async def _add_all(self, items: list[tuple[str, str, dict[str, str]]]) -> None:
        """``(user_id, text, metadata)`` each added on its own, ``SUBMITTERS`` at a time."""
        queue = iter(items)

        async def submitter() -> None:
            for user, text, meta in queue:
                body = {"messages": [{"role": "user", "content": text}], "user_id": user, "metadata": meta}
                try:
                    resp = await self.http.post("/memories", json=body)
                    failure = None if resp.status_code == 200 else f"HTTP {resp.status_code}: {resp.text[:300]}"
                except Exception as exc:
                    failure = f"{type(exc).__name__}: {exc}"
                if failure:
                    self.breaks.add("error", "-", "ingest", meta["ref"], failure)

        await asyncio.gather(*(submitter() for _ in range(SUBMITTERS)))

    async def _ingest(self, items: list[tuple[str, str, dict[str, str]]]) -> float:
        t0 = time.perf_counter()  # an add returns once its memory is in the index: searchable
        await self._add_all(items)
        took = time.perf_counter() - t0
        self.expected += len(items)
        info = await self.rclient.ft(INDEX).info()
        if (have := int(info.get("num_docs", 0))) < self.expected:
            self.breaks.add("ingest incomplete", "-", "-", "-", f"{have} of {self.expected} memories indexed")
        return took

    async def ingest_docs(self, docs: list[tuple[str, str]]) -> float:
        return await self._ingest([("scifact", text, {"ref": d}) for d, text in docs])

    async def ingest_turns(self, turns: list[Any]) -> float:
        return await self._ingest([(t.agent_id, t.content, {"ref": turn_id(t)}) for t in turns])

    async def _search(self, text: str, user: str, mode: str, workload: str) -> list[str]:
        try:
            resp = await self.http.post("/search", json={"query": text, "user_id": user, "top_k": TOP_K})
            failure = None if resp.status_code == 200 else f"HTTP {resp.status_code}: {resp.text[:200]}"
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
        if failure is not None:
            self.breaks.add("error", mode, workload, text, failure)
            raise SearchFailed(failure)
        results: list[dict[str, Any]] = resp.json()["results"]
        wrong = [r["id"] for r in results if r.get("user_id") != user]
        if wrong:
            self.breaks.add("wrong result", mode, workload, text, f"from other users: {wrong[:3]}")
        return [str((r.get("metadata") or {}).get("ref", "")) for r in results if r.get("user_id") == user]

    async def search_docs(self, text: str, mode: str) -> list[str]:
        return await self._search(text, "scifact", mode, "scifact")

    async def search_turns(self, text: str, agent: str, mode: str) -> list[str]:
        return await self._search(text, agent, mode, "locomo")

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()
        if self.proc is not None:
            stop_process(self.proc, timeout_s=15)
        if self.rclient is not None:
            await self.rclient.aclose()
        if self.redis is not None:
            self.redis.stop()
