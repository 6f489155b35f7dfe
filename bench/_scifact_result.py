"""A BEIR run's result (SciFact's by default): the plot, and the figures, targets and notes in the JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _result import Result
from _scifact_configs import EXTRA_LEGS

from memory.config import RetrievalConfig

REFERENCES = {
    "BM25 (BEIR paper)": 0.665,
    "BM25 (Anserini flat)": 0.679,
    "all-MiniLM-L6-v2 (MTEB)": 0.645,
}


def plot(
    path: Path, rows: list[dict[str, Any]], subset: bool, *, references: bool = True, title: str = "BEIR SciFact"
) -> None:
    """Each config's nDCG@10 and Recall@100; SciFact's published references where ``references``."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(13, 5))
    xs = list(range(len(rows)))
    w = 0.4
    b1 = ax.bar([x - w / 2 for x in xs], [r["ndcg@10"] for r in rows], w, label="nDCG@10", color="#1f77b4")
    b2 = ax.bar([x + w / 2 for x in xs], [r["recall@100"] for r in rows], w, label="Recall@100", color="#aec7e8")
    ax.bar_label(b1, fmt="%.3f", fontsize=7)
    ax.bar_label(b2, fmt="%.3f", fontsize=7)
    if references:
        for (label, value), style in zip(REFERENCES.items(), (":", "-.", "--"), strict=True):
            ax.axhline(value, color="grey", linestyle=style, linewidth=1, label=f"{label}: {value}")
        ax.axhline(0.655, color="red", linestyle="--", linewidth=1, label="target BM25 >= 0.655")
    ax.set_xticks(xs, [r["name"].replace(", ", "\n") for r in rows], fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{title} (test)" + (" - SUBSET RUN, not comparable" if subset else ""))
    ax.legend(fontsize=7, loc="upper left", ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def record(
    result: Result,
    rows: list[dict[str, Any]],
    ingest: dict[str, Any],
    top_k: int,
    subset: bool,
    sizes: dict[str, int],
    *,
    scifact: bool = True,
) -> None:
    """The figures, targets and notes of one run; ``sizes`` has ``queries``, ``docs``, ``corpus_docs``
    and ``blank_docs``. SciFact's own targets (published baseline, no regression) only where
    ``scifact``; fusion against the legs on every set."""
    for r in rows:
        result.figure(f"nDCG@10, {r['name']}", r["ndcg@10"])
        result.figure(f"Recall@100, {r['name']}", r["recall@100"])
    bm25 = next(r for r in rows if r["key"] == "bm25")
    dense = next(r for r in rows if r["key"] == "dense")
    best = max((r for r in rows if r["rrf"]), key=lambda r: r["ndcg@10"])
    result.figure(f"best RRF: {best['name']}", best["ndcg@10"])
    if scifact:
        result.target(
            "BM25 leg nDCG@10", bm25["ndcg@10"], ">=", 0.655, expr="published 0.665 (BEIR) - 0.679 (Anserini)"
        )
    result.target(
        "best RRF nDCG@10 >= max(BM25, dense) + 0.01",
        best["ndcg@10"],
        ">=",
        max(bm25["ndcg@10"], dense["ndcg@10"]) + 0.01,
        expr=f"best = {best['name']}",
    )
    default = next((r for r in rows if r["key"] == "rrf_default_all_legs"), None)
    k = RetrievalConfig().rrf_k
    equal = next((r for r in rows if r["key"] == f"rrf_d0.5_s0.5_k{k}"), None) or next(
        r for r in rows if r["key"] == "rrf_equal_k60"
    )
    if default is not None and scifact:
        result.target(
            f"identifier leg's cost on SciFact (the daemon's defaults - {equal['name']}, no identifier leg)",
            round(default["ndcg@10"] - equal["ndcg@10"], 4),
            ">=",
            -0.005,
            expr=f"{default['ndcg@10']:.4f} - {equal['ndcg@10']:.4f}",
        )
        result.target("the daemon's defaults nDCG@10", default["ndcg@10"], ">=", 0.712)
        result.target("BM25 leg alone nDCG@10 (no regression)", bm25["ndcg@10"], ">=", 0.685)
    if default is not None:
        result.target(
            "the daemon's defaults >= max(BM25, dense)",
            default["ndcg@10"],
            ">=",
            max(bm25["ndcg@10"], dense["ndcg@10"]),
        )
    result.note(
        "documents went through memory.ingest.Ingestor in-process (same chunking, embedding and Redis writes as "
        "the daemon), not through Kafka; queries through memory.retrieval.Retriever against Redis"
    )
    result.note(
        f"top_k={top_k} chunks per query, mapped to doc ids (best chunk's rank, duplicates dropped), so a "
        "query can rank slightly fewer than 100 docs; the best RRF configuration is picked on the test queries "
        "themselves (optimistic)"
    )
    result.note(
        f"every run ingests into a fresh Redis; this one took {ingest['seconds']} s, with "
        f"{ingest['embeddings_from_cache']} chunk embeddings from bench/.cache and {ingest['embeddings_computed']} "
        "computed by the model"
    )
    if EXTRA_LEGS:
        result.note(
            f"the retriever also has {', '.join(EXTRA_LEGS)}: off (0) in every config except the last, which runs "
            "every leg at its default weight as the daemon does; 'best RRF' is taken over all RRF configs"
        )
    refused = max(len(r.get("refused", ())) for r in rows)
    if refused:
        result.note(f"{refused} queries were refused by the retriever (scored 0): {rows[0].get('refused', [])[:3]}")
    if sizes.get("blank_docs"):
        result.note(f"{sizes['blank_docs']} docs with no title or text were not ingested")
    result.note("as BEIR's evaluation, a result whose doc id is the query's id is dropped")
    if subset:
        result.note(
            f"SUBSET RUN ({sizes['queries']} queries, {sizes['docs']} of {sizes['corpus_docs']} docs in the index): "
            "not comparable with published figures"
        )
