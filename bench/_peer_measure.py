"""Measuring one system: ingestion, quality in every mode, latency at 1 and 16 askers."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from _peer_agentmemd import Agentmemd
from _peer_system import TOP_K, SearchFailed, System
from _peer_work import Work
from _stats import summary_ms


async def quality(system: System, work: Work, mode: str) -> dict[str, Any]:
    """SciFact nDCG@10 and LoCoMo recall@10, one question at a time; a failed search scores 0."""
    from _locomo_data import recall_at
    from _scifact_data import ndcg_at

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
    out["ingest_failures"] = {
        "failed_submits": system.breaks.count("error", "-"),
        "incomplete": system.breaks.count("ingest incomplete"),
    }
    ingest = (out["ingest_scifact"], out["ingest_locomo"], out["ingest_failures"])
    print(f"[{system.name}] ingest: {' '.join(map(str, ingest))}", flush=True)
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
