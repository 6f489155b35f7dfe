"""Redis Agent Memory Server as a system under test: its REST API, its Redis, its embedding server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import BENCH_DIR
from _peer_install import PEERS_DIR
from _peer_system import TOP_K, SearchFailed, System
from _peer_work import turn_id
from _servers import spawn_logged, stop_process, wait_until

#: The script that serves AMS its embeddings with ``--serve-embeddings PORT``.
SCRIPT = BENCH_DIR / "peers.py"
#: RediSearch's own default stopwords: what a caller strips when AMS's docs ask it to
#: ("keyword and hybrid search disable Redis stopword filtering, so callers should strip
#: obvious stopwords beforehand").
REDIS_STOPWORDS = frozenset(
    "a is the an and are as at be but by for if in into it no not of on or such that their then there these "
    "they this to was will with".split()
)
#: AMS's search modes: name -> (search_mode, strip stopwords on the caller's side).
AMS_MODES = {
    "semantic": ("semantic", False),
    "keyword": ("keyword", False),
    "hybrid": ("hybrid", False),
    "keyword, stopwords stripped": ("keyword", True),
    "hybrid, stopwords stripped": ("hybrid", True),
}
AMS_ENV = {
    "EMBEDDING_MODEL": "openai/all-MiniLM-L6-v2",
    "OPENAI_API_KEY": "local",
    "REDISVL_VECTOR_DIMENSIONS": "384",
    "ENABLE_TOPIC_EXTRACTION": "false",
    "ENABLE_NER": "false",
    "ENABLE_DISCRETE_MEMORY_EXTRACTION": "false",
    "ENABLE_WORKING_MEMORY_SUMMARIZATION": "false",
    "COMPACT_SEMANTIC_DUPLICATES": "false",
    "FORGETTING_ENABLED": "false",
    "DISABLE_AUTH": "true",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HF_HUB_OFFLINE": "1",
}


def strip_stopwords(text: str) -> str:
    """The text without RediSearch's default stopwords (punctuation around a word ignored)."""
    return " ".join(w for w in text.split() if w.lower().strip("?,.!\"'") not in REDIS_STOPWORDS)


async def wait_http(url: str, body: dict[str, Any] | None, timeout_s: float, proc: subprocess.Popen[Any]) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=5) as http:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                resp = await (http.post(url, json=body) if body is not None else http.get(url))
                if resp.status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not up within {timeout_s} s")
            await asyncio.sleep(0.3)


class Ams(System):
    """Redis Agent Memory Server over its REST API, with its own Redis and embedding server."""

    name = "AMS"
    index = "memory_records"

    def __init__(self, tmp: Path) -> None:
        super().__init__(list(AMS_MODES))
        self.tmp = tmp
        self.procs: list[subprocess.Popen[Any]] = []
        self.redis: Any = None
        self.http: Any = None
        self.restarts: list[dict[str, Any]] = []
        self.expected = 0

    def _spawn(self, args: list[str], log_name: str, env: dict[str, str] | None = None) -> subprocess.Popen[Any]:
        proc = spawn_logged(args, self.tmp / log_name, env)
        self.procs.append(proc)
        return proc

    def _start_redis(self) -> None:
        from daemon.launcher import start_redis

        self.redis = start_redis(self.redis_url, data_dir=self.tmp / "redis", appendonly=True)

    async def start(self) -> None:
        import httpx
        import redis.asyncio as aredis

        from daemon.launcher import free_port

        self.redis_url = f"redis://127.0.0.1:{free_port()}/0"
        self._start_redis()
        self.rclient = aredis.from_url(self.redis_url, socket_timeout=60)
        emb_port, api_port = free_port(), free_port()
        emb = self._spawn([sys.executable, str(SCRIPT), "--serve-embeddings", str(emb_port)], "embeddings.log")
        await wait_http(f"http://127.0.0.1:{emb_port}/v1/embeddings", {"input": "warm up"}, 300, emb)
        env = {
            **os.environ,
            **AMS_ENV,
            "REDIS_URL": self.redis_url,
            "OPENAI_API_BASE": f"http://127.0.0.1:{emb_port}/v1",
        }
        ams_bin = str(PEERS_DIR / "ams" / "bin" / "agent-memory")
        api = self._spawn(
            [ams_bin, "api", "--host", "127.0.0.1", "--port", str(api_port), "--task-backend", "asyncio"],
            "ams.log",
            env,
        )
        self.base = f"http://127.0.0.1:{api_port}"
        await wait_http(f"{self.base}/v1/health", None, 300, api)
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        self.http = httpx.AsyncClient(base_url=self.base, timeout=120, limits=limits)
        await self._create_index()

    async def _indexed(self) -> int:
        try:
            info = await self.rclient.ft(self.index).info()
        except Exception:
            return 0
        return int(info.get("num_docs", 0))

    async def _wait_indexed(self, timeout_s: float) -> None:
        async def done() -> bool:
            return await self._indexed() >= self.expected

        if not await wait_until(done, timeout_s=timeout_s, interval_s=0.05):
            have = await self._indexed()
            self.breaks.add("ingest incomplete", "-", "-", "-", f"{have} of {self.expected} memories in {timeout_s} s")

    async def _post_memories(self, batches: list[list[dict[str, Any]]]) -> None:
        for batch in batches:
            try:
                resp = await self.http.post("/v1/long-term-memory/", json={"memories": batch, "deduplicate": False})
                failure = None if resp.status_code == 200 else f"HTTP {resp.status_code}: {resp.text[:300]}"
            except Exception as exc:
                failure = f"{type(exc).__name__}: {exc}"
            if failure:
                self.breaks.add("error", "-", "ingest", f"batch of {len(batch)} from {batch[0]['id']}", failure)

    async def _create_index(self) -> None:
        # Its index is created by the first write, and concurrent first writes race to create it:
        # the loser's batch is lost ("Index already exists") and its connection dropped. One
        # memory written alone first, before any clock, as a deployment that has run before.
        await self._post_memories([[{"id": "warm-up", "text": "warm-up", "namespace": "warm-up"}]])
        self.expected += 1
        await self._wait_indexed(120)

    async def ingest_docs(self, docs: list[tuple[str, str]]) -> float:
        memories = [
            {"id": f"scifact-{d}", "text": t, "namespace": "scifact", "memory_type": "semantic"} for d, t in docs
        ]
        self.expected += len(memories)
        t0 = time.perf_counter()
        await self._post_memories([memories[i : i + 32] for i in range(0, len(memories), 32)])
        await self._wait_indexed(3600)
        return time.perf_counter() - t0

    async def ingest_turns(self, turns: list[Any]) -> float:
        # One request per session, as an agent writes a session's turns once it has them.
        sessions: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for t in turns:
            sessions.setdefault((t.agent_id, t.session_id), []).append(
                {
                    "id": turn_id(t),
                    "text": t.content,
                    "namespace": t.agent_id,
                    "session_id": t.session_id,
                    "memory_type": "message",
                    "created_at": t.timestamp.isoformat(),
                }
            )
        self.expected += len(turns)
        t0 = time.perf_counter()
        await self._post_memories(list(sessions.values()))
        await self._wait_indexed(1800)
        return time.perf_counter() - t0

    async def _restart_redis(self, mode: str, workload: str, text: str) -> None:
        """Redis died on this query: record it with its crash line, start it again from its AOF."""
        code = self.redis.proc.poll()
        log_path = self.tmp / "redis" / "redis.log"
        lines = log_path.read_text(errors="replace").splitlines() if log_path.exists() else []
        crash = next((line for line in lines if "crashed by signal" in line), "")
        where = next((line for line in lines if "QueryNode" in line or "Segmentation" in line), "")
        self.breaks.add("redis crash", mode, workload, text, f"exit {code}; {crash.strip()} {where.strip()}".strip())
        log_path.rename(log_path.with_name(f"redis.crash-{len(self.restarts)}.log"))
        t0 = time.perf_counter()
        self._start_redis()
        from _servers import wait_redis_ready

        await wait_redis_ready(self.rclient)
        await self._wait_indexed(600)
        self.restarts.append({"mode": mode, "set": workload, "seconds": round(time.perf_counter() - t0, 2)})

    async def _search(self, text: str, namespace: str, mode: str, workload: str, limit: int) -> list[dict[str, Any]]:
        search_mode, strip = AMS_MODES[mode]
        query = strip_stopwords(text) if strip else text
        body = {
            "text": query,
            "namespace": {"eq": namespace},
            "limit": limit,
            "search_mode": search_mode,
            "recency_boost": False,
        }
        try:
            resp = await self.http.post("/v1/long-term-memory/search", json=body)
            failure = None if resp.status_code == 200 else f"HTTP {resp.status_code}: {resp.text[:200]}"
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
        if failure is None:
            memories: list[dict[str, Any]] = resp.json()["memories"]
            wrong = [m["id"] for m in memories if m.get("namespace") != namespace]
            if wrong:
                self.breaks.add("wrong result", mode, workload, text, f"from other namespaces: {wrong[:3]}")
            return [m for m in memories if m.get("namespace") == namespace]
        await asyncio.sleep(0.2)
        if self.redis.proc.poll() is not None:
            await self._restart_redis(mode, workload, text)
        else:
            self.breaks.add("error", mode, workload, text, failure)
        raise SearchFailed(failure)

    async def search_docs(self, text: str, mode: str) -> list[str]:
        memories = await self._search(text, "scifact", mode, "scifact", TOP_K)
        return [m["id"].removeprefix("scifact-") for m in memories]

    async def search_turns(self, text: str, agent: str, mode: str) -> list[str]:
        memories = await self._search(text, agent, mode, "locomo", TOP_K)
        return [m["id"] for m in memories]

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()
        for proc in reversed(self.procs):
            stop_process(proc, timeout_s=15)
        if self.redis is not None:
            self.redis.stop()
        with contextlib.suppress(Exception):
            await self.rclient.aclose()
