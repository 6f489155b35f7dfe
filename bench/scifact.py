"""Retrieval quality on BEIR SciFact: nDCG@10 and Recall@100 of each leg and of RRF fusions.

Run from the project root:

    /work/venv/bin/python bench/scifact.py                                   # full (first run ~10 min)
    /work/venv/bin/python bench/scifact.py --limit-queries 10 --limit-docs 300   # smoke

Data: ``../shared/eval/scifact`` relative to the project root (corpus.jsonl, queries.jsonl,
qrels/test.tsv), never copied into the project.

Path: each abstract (``title + " " + text``, ``doc_id`` = the corpus ``_id``, version 1) goes
through the daemon's own ``memory.ingest.Ingestor`` (chunking with the model's tokenizer,
embedding, versioned writes) into Redis, called in-process instead of through Kafka to save
time (ingestion over Kafka is what bench/ingest.py measures). Every query is answered by
Redis through ``memory.retrieval.Retriever`` with a ``SearchSpec`` (top_k 100): the BM25 leg
alone (dense_weight 0), the dense leg alone (sparse_weight 0), RRF k=60 with equal weights,
and weighted RRF over dense weight {0.3, 0.5, 0.7} (sparse = 1 - dense) x k {10, 60}. Chunk
hits map back to their doc_id (a doc ranks where its best chunk ranks; duplicates dropped).

Cache: the chunk embeddings (what takes ~10 minutes) are kept under bench/.cache/scifact/,
keyed by model and chunk text, and saved as ingestion goes (an interrupted run resumes).
Every run ingests into a fresh Redis through the real Ingestor, with only the embedding of
already-seen chunk texts served from that cache. (Keeping Redis's own AOF instead was tried
and rejected: after a reload RediSearch indexes every hash twice, once during the replay and
once in a background scan, and the leftovers change BM25 statistics, so a cached run scored
differently from a fresh one.) ``--rebuild`` empties the cache.

Targets: BM25 leg nDCG@10 >= 0.655; best RRF nDCG@10 >= max(BM25, dense) + 0.01. Nothing is
asserted: misses are reported as MISSED.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import json
import math
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aredis
from _common import (
    CACHE_DIR,
    ROOT,
    Result,
    add_common_args,
    png_path,
    run_benchmark,
    summary_ms,
    wait_redis_ready,
)

from memory.config import ChunkingConfig, EmbeddingConfig, IndexConfig, IngestConfig, RetrievalConfig
from memory.embedder import SentenceTransformerEmbedder
from memory.index import ChunkIndex
from memory.ingest import Ingestor
from memory.records import MemoryItem
from memory.retrieval import Retriever
from memory.search_spec import SearchSpec

BENCH = "scifact"
DENSE_SPARSE = {"dense_weight", "sparse_weight"}
INDEX = "scifact"
REFERENCES = {
    "BM25 (BEIR paper)": 0.665,
    "BM25 (Anserini flat)": 0.679,
    "all-MiniLM-L6-v2 (MTEB)": 0.645,
}


def load_data(data: Path) -> tuple[dict[str, str], dict[str, str], dict[str, dict[str, int]]]:
    """corpus id -> content, query id -> text (in file order), qrels query id -> {doc id: grade}."""
    corpus: dict[str, str] = {}
    with (data / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            corpus[str(d["_id"])] = f"{d.get('title', '')} {d.get('text', '')}".strip()
    queries: dict[str, str] = {}
    with (data / "queries.jsonl").open(encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            queries[str(d["_id"])] = d["text"]
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    with (data / "qrels" / "test.tsv").open(encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t")
        next(reader)  # header
        for qid, did, score in reader:
            qrels[qid][did] = int(score)
    return corpus, queries, dict(qrels)


def ndcg_at(ranked: list[str], rels: dict[str, int], k: int = 10) -> float:
    """nDCG@k with linear gains (as pytrec_eval, which BEIR uses)."""
    dcg = sum(rels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted((g for g in rels.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at(ranked: list[str], rels: dict[str, int], k: int = 100) -> float:
    relevant = {d for d, g in rels.items() if g > 0}
    return len(relevant & set(ranked[:k])) / len(relevant) if relevant else 0.0


def pick_docs(
    corpus: dict[str, str], qrels: dict[str, dict[str, int]], qids: list[str], limit: int, seed: int
) -> list[str]:
    """Every doc id (``limit`` 0), or the docs judged for ``qids`` plus random others up to ``limit``."""
    if not limit:
        return list(corpus)
    needed = list(dict.fromkeys(d for q in qids for d in qrels[q] if d in corpus))
    needed_set = set(needed)
    others = [d for d in corpus if d not in needed_set]
    random.Random(seed).shuffle(others)
    return needed + others[: max(0, limit - len(needed))]


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


class CachedEmbedder:
    """The real embedder, with document embeddings kept on disk by (model, chunk text).

    Implements the ``memory.embedder.Embedder`` protocol, so the real ``Ingestor`` and
    ``Retriever`` use it unchanged; only repeated chunk texts skip the model.
    """

    def __init__(self, inner: SentenceTransformerEmbedder, path: Path, model: str) -> None:
        self.inner = inner
        self.path = path
        self.model = model
        self.vectors: dict[str, np.ndarray] = {}
        self.hits = self.misses = 0
        self._dirty = False
        if path.exists():
            with np.load(path, allow_pickle=False) as data:
                if str(data["model"]) == model and data["vectors"].shape[1:] == (inner.dims,):
                    vectors = data["vectors"].astype(np.float32)
                    self.vectors = dict(zip(data["keys"].tolist(), vectors, strict=True))

    @property
    def dims(self) -> int:
        return self.inner.dims

    @property
    def identity(self) -> str:
        return str(self.inner.identity)

    def _key(self, text: str) -> str:
        return hashlib.sha1(text.encode("utf-8")).hexdigest()

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        keys = [self._key(t) for t in texts]
        todo = [i for i, k in enumerate(keys) if k not in self.vectors]
        self.hits += len(texts) - len(todo)
        self.misses += len(todo)
        if todo:
            fresh = await self.inner.embed_documents([texts[i] for i in todo])
            for i, vec in zip(todo, fresh, strict=True):
                self.vectors[keys[i]] = vec
            self._dirty = True
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        return np.stack([self.vectors[k] for k in keys]).astype(np.float32)

    async def embed_query(self, text: str) -> np.ndarray:
        return await self.inner.embed_query(text)

    async def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return await self.inner.token_offsets(text)

    def save(self) -> None:
        if not self._dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp.npz")
        keys = list(self.vectors)
        vectors = np.stack([self.vectors[k] for k in keys]) if keys else np.zeros((0, self.dims), np.float32)
        np.savez(tmp, model=np.array(self.model), keys=np.array(keys), vectors=vectors)
        tmp.replace(self.path)
        self._dirty = False


async def ingest_all(
    ingestor: Ingestor, embedder: CachedEmbedder, corpus: dict[str, str], wanted: list[str], batch: int
) -> dict[str, Any]:
    """Every wanted doc through the real Ingestor into the (fresh) index, saving embeddings as it goes."""
    t0 = time.perf_counter()
    last = last_save = t0
    done = chunks = 0
    for i in range(0, len(wanted), batch):
        ids = wanted[i : i + batch]
        items = [MemoryItem(op="upsert", doc_id=d, version=1, content=corpus[d], source=d) for d in ids]
        report = await ingestor.apply(items)
        if report.failed:
            raise RuntimeError(f"ingest failed: {[(it.doc_id, str(e)) for it, e in report.failed][:3]}")
        done += len(ids)
        chunks += report.chunks_written
        now = time.perf_counter()
        if now - last_save > 30:
            embedder.save()
            last_save = now
        if now - last > 10 or done == len(wanted):
            rate = done / (now - t0)
            eta = (len(wanted) - done) / rate
            print(
                f"  ingested {done}/{len(wanted)} docs ({rate:.1f} docs/s, ~{eta / 60:.1f} min left; "
                f"{embedder.hits} chunk embeddings from the cache, {embedder.misses} computed)",
                flush=True,
            )
            last = now
    embedder.save()
    seconds = time.perf_counter() - t0
    return {
        "docs": done,
        "chunks_written": chunks,
        "seconds": round(seconds, 1),
        "docs_per_s": round(done / seconds, 2),
        "embeddings_from_cache": embedder.hits,
        "embeddings_computed": embedder.misses,
    }


def plot(path: Path, rows: list[dict[str, Any]], subset: bool) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(13, 5))
    xs = list(range(len(rows)))
    w = 0.4
    b1 = ax.bar([x - w / 2 for x in xs], [r["ndcg@10"] for r in rows], w, label="nDCG@10", color="#1f77b4")
    b2 = ax.bar([x + w / 2 for x in xs], [r["recall@100"] for r in rows], w, label="Recall@100", color="#aec7e8")
    ax.bar_label(b1, fmt="%.3f", fontsize=7)
    ax.bar_label(b2, fmt="%.3f", fontsize=7)
    for (label, value), style in zip(REFERENCES.items(), (":", "-.", "--"), strict=True):
        ax.axhline(value, color="grey", linestyle=style, linewidth=1, label=f"{label}: {value}")
    ax.axhline(0.655, color="red", linestyle="--", linewidth=1, label="target BM25 >= 0.655")
    ax.set_xticks(xs, [r["name"].replace(", ", "\n") for r in rows], fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.set_title("BEIR SciFact (test)" + (" - SUBSET RUN, not comparable" if subset else ""))
    ax.legend(fontsize=7, loc="upper left", ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def main_async(args: argparse.Namespace, redis_url: str) -> Result:
    corpus, queries, qrels = load_data(args.data)
    qids = [q for q in queries if q in qrels]
    if args.limit_queries:
        qids = qids[: args.limit_queries]
    wanted = pick_docs(corpus, qrels, qids, args.limit_docs, args.seed)
    subset = bool(args.limit_queries or args.limit_docs)
    emb_cfg = EmbeddingConfig()  # type: ignore[call-arg]
    chunking = ChunkingConfig(strategy=args.chunking)
    retrieval_cfg = RetrievalConfig()
    result = Result(
        BENCH,
        "Retrieval quality: BEIR SciFact (test split)",
        {
            "data": str(args.data),
            "queries": len(qids),
            "docs_wanted": len(wanted),
            "corpus_docs": len(corpus),
            "top_k": args.top_k,
            "fetch_multiplier": retrieval_cfg.fetch_multiplier,
            "model": emb_cfg.model,
            "chunking": chunking.model_dump(),
            "limit_queries": args.limit_queries,
            "limit_docs": args.limit_docs,
        },
        smoke=subset,
    )
    client = aredis.from_url(redis_url, socket_timeout=60)
    inner: SentenceTransformerEmbedder | None = None
    try:
        await wait_redis_ready(client)
        inner = await SentenceTransformerEmbedder.load(emb_cfg)
        # One cache per compute precision (float32 vectors are not what a bf16 daemon writes).
        precision = "bfloat16" if inner.bf16 else "float32"
        result.doc["params"]["precision"] = precision
        cache_path = args.cache_dir / ("embeddings.npz" if precision == "float32" else f"embeddings-{precision}.npz")
        if args.rebuild and cache_path.exists():
            cache_path.unlink()
        embedder = CachedEmbedder(inner, cache_path, emb_cfg.model)
        print(f"{len(embedder.vectors)} chunk embeddings in the cache ({cache_path})", flush=True)
        index = ChunkIndex(client=client, cfg=IndexConfig(name=INDEX), dims=embedder.dims)
        await index.drop()
        await index.ensure()
        ingestor = Ingestor(index=index, embedder=embedder, chunking=chunking, cfg=IngestConfig())
        print(f"ingesting {len(wanted)} docs through the Ingestor ...", flush=True)
        ingest = await ingest_all(ingestor, embedder, corpus, wanted, args.batch_docs)
        chunks = await index.count()
        info = await client.ft(INDEX).info()  # type: ignore[no-untyped-call]
        index_info = {k: info.get(k) for k in ("num_docs", "max_doc_id", "num_terms", "num_records")}
        print(f"index: {len(wanted)} docs, {chunks} chunks; evaluating {len(qids)} queries", flush=True)

        retriever = Retriever(index=index, embedder=embedder, cfg=retrieval_cfg)
        rows: list[dict[str, Any]] = []
        for cfg in configs():
            ndcgs: list[float] = []
            recalls: list[float] = []
            took: list[float] = []
            for qid in qids:
                spec = SearchSpec(
                    text=queries[qid],
                    top_k=args.top_k,
                    dense_weight=cfg["dense"],
                    sparse_weight=cfg["sparse"],
                    rrf_k=cfg["k"],
                    **cfg["extra"],
                )
                t0 = time.perf_counter()
                outcome = await retriever.search(spec)
                took.append(time.perf_counter() - t0)
                ranked = list(dict.fromkeys(h.chunk.doc_id for h in outcome.hits))
                ndcgs.append(ndcg_at(ranked, qrels[qid], 10))
                recalls.append(recall_at(ranked, qrels[qid], 100))
            row = {
                **cfg,
                "ndcg@10": sum(ndcgs) / len(ndcgs),
                "recall@100": sum(recalls) / len(recalls),
                "search_ms": summary_ms(took),
                "per_query_ndcg@10": [round(x, 4) for x in ndcgs],
            }
            rows.append(row)
            print(f"  {cfg['name']:<36} nDCG@10 {row['ndcg@10']:.4f}  Recall@100 {row['recall@100']:.4f}", flush=True)
    finally:
        if inner is not None:
            inner.close()
        await client.aclose()

    result.doc["data"] = {
        "ingest": ingest,
        "docs_in_index": len(wanted),
        "chunks_in_index": chunks,
        "ft_info": index_info,
        "query_ids": qids,
        "configs": rows,
        "references_ndcg@10": REFERENCES,
    }
    for r in rows:
        result.figure(f"nDCG@10, {r['name']}", r["ndcg@10"])
        result.figure(f"Recall@100, {r['name']}", r["recall@100"])
    bm25 = next(r for r in rows if r["key"] == "bm25")
    dense = next(r for r in rows if r["key"] == "dense")
    best = max((r for r in rows if r["rrf"]), key=lambda r: r["ndcg@10"])
    result.figure(f"best RRF: {best['name']}", best["ndcg@10"])
    result.target("BM25 leg nDCG@10", bm25["ndcg@10"], ">=", 0.655, expr="published 0.665 (BEIR) - 0.679 (Anserini)")
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
    if default is not None:
        result.target(
            f"identifier leg's cost on SciFact (the daemon's defaults - {equal['name']}, no identifier leg)",
            round(default["ndcg@10"] - equal["ndcg@10"], 4),
            ">=",
            -0.005,
            expr=f"{default['ndcg@10']:.4f} - {equal['ndcg@10']:.4f}",
        )
        result.target("the daemon's defaults nDCG@10", default["ndcg@10"], ">=", 0.712)
        result.target("BM25 leg alone nDCG@10 (no regression)", bm25["ndcg@10"], ">=", 0.685)
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
        f"top_k={args.top_k} chunks per query, mapped to doc ids (best chunk's rank, duplicates dropped), so a "
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
    if subset:
        result.note(
            f"SUBSET RUN ({len(qids)} queries, {len(wanted)} of {len(corpus)} docs in the index): "
            "not comparable with published figures"
        )
    plot(png_path(args.out, BENCH), rows, subset)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "eval" / "scifact")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR / "scifact", help="where chunk embeddings are kept")
    parser.add_argument("--limit-queries", type=int, default=0, help="evaluate only the first N test queries")
    parser.add_argument(
        "--limit-docs",
        type=int,
        default=0,
        help="ingest only the docs judged for the evaluated queries plus others up to this many in total",
    )
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--batch-docs", type=int, default=32, help="docs per Ingestor.apply batch")
    parser.add_argument("--rebuild", action="store_true", help="empty the embedding cache first")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument(
        "--chunking", choices=["stable", "windows"], default="stable", help="chunking.strategy (default: the daemon's)"
    )
    add_common_args(parser)
    args = parser.parse_args()
    if not (args.data / "corpus.jsonl").exists():
        parser.error(f"SciFact not found at {args.data}")
    run_benchmark(BENCH, args, main_async, kafka=False)


if __name__ == "__main__":
    main()
