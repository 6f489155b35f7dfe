"""Side by side with the closest peers: the same corpus, model and Redis build, in one run.

Run from the project root:

    .venv/bin/python bench/peers.py            # full: SciFact 5,183 docs / 300 queries, LoCoMo dev
    .venv/bin/python bench/peers.py --quick    # smoke: small subsets of both

Systems, measured one after the other (only one runs at a time), each with its own Redis
started by ``daemon.launcher.start_redis`` (same binary, same modules, AOF on):

* **agentmemd**: ``agentmemd run`` in its own process, as it is deployed, with its default
  settings (graph layer off unless ``--graph``, as the peers run with their extraction features
  off), embedded tansu; documents and turns published with ``MemoryClient`` from this process,
  every question asked over Kafka request/reply.
* **AMS** (Redis Agent Memory Server 0.15.2) in its own Python 3.12 virtualenv under
  ``bench/.peers/ams`` (installed here when missing, with the pinned constraints of
  ``../shared/peers``), ``agent-memory api --task-backend asyncio``, every LLM feature off;
  its embeddings come from a local OpenAI-compatible ``/v1/embeddings`` server (this script,
  ``--serve-embeddings``) running the daemon's own embedder on the same packaged
  all-MiniLM-L6-v2. Asked over its REST API with httpx, as its Python client does.
* **mem0** OSS (``mem0ai``, ``infer=False``, Redis vector store, local ``huggingface`` embedder
  on the packaged model) in ``bench/.peers/mem0``: installed and probed with one add and one
  search; measured only if that probe works (offline it does not: the result says why).

Work, the same for every system: SciFact (``../shared/eval/scifact``, one memory per abstract,
``title + " " + text``) and LoCoMo dev (``../shared/eval/locomo``, one memory per dialogue turn,
``"<speaker>: <text>"`` as bench/locomo.py writes it, a namespace or agent per conversation,
session ids; never the generated observation or summary fields). Measured per system:

* ingestion, items/s from the first submit until every item is searchable;
* quality in every search mode the system has, one asker at a time: SciFact nDCG@10 and
  LoCoMo recall@10 (all categories, filtered to the question's conversation);
* query latency p50/p99 at 1 and 16 concurrent askers, top_k 10, LoCoMo questions filtered to
  their conversation, in every mode that broke nothing in the quality pass;
* what breaks: HTTP errors, Redis crashes (the query, the mode, Redis's exit and the log's
  crash line; Redis is restarted from its AOF and the run goes on), and results from outside
  the conversation asked about.

The query-embedding cache is off on both sides (``query_cache_size=0``), so a text asked
again costs an embedding again. Targets (issue 24), against AMS in the same run: our p50 at
16 askers <= 0.5 x its best mode's; our quality >= its best working mode + 0.05 on both sets;
our ingestion items/s >= its, on both sets. Nothing is asserted: misses are reported as MISSED.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    BENCH_DIR,
    ROOT,
    Result,
    add_common_args,
    exit_on_sigterm,
    png_path,
    quiet_logs,
    spawn_logged,
    start_agentmemd,
    stop_process,
    summary_ms,
    wait_until,
)

BENCH = "peers"
SCRIPT = Path(__file__).resolve()
PEERS_DIR = BENCH_DIR / ".peers"
SHARED = ROOT.parent / "shared"
AMS_CONSTRAINTS = SHARED / "peers" / "ams-0.15.2-constraints.txt"
AMS_VERSION = "0.15.2"
MEM0_VERSION = "2.2.1"
TOP_K = 10
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


class SearchFailed(Exception):
    """A search that returned no answer (an HTTP error, a dropped connection, a crash)."""


# -- installing the peers --------------------------------------------------------------------


def find_python(version: str) -> str | None:
    """An interpreter of this minor version: on PATH, else under pyenv's versions."""
    candidates = [shutil.which(f"python{version}") or ""]
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates += sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"), reverse=True)
    for c in candidates:
        if c and subprocess.run([c, "--version"], capture_output=True).returncode == 0:
            return c
    return None


def pip_install(venv: Path, *args: str) -> None:
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args], check=True)


def ensure_venv(name: str, python_version: str, steps: list[list[str]]) -> dict[str, Any]:
    """``bench/.peers/<name>``, created and installed by ``steps`` (pip arguments) when missing."""
    venv = PEERS_DIR / name
    marker = venv / ".installed"
    if marker.exists():
        return {"venv": str(venv.relative_to(ROOT)), "installed_now": False, **json.loads(marker.read_text())}
    python = find_python(python_version)
    if python is None:
        raise RuntimeError(f"no Python {python_version} here (PATH or pyenv)")
    shutil.rmtree(venv, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    for step in steps:
        pip_install(venv, *step)
    info = {"python": python, "install_s": round(time.perf_counter() - t0, 1), "steps": steps}
    marker.write_text(json.dumps(info))
    return {"venv": str(venv.relative_to(ROOT)), "installed_now": True, **info}


def ensure_ams() -> dict[str, Any]:
    # A plain install resolves to 0.15.0 with mcp 2.x and fails at import; 0.15.2 asks for an
    # agent-memory-client the registry lacks (see ../shared/peers/README.md).
    return ensure_venv(
        "ams",
        "3.12",
        [
            ["-c", str(AMS_CONSTRAINTS), "agent-memory-server==0.15.0"],
            ["--no-deps", f"agent-memory-server=={AMS_VERSION}"],
        ],
    )


def ensure_mem0() -> dict[str, Any]:
    # Python 3.11: the CPU build of torch the daemon uses is on this machine's disk for 3.11.
    # redisvl 0.12 / redis 5: mem0's Redis store calls SearchIndex.set_client, gone from later
    # redisvl, and mem0 asks for redis<6. [nlp]: spaCy, for its BM25 lemmatizer and entity
    # boosts. nltk: redisvl's TextQuery, which mem0's keyword search builds, loads NLTK's
    # English stopwords with it.
    return ensure_venv(
        "mem0",
        "3.11",
        [
            ["torch==2.13.0+cpu", f"mem0ai[nlp]=={MEM0_VERSION}", "sentence-transformers", "redisvl==0.12.1"],
            ["redis>=5,<6", "nltk"],
        ],
    )


MEM0_PROBE = """
import json, os, sys, time
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OPENAI_API_KEY="unused", MEM0_TELEMETRY="False")
from mem0 import Memory
redis_url, model = sys.argv[1], sys.argv[2]
m = Memory.from_config({
    "vector_store": {"provider": "redis", "config": {"redis_url": redis_url, "collection_name": "probe",
                                                     "embedding_model_dims": 384}},
    "embedder": {"provider": "huggingface", "config": {"model": model, "embedding_dims": 384}},
})
m.add([{"role": "user", "content": "Caroline: I went to the support group yesterday."}], user_id="conv", infer=False)
print(json.dumps(m.search("When did Caroline go to the support group?", top_k=10, filters={"user_id": "conv"})))
"""


def probe_mem0(redis_url: str) -> dict[str, Any]:
    """One add (infer=False) and one search through mem0's own API; what failed, if anything."""
    from memory.embedder import PACKAGED_MINILM, resolve_model_path

    python = PEERS_DIR / "mem0" / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HTTP_PROXY", "HTTPS_PROXY"))}
    proc = subprocess.run(
        [str(python), "-c", MEM0_PROBE, redis_url, resolve_model_path(PACKAGED_MINILM)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "Loading weights" not in line]
    errors = [line for line in lines if "Error" in line or "error" in line.split(":", 1)[0]]
    return {"returncode": proc.returncode, "stdout": proc.stdout[-2000:], "errors": errors[-8:], "tail": lines[-12:]}


# -- the embedding server AMS calls ----------------------------------------------------------


async def serve_embeddings(port: int) -> None:
    """OpenAI-compatible ``POST /v1/embeddings`` on the daemon's own embedder (worker process,
    length batching, same precision); one input is embedded as the daemon embeds a query."""
    from aiohttp import web

    from memory.config import EmbeddingConfig
    from memory.embedder import SentenceTransformerEmbedder

    embedder = await SentenceTransformerEmbedder.load(EmbeddingConfig(query_cache_size=0))  # type: ignore[call-arg]

    async def embeddings(request: web.Request) -> web.Response:
        sock = request.transport.get_extra_info("socket") if request.transport else None
        if sock is not None:
            # Nagle's algorithm against the client's delayed ACK cost ~40 ms per request.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = await request.json()
        raw = body["input"]
        texts = [raw] if isinstance(raw, str) else list(raw)
        if len(texts) == 1:
            vectors = [await embedder.embed_query(texts[0])]
        else:
            vectors = list(await embedder.embed_documents(texts))
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        usage = {"prompt_tokens": 0, "total_tokens": 0}
        return web.json_response({"object": "list", "model": body.get("model"), "data": data, "usage": usage})

    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_post("/v1/embeddings", embeddings)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        embedder.close()


# -- the work --------------------------------------------------------------------------------


@dataclass
class Work:
    """What every system ingests and is asked."""

    docs: list[tuple[str, str]]  # SciFact (doc id, title + text)
    doc_queries: list[tuple[str, str]]  # (query id, text)
    qrels: dict[str, dict[str, int]]
    turns: list[Any]  # locomo.Turn
    questions: list[Any]  # locomo.Question


def load_work(args: argparse.Namespace) -> Work:
    import locomo
    import scifact

    corpus, queries, qrels = scifact.load_data(args.scifact)
    qids = [q for q in queries if q in qrels]
    if args.queries:
        qids = qids[: args.queries]
    wanted = scifact.pick_docs(corpus, qrels, qids, args.scifact_docs, seed=3)
    turns, questions = locomo.load(args.locomo, args.conversations)
    if args.questions:
        questions = questions[: args.questions]
    return Work([(d, corpus[d]) for d in wanted], [(q, queries[q]) for q in qids], qrels, turns, questions)


def turn_id(t: Any) -> str:
    return f"{t.agent_id}/{t.key}"


@dataclass
class Breaks:
    """What went wrong in one system's run, query by query."""

    events: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kind: str, mode: str, workload: str, query: str, detail: str) -> None:
        self.events.append({"kind": kind, "mode": mode, "set": workload, "query": query, "detail": detail[:600]})

    def count(self, kind: str, mode: str | None = None) -> int:
        return sum(1 for e in self.events if e["kind"] == kind and (mode is None or e["mode"] == mode))


# -- the systems -----------------------------------------------------------------------------


class System:
    """One memory system under test; subclasses say how it ingests and answers."""

    name = ""

    def __init__(self, modes: list[str]) -> None:
        self.modes = modes
        self.breaks = Breaks()

    async def ingest_docs(self, docs: list[tuple[str, str]]) -> float:
        """Submit every doc; seconds until all are searchable."""
        raise NotImplementedError

    async def ingest_turns(self, turns: list[Any]) -> float:
        raise NotImplementedError

    async def search_docs(self, text: str, mode: str) -> list[str]:
        """SciFact doc ids, best first (at most TOP_K)."""
        raise NotImplementedError

    async def search_turns(self, text: str, agent: str, mode: str) -> list[str]:
        """Turn ids (``<conversation>/session_<N>/<turn>``) of that conversation, best first."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


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
        from _common import embedded_servers

        from consumers.client import MemoryClient
        from daemon.app import active_index
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
        async def conversation(agent: str) -> None:
            for t in (t for t in turns if t.agent_id == agent):
                await self.client.publish_observation(
                    agent_id=t.agent_id,
                    session_id=t.session_id,
                    turn=t.turn,
                    role=t.role,
                    content=t.content,
                    timestamp=t.timestamp,
                )

        t0 = time.perf_counter()
        await asyncio.gather(*(conversation(a) for a in dict.fromkeys(t.agent_id for t in turns)))
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
        from _common import wait_redis_ready

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


# -- measuring -------------------------------------------------------------------------------


async def quality(system: System, work: Work, mode: str) -> dict[str, Any]:
    """SciFact nDCG@10 and LoCoMo recall@10, one question at a time; a failed search scores 0."""
    from locomo import recall_at
    from scifact import ndcg_at

    failed = {"scifact": 0, "locomo": 0}
    ndcgs: list[float] = []
    took: list[float] = []
    for qid, text in work.doc_queries:
        t0 = time.perf_counter()
        try:
            ranked = await system.search_docs(text, mode)
        except SearchFailed:
            ranked, failed["scifact"] = [], failed["scifact"] + 1
        took.append(time.perf_counter() - t0)
        ndcgs.append(ndcg_at(ranked, work.qrels[qid], TOP_K))
    recalls: list[float] = []
    for q in work.questions:
        t0 = time.perf_counter()
        try:
            turns = await system.search_turns(q.text, q.agent_id, mode)
        except SearchFailed:
            turns, failed["locomo"] = [], failed["locomo"] + 1
        took.append(time.perf_counter() - t0)
        recalls.append(recall_at([t.removeprefix(f"{q.agent_id}/") for t in turns], q.evidence, TOP_K))
    return {
        "scifact_ndcg@10": sum(ndcgs) / max(len(ndcgs), 1),
        "locomo_r@10": sum(recalls) / max(len(recalls), 1),
        "failed_searches": failed,
        "query_ms_one_asker": summary_ms(took),
    }


async def latency(
    ask: Callable[[Any], Awaitable[Any]], questions: Sequence[Any], concurrency: int, requests: int
) -> dict[str, Any]:
    """Closed loop: ``concurrency`` askers, each asking its next question once answered."""
    texts = iter([questions[i % len(questions)] for i in range(requests)])
    for q in questions[:concurrency]:  # warm-up, not timed
        with contextlib.suppress(SearchFailed):
            await ask(q)
    took: list[float] = []
    failed = 0

    async def asker() -> None:
        nonlocal failed
        for q in texts:
            t0 = time.perf_counter()
            try:
                await ask(q)
            except SearchFailed:
                failed += 1
                continue
            took.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(asker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"concurrency": concurrency, **summary_ms(took), "failed": failed, "qps": round(len(took) / wall, 2)}


async def measure(system: System, work: Work, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"modes": {}, "latency": {}}
    print(f"[{system.name}] ingesting {len(work.docs)} SciFact docs ...", flush=True)
    s = await system.ingest_docs(work.docs)
    out["ingest_scifact"] = {"items": len(work.docs), "seconds": round(s, 2), "per_s": round(len(work.docs) / s, 2)}
    if isinstance(system, Agentmemd):
        out["ingest_scifact"]["chunks"] = system.docs_chunks
    print(f"[{system.name}] ingesting {len(work.turns)} LoCoMo turns ...", flush=True)
    s = await system.ingest_turns(work.turns)
    out["ingest_locomo"] = {"items": len(work.turns), "seconds": round(s, 2), "per_s": round(len(work.turns) / s, 2)}
    print(f"[{system.name}] ingest: {out['ingest_scifact']} {out['ingest_locomo']}", flush=True)
    for mode in system.modes:
        row = await quality(system, work, mode)
        crashes = system.breaks.count("redis crash", mode)
        row["redis_crashes"] = crashes
        row["errors"] = system.breaks.count("error", mode)
        row["wrong_results"] = system.breaks.count("wrong result", mode)
        out["modes"][mode] = row
        print(
            f"[{system.name}] {mode:<28} SciFact nDCG@10 {row['scifact_ndcg@10']:.4f}  LoCoMo R@10 "
            f"{row['locomo_r@10']:.4f}  failed {row['failed_searches']}  crashes {crashes}",
            flush=True,
        )
    working = [m for m, r in out["modes"].items() if not sum(r["failed_searches"].values())]
    if isinstance(system, Agentmemd):
        working = working[:1]  # the defaults: what a caller gets without choosing a mode
    for mode in working:

        async def ask(q: Any, mode: str = mode) -> Any:
            return await system.search_turns(q.text, q.agent_id, mode)

        levels = {}
        for c, n in ((1, args.requests_1), (16, args.requests_16)):
            levels[str(c)] = await latency(ask, work.questions, c, n)
            lv = levels[str(c)]
            print(f"[{system.name}] latency {mode}, {c} askers: p50 {lv['p50_ms']} p99 {lv['p99_ms']} ms", flush=True)
        out["latency"][mode] = levels
    out["breaks"] = system.breaks.events
    return out


# -- the result ------------------------------------------------------------------------------


def plot(path: Path, systems: dict[str, dict[str, Any]]) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    labels, nd, rc, colors = [], [], [], []
    palette = {"agentmemd": "#1f77b4", "AMS": "#d62728", "mem0": "#2ca02c"}
    for name, data in systems.items():
        for mode, row in data.get("modes", {}).items():
            labels.append(f"{name}\n{mode}".replace(", ", ",\n"))
            nd.append(row["scifact_ndcg@10"])
            rc.append(row["locomo_r@10"])
            colors.append(palette.get(name, "grey"))
    for ax, values, title in ((axes[0][0], nd, "SciFact nDCG@10"), (axes[0][1], rc, "LoCoMo dev recall@10, all")):
        bars = ax.bar(range(len(values)), values, color=colors)
        ax.bar_label(bars, fmt="%.3f", fontsize=7)
        ax.set_xticks(range(len(values)), labels, fontsize=6)
        ax.set_ylim(0, 1)
        ax.set_title(title + " (a failed search scores 0)")
    ax = axes[1][0]
    names, p50s, p99s = [], [], []
    for name, data in systems.items():
        for mode, levels in data.get("latency", {}).items():
            for c, lv in levels.items():
                names.append(f"{name}\n{mode}\n{c} asker(s)".replace(", ", ",\n"))
                p50s.append(lv["p50_ms"])
                p99s.append(lv["p99_ms"])
    xs = range(len(names))
    b1 = ax.bar([x - 0.2 for x in xs], p50s, 0.4, label="p50")
    b2 = ax.bar([x + 0.2 for x in xs], p99s, 0.4, label="p99")
    ax.bar_label(b1, fmt="%.0f", fontsize=6)
    ax.bar_label(b2, fmt="%.0f", fontsize=6)
    ax.set_xticks(list(xs), names, fontsize=6)
    ax.set_ylabel("ms")
    ax.set_title(f"query latency, top_k {TOP_K}, LoCoMo questions")
    ax.legend(fontsize=7)
    ax = axes[1][1]
    ing = [(n, d) for n, d in systems.items() if "ingest_scifact" in d]
    xs = range(len(ing))
    b1 = ax.bar([x - 0.2 for x in xs], [d["ingest_scifact"]["per_s"] for _, d in ing], 0.4, label="SciFact docs/s")
    b2 = ax.bar([x + 0.2 for x in xs], [d["ingest_locomo"]["per_s"] for _, d in ing], 0.4, label="LoCoMo turns/s")
    ax.bar_label(b1, fmt="%.1f", fontsize=7)
    ax.bar_label(b2, fmt="%.1f", fontsize=7)
    ax.set_xticks(list(xs), [n for n, _ in ing])
    ax.set_title("ingestion, submit -> searchable")
    ax.legend(fontsize=7)
    fig.suptitle("agentmemd and its peers: same corpus, model and Redis build, one run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def record(result: Result, systems: dict[str, dict[str, Any]]) -> None:
    for name, data in systems.items():
        if "ingest_scifact" not in data:
            continue
        result.figure(f"{name}: SciFact ingestion, submit -> searchable", data["ingest_scifact"]["per_s"], "docs/s")
        result.figure(f"{name}: LoCoMo ingestion, submit -> searchable", data["ingest_locomo"]["per_s"], "turns/s")
        for mode, row in data["modes"].items():
            result.figure(f"{name}, {mode}: SciFact nDCG@10", row["scifact_ndcg@10"])
            result.figure(f"{name}, {mode}: LoCoMo R@10, all categories", row["locomo_r@10"])
            failed = row["failed_searches"]["scifact"] + row["failed_searches"]["locomo"]
            if failed or row["wrong_results"]:
                result.figure(
                    f"{name}, {mode}: failed searches (Redis crashes) / results from another conversation",
                    f"{failed} ({row['redis_crashes']}) / {row['wrong_results']}",
                )
        for mode, levels in data["latency"].items():
            for c, lv in levels.items():
                result.figure(
                    f"{name}, {mode}: p50 / p99 at {c} asker(s)", f"{lv['p50_ms']:.1f} / {lv['p99_ms']:.1f}", "ms"
                )
    ours, ams = systems.get("agentmemd"), systems.get("AMS")
    if not ours or not ams or "modes" not in ams:
        return
    ours_mode = next(iter(ours["modes"]))
    ours_p50 = ours["latency"][ours_mode]["16"]["p50_ms"]
    ams_lat = {m: lv["16"]["p50_ms"] for m, lv in ams["latency"].items()}
    best_lat = min(ams_lat, key=lambda m: ams_lat[m]) if ams_lat else None
    result.target(
        "agentmemd p50 at 16 askers / AMS's best mode's",
        ours_p50 / ams_lat[best_lat] if best_lat else float("nan"),
        "<=",
        0.5,
        "x",
        f"{ours_p50:.1f} ms / {ams_lat[best_lat]:.1f} ms ({best_lat})" if best_lat else "no AMS mode worked",
    )
    working = {m: r for m, r in ams["modes"].items() if not sum(r["failed_searches"].values())}
    for key, label in (("scifact_ndcg@10", "SciFact nDCG@10"), ("locomo_r@10", "LoCoMo R@10")):
        best = max(working, key=lambda m: working[m][key]) if working else None
        ref = working[best][key] if best else float("nan")
        result.target(
            f"agentmemd {label} (defaults) >= AMS's best working mode + 0.05",
            ours["modes"][ours_mode][key],
            ">=",
            ref + 0.05,
            expr=f"AMS best working: {best} {ref:.4f}" if best else "no AMS mode worked",
        )
    for key, unit in (("ingest_scifact", "docs/s"), ("ingest_locomo", "turns/s")):
        result.target(
            f"agentmemd {key.removeprefix('ingest_')} ingestion >= AMS's",
            ours[key]["per_s"],
            ">=",
            ams[key]["per_s"],
            unit,
            "items/s, submit -> searchable",
        )


async def run(args: argparse.Namespace, tmp: Path) -> Result:
    work = load_work(args)
    result = Result(
        BENCH,
        "Peers: agentmemd, Redis Agent Memory Server and mem0 on the same work",
        {
            "scifact_docs": len(work.docs),
            "scifact_queries": len(work.doc_queries),
            "locomo_turns": len(work.turns),
            "locomo_questions": len(work.questions),
            "top_k": TOP_K,
            "latency_requests": {"1": args.requests_1, "16": args.requests_16},
            "graph": args.graph,
            "peers": args.peers,
        },
        smoke=bool(args.quick or args.scifact_docs or args.queries or args.conversations or args.questions),
    )
    systems: dict[str, dict[str, Any]] = {}
    installs: dict[str, Any] = {}

    ours = Agentmemd(args.graph, tmp)
    try:
        await ours.start()
        systems["agentmemd"] = await measure(ours, work, args)
    finally:
        await ours.close()

    if "ams" in args.peers:
        try:
            installs["AMS"] = ensure_ams()
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            installs["AMS"] = {"failed": str(exc)}
            result.note(f"AMS did not install: {exc}")
        if "failed" not in installs["AMS"]:
            ams = Ams(tmp / "ams")
            (tmp / "ams").mkdir(parents=True, exist_ok=True)
            try:
                await ams.start()
                systems["AMS"] = await measure(ams, work, args)
                systems["AMS"]["redis_restarts"] = ams.restarts
            except Exception as exc:
                tails = {p.name: p.read_text(errors="replace").splitlines()[-5:] for p in (tmp / "ams").glob("*.log")}
                systems["AMS"] = {
                    "failed": f"{type(exc).__name__}: {exc}",
                    "log_tails": tails,
                    "breaks": ams.breaks.events,
                }
                result.note(f"AMS failed mid-run: {type(exc).__name__}: {exc}")
            finally:
                await ams.close()

    if "mem0" in args.peers:
        try:
            installs["mem0"] = ensure_mem0()
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            installs["mem0"] = {"failed": str(exc)}
        if "failed" not in installs["mem0"]:
            from daemon.launcher import free_port, start_redis

            url = f"redis://127.0.0.1:{free_port()}/0"
            redis_proc = start_redis(url, data_dir=tmp / "mem0-redis", appendonly=True)
            try:
                installs["mem0"]["probe"] = probe_mem0(url)
            finally:
                redis_proc.stop()
            probe = installs["mem0"]["probe"]
            systems["mem0"] = {"probe_returncode": probe["returncode"], "probe_errors": probe["errors"]}
            if probe["returncode"] != 0:
                result.note(
                    "mem0 was not measured: its probe (one add with infer=False, one search, offline) failed: "
                    + " | ".join(probe["errors"][-3:])
                )

    result.doc["data"] = {"systems": systems, "installs": installs}
    record(result, systems)
    for name, data in systems.items():
        for e in data.get("breaks", [])[:3]:
            result.note(f"{name} broke ({e['kind']}, {e['mode']}, {e['set']}): {e['query']!r}: {e['detail'][:200]}")
    result.note(
        "same Redis binary and modules for every system (daemon.launcher.start_redis, AOF on), each its own; the "
        "same packaged all-MiniLM-L6-v2 through the daemon's own embedder (AMS through a local OpenAI-compatible "
        "endpoint); the query-embedding cache off on both sides; one system running at a time"
    )
    result.note(
        f"quality: one asker at a time, top {TOP_K}; agentmemd's SciFact hits are chunks ({2 * TOP_K} asked), "
        "mapped to docs by their best chunk; a failed search scores 0. LoCoMo: filtered to the question's "
        "conversation (agent_id / namespace)"
    )
    if result.doc["smoke"]:
        result.note("SUBSET RUN: not comparable with a full run")
    plot(png_path(args.out, BENCH), systems)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scifact", type=Path, default=ROOT.parent / "shared" / "eval" / "scifact")
    parser.add_argument("--locomo", type=Path, default=ROOT.parent / "shared" / "eval" / "locomo" / "locomo_dev.json")
    parser.add_argument("--scifact-docs", type=int, default=0, help="docs judged for the queries + others (0: all)")
    parser.add_argument("--queries", type=int, default=0, help="SciFact test queries (0: all 300)")
    parser.add_argument("--conversations", type=int, default=0, help="LoCoMo conversations (0: all five)")
    parser.add_argument("--questions", type=int, default=0, help="LoCoMo questions (0: all)")
    parser.add_argument("--requests-1", type=int, default=200, help="timed requests at 1 asker")
    parser.add_argument("--requests-16", type=int, default=800, help="timed requests at 16 askers")
    parser.add_argument("--peers", default="ams,mem0", help="comma-separated: ams, mem0")
    parser.add_argument("--graph", action="store_true", help="run the daemon with its graph layer on")
    parser.add_argument("--quick", action="store_true", help="smoke run: small subsets of everything")
    parser.add_argument("--serve-embeddings", type=int, metavar="PORT", help=argparse.SUPPRESS)
    add_common_args(parser)
    args = parser.parse_args()
    if args.serve_embeddings:
        quiet_logs()
        asyncio.run(serve_embeddings(args.serve_embeddings))
        return
    if args.quick:
        args.scifact_docs = args.scifact_docs or 300
        args.queries = args.queries or 20
        args.conversations = args.conversations or 1
        args.questions = args.questions or 60
        args.requests_1, args.requests_16 = 20, 64
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    exit_on_sigterm()
    quiet_logs()
    tmp = Path(tempfile.mkdtemp(prefix="agentmemd-peers-"))
    try:
        result = asyncio.run(run(args, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    path = result.write(args.out)
    result.print_summary()
    print(f"\nwrote {path} and {png_path(args.out, BENCH)}")


if __name__ == "__main__":
    main()
