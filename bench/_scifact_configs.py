"""The BEIR configurations (legs alone, RRF fusions, the daemon's defaults) and their evaluation."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import _common  # noqa: F401  (the offline environment and sys.path, before any project module)
from _scifact_data import ndcg_at, recall_at
from _stats import summary_ms

from memory.config import RetrievalConfig
from memory.errors import InvalidRequest
from memory.retrieval import Retriever
from memory.search_spec import SearchSpec

DENSE_SPARSE = {"dense_weight", "sparse_weight"}

#: Legs a SearchSpec can weight besides dense and sparse (e.g. an exact-identifier leg, when the
#: retriever has one): they are switched off (weight 0) except in the "daemon default" config.
EXTRA_LEGS = sorted(
    f.name for f in dataclasses.fields(SearchSpec) if f.name.endswith("_weight") and f.name not in DENSE_SPARSE
)


def configs() -> list[dict[str, Any]]:
    """Leg-alone and two-leg RRF configs (other legs off), plus the daemon's default legs if it has more."""
    out = [
        {"name": "BM25 leg alone", "key": "bm25", "dense": 0.0, "sparse": 1.0, "k": 60, "rrf": False},
        {"name": "dense leg alone", "key": "dense", "dense": 1.0, "sparse": 0.0, "k": 60, "rrf": False},
        {"name": "RRF k=60, equal weights", "key": "rrf_equal_k60", "dense": 1.0, "sparse": 1.0, "k": 60, "rrf": True},
    ]
    for w in (0.3, 0.5, 0.7):
        for k in (10, 60):
            sparse = round(1 - w, 2)
            out.append(
                {
                    "name": f"RRF k={k}, dense {w} / sparse {sparse}",
                    "key": f"rrf_d{w}_s{sparse}_k{k}",
                    "dense": w,
                    "sparse": sparse,
                    "k": k,
                    "rrf": True,
                }
            )
    for cfg in out:
        cfg["extra"] = dict.fromkeys(EXTRA_LEGS, 0.0)
    if EXTRA_LEGS:
        out.append(
            {
                "name": f"the daemon's defaults (RRF k={RetrievalConfig().rrf_k}, every leg at its default weight)",
                "key": "rrf_default_all_legs",
                "dense": None,
                "sparse": None,
                "k": None,
                "rrf": True,
                "extra": {},
            }
        )
    return out


async def evaluate(
    retriever: Retriever, queries: dict[str, str], qrels: dict[str, dict[str, int]], qids: list[str], top_k: int
) -> list[dict[str, Any]]:
    """nDCG@10, Recall@100 and search time of every config over ``qids``, one printed line per config.

    As BEIR's own evaluation: a result whose doc id is the query's id is dropped (ArguAna and
    Quora hold each query in the corpus too). A query the retriever refuses (blank, too long)
    scores 0 and is counted in the row's ``refused``.
    """
    rows: list[dict[str, Any]] = []
    for cfg in configs():
        ndcgs: list[float] = []
        recalls: list[float] = []
        took: list[float] = []
        refused: list[str] = []
        for qid in qids:
            spec = SearchSpec(
                text=queries[qid],
                top_k=top_k,
                dense_weight=cfg["dense"],
                sparse_weight=cfg["sparse"],
                rrf_k=cfg["k"],
                **cfg["extra"],
            )
            t0 = time.perf_counter()
            try:
                outcome = await retriever.search(spec)
            except InvalidRequest as exc:
                refused.append(f"{qid}: {exc}")
                ndcgs.append(0.0)
                recalls.append(0.0)
                continue
            took.append(time.perf_counter() - t0)
            ranked = [d for d in dict.fromkeys(h.chunk.doc_id for h in outcome.hits) if d != qid]
            ndcgs.append(ndcg_at(ranked, qrels[qid], 10))
            recalls.append(recall_at(ranked, qrels[qid], 100))
        row = {
            **cfg,
            "ndcg@10": sum(ndcgs) / len(ndcgs),
            "recall@100": sum(recalls) / len(recalls),
            "search_ms": summary_ms(took),
            "per_query_ndcg@10": [round(x, 4) for x in ndcgs],
            "refused": refused,
        }
        rows.append(row)
        note = f"  ({len(refused)} refused, scored 0)" if refused else ""
        print(f"  {cfg['name']:<36} nDCG@10 {row['ndcg@10']:.4f}  Recall@100 {row['recall@100']:.4f}{note}", flush=True)
    return rows
