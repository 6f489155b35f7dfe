"""agentmemd as a system under test: ``agentmemd run`` in its own process, asked over Kafka."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from pathlib import Path
from typing import Any

from _peer_system import TOP_K, SearchFailed, System
from _servers import start_agentmemd, stop_process, wait_until


class Agentmemd(System):
    """The daemon in its own process (``agentmemd run``, as it is deployed), with its defaults;
    asked over Kafka request/reply from this process."""

    name = "agentmemd"

    def __init__(self, graph: bool, tmp: Path) -> None:
        import locomo

        super().__init__(list(locomo.MODES))
        self.graph = graph
        self.tmp = tmp
        self.params: dict[str, dict[str, float] | None] = dict(locomo.MODES)
        self.stack = contextlib.ExitStack()
        self.proc: subprocess.Popen[Any] | None = None
        self.index: Any = None
        self.redis: Any = None
        self.client: Any = None
        self.tokenizer: Any = None
        self.docs_chunks = 0

    async def start(self) -> None:
        from _servers import embedded_servers

        from consumers.client import MemoryClient
        from daemon.components import active_index
        from daemon.connections import redis_client
        from daemon.settings import Settings
        from memory.embed_model import load_tokenizer
        from memory.embedder import resolve_model_path

        servers = self.stack.enter_context(embedded_servers())
        env = {
            "AGENTMEM_GRAPH__ENABLED": "true" if self.graph else "false",
            "AGENTMEM_EMBEDDING__QUERY_CACHE_SIZE": "0",
        }
        self.proc = await start_agentmemd(servers, self.tmp / "agentmemd.log", env)
        settings = Settings(kafka_bootstrap=servers.kafka_bootstrap, redis_url=servers.redis_url)
        self.redis = redis_client(settings)
        self.index = await active_index(settings, self.redis)
        self.tokenizer = load_tokenizer(resolve_model_path(settings.embedding.model))
        self.chunking = settings.chunking
        self.client = MemoryClient(bootstrap=servers.kafka_bootstrap, topics=settings.topics, timeout_s=120)
        await self.client.start()
        self.redis_pid = servers.procs[0].proc.pid

    async def _wait_count(self, want: int, timeout_s: float) -> None:
        async def done() -> bool:
            return bool(await self.index.count() >= want)

        if not await wait_until(done, timeout_s=timeout_s, interval_s=0.05):
            have = await self.index.count()
            self.breaks.add("ingest incomplete", "-", "-", "-", f"{have} of {want} chunks after {timeout_s} s")

    def _chunks(self, docs: list[tuple[str, str]]) -> int:
        """How many chunks the daemon makes of ``docs`` (its tokenizer, its chunker)."""
        from memory.chunking import spans_for

        n = 0
        for _doc_id, content in docs:
            enc = self.tokenizer(content, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
            n += len(spans_for(content, [(int(a), int(b)) for a, b in enc["offset_mapping"]], self.chunking))
        return n

    async def ingest_docs(self, docs: list[tuple[str, str]]) -> float:
        self.docs_chunks = self._chunks(docs)
        t0 = time.perf_counter()
        for i in range(0, len(docs), 256):
            await asyncio.gather(
                *(self.client.publish_document(f"scifact/{d}", text, version=1) for d, text in docs[i : i + 256])
            )
        await self._wait_count(self.docs_chunks, timeout_s=3600)
        return time.perf_counter() - t0

    async def ingest_turns(self, turns: list[Any]) -> float:
        from locomo import publish_turns

        t0 = time.perf_counter()
        await publish_turns(self.client, turns)
        await self._wait_count(self.docs_chunks + len(turns), timeout_s=1800)
        return time.perf_counter() - t0

    async def _query(self, text: str, mode: str, workload: str, top_k: int, flt: dict[str, str]) -> list[Any]:
        try:
            reply = await self.client.query(text, top_k=top_k, metadata_filter=flt, **(self.params[mode] or {}))
        except Exception as exc:
            self.breaks.add("error", mode, workload, text, f"{type(exc).__name__}: {exc}")
            raise SearchFailed(str(exc)) from exc
        return list(reply.results)

    async def search_docs(self, text: str, mode: str) -> list[str]:
        # Chunks, mapped to their docs (a doc ranks where its best chunk ranks).
        results = await self._query(text, mode, "scifact", 2 * TOP_K, {"kind": "document"})
        wrong = [r.doc_id for r in results if not r.doc_id.startswith("scifact/")]
        if wrong:
            self.breaks.add("wrong result", mode, "scifact", text, f"outside the filter: {wrong[:3]}")
        return list(dict.fromkeys(r.doc_id.removeprefix("scifact/") for r in results))[:TOP_K]

    async def search_turns(self, text: str, agent: str, mode: str) -> list[str]:
        results = await self._query(text, mode, "locomo", TOP_K, {"agent_id": agent})
        prefix = "transcript:"
        wrong = [r.doc_id for r in results if not r.doc_id.startswith(f"{prefix}{agent}/")]
        if wrong:
            self.breaks.add("wrong result", mode, "locomo", text, f"another conversation's turns: {wrong[:3]}")
        return list(dict.fromkeys(r.doc_id.removeprefix(prefix) for r in results))

    async def close(self) -> None:
        try:
            if self.client is not None:
                await self.client.close()
            if self.redis is not None:
                await self.redis.aclose()
        finally:
            try:
                if self.proc is not None:
                    stop_process(self.proc)
            finally:
                self.stack.close()
