"""Retrieval quality on BEIR SciFact (or any BEIR dataset): nDCG@10 and Recall@100 of each leg and of RRF fusions.

Run from the project root:

    .venv/bin/python bench/scifact.py                                   # full (first run ~10 min)
    .venv/bin/python bench/scifact.py --limit-queries 10 --limit-docs 300   # smoke

Data: ``../shared/eval/scifact`` relative to the project root (corpus.jsonl, queries.jsonl,
qrels/test.tsv; ``--split dev`` reads qrels/dev.tsv, MS MARCO's only judgements), never copied
into the project. ``--data`` takes any dataset in BEIR's format:
its results go to ``beir-<folder>.json`` (SciFact's to ``scifact.json``), SciFact's own targets
(published baselines, no regression) are checked only on SciFact, and the two relative ones
(fusion against the legs) on every set. As BEIR's evaluation does, a result whose doc id is
the query's id is dropped (ArguAna and Quora hold each query in the corpus; BEIR asks for one
more result to make up for it, the daemon gives at most 100, so Recall@100 there is over 99); a
doc with no text is not ingested and a query the retriever refuses scores 0; both are counted in
the notes. ``--name`` names the results (``cqadupstack/android`` would otherwise be
``beir-android``).

Path: each abstract (``title + " " + text``, ``doc_id`` = the corpus ``_id``, version 1) goes
through the daemon's own ``memory.ingest.Ingestor`` (chunking with the model's tokenizer,
embedding, versioned writes) into Redis, called in-process instead of through Kafka to save
time (ingestion over Kafka is what bench/ingest.py measures). Every query is answered by
Redis through ``memory.retrieval.Retriever`` with a ``SearchSpec`` (top_k 100): the BM25 leg
alone (dense_weight 0), the dense leg alone (sparse_weight 0), RRF k=60 with equal weights,
and weighted RRF over dense weight {0.3, 0.5, 0.7} (sparse = 1 - dense) x k {10, 60}. Chunk
hits map back to their doc_id (a doc ranks where its best chunk ranks; duplicates dropped).

Cache: the chunk embeddings (what takes ~10 minutes) are kept under bench/.cache/scifact/
(another dataset's under bench/.cache/<name>/), keyed by model and chunk text, and saved as
ingestion goes (an interrupted run resumes).
Every run ingests into a fresh Redis through the real Ingestor, with only the embedding of
already-seen chunk texts served from that cache. (Keeping Redis's own AOF instead was tried
and rejected: after a reload RediSearch indexes every hash twice, once during the replay and
once in a background scan, and the leftovers change BM25 statistics, so a cached run scored
differently from a fresh one.) ``--rebuild`` empties the cache.

Targets: on every set, the daemon's defaults >= max(BM25, dense) and the best RRF >= max(BM25,
dense) + 0.01; on SciFact also the published BM25 baseline and no regression. Nothing is
asserted: misses are reported as MISSED.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import redis.asyncio as aredis
from _common import CACHE_DIR, ROOT
from _result import Result, png_path
from _run import add_common_args, run_benchmark
from _scifact_configs import evaluate
from _scifact_data import load_data, pick_docs, qrels_file
from _scifact_ingest import CachedEmbedder, ingest_all
from _scifact_result import REFERENCES, plot, record
from _servers import wait_redis_ready

from memory.config import ChunkingConfig, EmbeddingConfig, IndexConfig, IngestConfig, RetrievalConfig
from memory.embedder import SentenceTransformerEmbedder
from memory.index import ChunkIndex
from memory.ingest import Ingestor
from memory.retrieval import Retriever

BENCH = "scifact"
INDEX = "scifact"


def bench_name(data: Path, name: str | None = None) -> str:
    """``scifact`` for SciFact, ``beir-<folder>`` for any other BEIR dataset (``--name`` wins)."""
    if name:
        return name
    return BENCH if data.resolve().name == BENCH else f"beir-{data.resolve().name}"


async def main_async(args: argparse.Namespace, redis_url: str) -> Result:
    corpus, queries, qrels = load_data(args.data, args.split)
    qids = [q for q in queries if q in qrels]
    if args.limit_queries:
        qids = qids[: args.limit_queries]
    wanted = pick_docs(corpus, qrels, qids, args.limit_docs, args.seed)
    blank = [d for d in wanted if not corpus[d].strip()]
    wanted = [d for d in wanted if corpus[d].strip()]
    name = bench_name(args.data, args.name)
    subset = bool(args.limit_queries or args.limit_docs)
    emb_cfg = EmbeddingConfig()  # type: ignore[call-arg]
    chunking = ChunkingConfig(strategy=args.chunking)
    retrieval_cfg = RetrievalConfig()
    result = Result(
        name,
        f"Retrieval quality: BEIR {'SciFact' if name == BENCH else args.data.resolve().name} (test split)",
        {
            "data": str(args.data),
            "blank_docs_skipped": len(blank),
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
        rows = await evaluate(retriever, queries, qrels, qids, args.top_k)
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
    record(
        result,
        rows,
        ingest,
        args.top_k,
        subset,
        {"queries": len(qids), "docs": len(wanted), "corpus_docs": len(corpus), "blank_docs": len(blank)},
        scifact=name == BENCH,
    )
    title = "BEIR SciFact" if name == BENCH else f"BEIR {args.data.resolve().name}"
    plot(png_path(args.out, name), rows, subset, references=name == BENCH, title=title)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "eval" / "scifact")
    parser.add_argument("--split", default="test", help="the judgements used: qrels/<SPLIT>.tsv (default: test)")
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="where chunk embeddings are kept (default: bench/.cache/<name>)"
    )
    parser.add_argument(
        "--name", default=None, help="the results' name (default: scifact, or beir-<folder> for another dataset)"
    )
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
        parser.error(f"no BEIR dataset at {args.data} (corpus.jsonl, queries.jsonl, qrels/{args.split}.tsv)")
    qrels_file(args.data, args.split)  # before any server starts
    name = bench_name(args.data, args.name)
    if args.cache_dir is None:
        args.cache_dir = CACHE_DIR / name
    run_benchmark(name, args, main_async, kafka=False)


if __name__ == "__main__":
    main()
