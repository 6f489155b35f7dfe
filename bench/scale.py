"""Scale benchmark: query latency, memory per chunk and write rate at 1k, 10k and 100k chunks.

Run from the project root:

    .venv/bin/python bench/scale.py                          # 1k, 10k, 100k chunks
    .venv/bin/python bench/scale.py --sizes 1000,5000 --queries 50   # smoke

One index in a fresh embedded Redis (AOF on, as the daemon runs it) grows stage by stage to
each size. Chunks are written the way the daemon writes them, ``ChunkIndex.apply`` per doc
(one optimistic transaction each, sequentially, ``--chunks-per-doc`` chunks per doc), with
synthetic text and, to keep 100k feasible on 2 cores, random unit vectors instead of the
model's (``--real-vectors`` embeds with the model instead; then the write rate includes
embedding). At each size:

* query latency p50/p99 through ``memory.retrieval.Retriever`` (hybrid, top_k 10, a distinct
  text per query, so each one is embedded by the real model), plus the BM25 leg's and the
  KNN search's own times from the retriever's leg timings;
* Redis memory per chunk: ``INFO memory`` ``used_memory`` above the empty index / chunks;
* this process's peak RSS (``resource.getrusage``) and Redis's RSS;
* the write rate of the stage, and chunks/s per window of writes as the index grows.

No targets are set for this one; nothing is asserted.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import redis.asyncio as aredis
from _result import Result, png_path
from _run import add_common_args, run_benchmark
from _servers import wait_redis_ready
from _stats import peak_rss_mb, pid_peak_rss_mb, summary_ms
from _synthetic_text import SyntheticText

from memory.config import EmbeddingConfig, IndexConfig, RetrievalConfig
from memory.embedder import SentenceTransformerEmbedder
from memory.index import ChunkIndex
from memory.records import ChunkRecord
from memory.retrieval import Retriever
from memory.search_spec import SearchSpec

BENCH = "scale"
SERVICES = ["billing-service", "auth-service", "search-api", "ledger-service", "orders-service"]
ENVIRONMENTS = ["production", "staging"]


def records(synth: SyntheticText, doc: int, n: int, words: int) -> list[ChunkRecord]:
    doc_id = f"scale/doc-{doc:07d}"
    service, env = SERVICES[doc % len(SERVICES)], ENVIRONMENTS[doc % len(ENVIRONMENTS)]
    return [
        ChunkRecord(
            chunk_id=f"{doc_id}_p{i}",
            doc_id=doc_id,
            position=i,
            text=synth.paragraph(words),
            kind="document",
            source=doc_id,
            tags={"service": service, "environment": env, "doc_id": doc_id, "kind": "document", "source": doc_id},
            metadata={"service": service, "environment": env},
            version=1,
            timestamp=time.time(),
        )
        for i in range(n)
    ]


async def used_memory(client: aredis.Redis) -> dict[str, int]:
    info = await client.info("memory")
    return {k: int(info[k]) for k in ("used_memory", "used_memory_rss", "used_memory_peak")}


async def main_async(args: argparse.Namespace, redis_url: str) -> Result:
    sizes = sorted(args.sizes)
    result = Result(
        BENCH,
        "Scale: 1k / 10k / 100k chunks",
        {
            "sizes": sizes,
            "chunks_per_doc": args.chunks_per_doc,
            "words_per_chunk": args.words,
            "queries_per_size": args.queries,
            "top_k": args.top_k,
            "vectors": "model" if args.real_vectors else "random unit vectors",
            "aof": not args.no_aof,
        },
        smoke=max(sizes) < 100_000 or args.queries < 200,
    )
    synth = SyntheticText(seed=args.seed)
    rng = np.random.default_rng(args.seed)
    client = aredis.from_url(redis_url, socket_timeout=120)
    embedder: SentenceTransformerEmbedder | None = None
    stages: list[dict[str, Any]] = []
    windows: list[tuple[int, float]] = []
    try:
        await wait_redis_ready(client)
        embedder = await SentenceTransformerEmbedder.load(EmbeddingConfig())  # type: ignore[call-arg]
        index = ChunkIndex(client=client, cfg=IndexConfig(name="bench_scale"), dims=embedder.dims)
        await index.drop()
        await index.ensure()
        retriever = Retriever(index=index, embedder=embedder, cfg=RetrievalConfig())
        for _ in range(5):
            await embedder.embed_query(synth.query() + " warm")
        base = await used_memory(client)
        total = doc = 0
        for size in sizes:
            print(f"growing the index to {size} chunks ...", flush=True)
            t0 = time.perf_counter()
            w_t, w_n = t0, total
            embed_s = 0.0
            while total < size:
                n = min(args.chunks_per_doc, size - total)
                recs = records(synth, doc, n, args.words)
                if args.real_vectors:
                    e0 = time.perf_counter()
                    vecs = await embedder.embed_documents([r.text for r in recs])
                    embed_s += time.perf_counter() - e0
                else:
                    vecs = rng.standard_normal((n, embedder.dims)).astype(np.float32)
                    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
                await index.apply(recs[0].doc_id, 1, recs, vecs)
                total += n
                doc += 1
                if total - w_n >= args.window or total == size:
                    now = time.perf_counter()
                    windows.append((total, (total - w_n) / (now - w_t)))
                    w_t, w_n = now, total
            write_s = time.perf_counter() - t0
            added = size - (stages[-1]["chunks"] if stages else 0)
            count = await index.count()
            mem = await used_memory(client)
            print(f"  {count} chunks indexed at {added / write_s:.0f} chunks/s; querying ...", flush=True)

            total_ms: list[float] = []
            sparse: list[float] = []
            knn: list[float] = []
            embed: list[float] = []
            for _ in range(args.queries):
                spec = SearchSpec(text=synth.query(synth.rng.randint(3, 8)), top_k=args.top_k)
                t = time.perf_counter()
                outcome = await retriever.search(spec)
                total_ms.append(time.perf_counter() - t)
                legs = outcome.legs
                if "sparse" in legs:
                    sparse.append(legs["sparse"].end - legs["sparse"].start)
                dense = legs.get("dense")
                if dense is not None and dense.embedded is not None:
                    knn.append(dense.end - dense.embedded)
                    embed.append(dense.embedded - dense.start)
            stage = {
                "chunks": size,
                "chunks_indexed": count,
                "docs": doc,
                "write_s": round(write_s, 2),
                "write_chunks_per_s": round(added / write_s, 1),
                "embed_s": round(embed_s, 2) if args.real_vectors else None,
                "query": summary_ms(total_ms),
                "bm25_leg": summary_ms(sparse),
                "knn_search": summary_ms(knn),
                "query_embedding": summary_ms(embed),
                "redis_used_memory": mem["used_memory"],
                "redis_used_memory_rss": mem["used_memory_rss"],
                "redis_bytes_per_chunk": round((mem["used_memory"] - base["used_memory"]) / size, 1),
                # the daemon is this process plus its embedding worker (the model lives there)
                "process_peak_rss_mb": round(peak_rss_mb() + pid_peak_rss_mb(embedder.worker_pid), 1),
                "main_peak_rss_mb": peak_rss_mb(),
                "embedding_worker_peak_rss_mb": pid_peak_rss_mb(embedder.worker_pid),
            }
            stages.append(stage)
            q = stage["query"]
            print(
                f"  query p50 {q['p50_ms']} ms p99 {q['p99_ms']} ms; "
                f"{stage['redis_bytes_per_chunk']:.0f} B/chunk in Redis; peak RSS {stage['process_peak_rss_mb']} MB",
                flush=True,
            )
    finally:
        if embedder is not None:
            embedder.close()
        await client.aclose()

    result.doc["data"] = {"base_memory": base, "stages": stages, "write_rate_windows": windows}
    for s in stages:
        label = f"{s['chunks']:,} chunks"
        result.figure(f"query p50 / p99 ({label})", f"{s['query']['p50_ms']:.1f} / {s['query']['p99_ms']:.1f}", "ms")
        result.figure(
            f"BM25 leg / KNN search p50 ({label})",
            f"{s['bm25_leg']['p50_ms']:.2f} / {s['knn_search']['p50_ms']:.2f}",
            "ms",
        )
        result.figure(f"Redis memory per chunk ({label})", s["redis_bytes_per_chunk"], "bytes")
        result.figure(f"process peak RSS ({label})", s["process_peak_rss_mb"], "MB")
        result.figure(f"write rate while growing to {label}", s["write_chunks_per_s"], "chunks/s")
    if not args.real_vectors:
        result.note(
            "chunk vectors are random unit vectors written with ChunkIndex.apply (no model), so the write rate is "
            "the index's (Redis + HNSW + BM25), not embedding; queries are embedded by the real model"
        )
    result.note(
        "writes are sequential, one ChunkIndex.apply transaction per doc (the daemon's Ingestor writes 8 docs of "
        "a group at once, so this is the slower, one-writer rate); peak RSS is this process's plus its embedding "
        "worker process's (where the model lives; both are in the data), Redis's own RSS is in the data"
    )
    plot(png_path(args.out, BENCH), stages, windows)
    return result


def plot(path: Any, stages: list[dict[str, Any]], windows: list[tuple[int, float]]) -> None:
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.5))
    xs = [s["chunks"] for s in stages]
    legs = (("query", "query (hybrid)"), ("bm25_leg", "BM25 leg"), ("knn_search", "KNN search"))
    for (key, label), color in zip(legs, ("#1f77b4", "#2ca02c", "#9467bd"), strict=True):
        ax1.plot(xs, [s[key]["p50_ms"] for s in stages], marker="o", color=color, label=f"{label} p50")
        ax1.plot(xs, [s[key]["p99_ms"] for s in stages], "--", marker="x", color=color, label=f"{label} p99")
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("chunks in the index")
    ax1.set_ylabel("ms")
    ax1.set_title("Query latency (Retriever)")
    ax1.legend(fontsize=7)
    ax2.plot(xs, [s["redis_bytes_per_chunk"] / 1024 for s in stages], marker="o", label="Redis KiB / chunk")
    ax2b = ax2.twinx()
    ax2b.plot(xs, [s["process_peak_rss_mb"] for s in stages], marker="s", color="#d62728", label="peak RSS (MB)")
    ax2.set_xscale("log")
    ax2.set_xlabel("chunks in the index")
    ax2.set_ylabel("KiB per chunk (used_memory delta)")
    ax2b.set_ylabel("process peak RSS (MB)")
    ax2.set_title("Memory")
    lines = ax2.get_legend_handles_labels()
    lines2 = ax2b.get_legend_handles_labels()
    ax2.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8)
    if windows:
        ax3.plot([w[0] for w in windows], [w[1] for w in windows], linewidth=1)
    ax3.set_xscale("log")
    ax3.set_xlabel("chunks in the index")
    ax3.set_ylabel("chunks / s (per window)")
    ax3.set_title("Write rate as the index grows")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1_000, 10_000, 100_000],
        help="chunk counts, comma-separated (default 1000,10000,100000)",
    )
    parser.add_argument("--queries", type=int, default=200, help="queries per size (default 200)")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--chunks-per-doc", type=int, default=4)
    parser.add_argument("--words", type=int, default=110, help="words per chunk (~150 model tokens)")
    parser.add_argument("--window", type=int, default=1000, help="chunks per write-rate sample")
    parser.add_argument("--real-vectors", action="store_true", help="embed chunks with the model (slow)")
    parser.add_argument("--no-aof", action="store_true", help="run Redis without AOF")
    parser.add_argument("--seed", type=int, default=5)
    add_common_args(parser)
    args = parser.parse_args()
    run_benchmark(BENCH, args, main_async, kafka=False, appendonly=not args.no_aof)


if __name__ == "__main__":
    main()
