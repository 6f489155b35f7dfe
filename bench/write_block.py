"""How long one document's chunk write blocks Redis, by document size: written whole in one
transaction, and in slices (the default for a document of more than ``write_slice_chunks``).

Run from the project root:

    .venv/bin/python bench/write_block.py                      # 300, 1,200, 4,000, 9,400, 300
    .venv/bin/python bench/write_block.py --sizes 100 300      # smoke

Redis runs a MULTI/EXEC alone, and RediSearch indexes every chunk inside it (BM25 terms,
tags, the HNSW insert), so nothing else (any daemon's query, any tenant) is answered
meanwhile. A document of up to ``IndexConfig.write_slice_chunks`` chunks (64) is written in
one transaction; a larger one in transactions of that many, with a write marker that keeps
queries on the old version until the last slice is in (``memory/visibility.py``).
Here ``ChunkIndex.apply`` writes one document of each size, in order, into each of two
indexes, one with ``write_slice_chunks`` so large that every document goes whole (the
behaviour before slicing) and one at the default, while a thread with its own connection
sends PING every 5 ms. The longest PING round trip is how long Redis answered nothing else;
Redis's own count of time in EXEC (INFO commandstats, all of a write's transactions) is
recorded beside it. The BM25 analysis is computed before the write, as the daemon does. Chunk
texts are ~200 words of synthetic English (``SyntheticText``), vectors random unit vectors
(384-d; no model is loaded: the model's own vectors blocked as long in a side run). 9,400
chunks is about the largest document ``ingest.max_content_bytes`` (4 MiB) admits. No target
is set; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from typing import Any

import numpy as np
import redis
import redis.asyncio as aredis
from _result import Result, png_path
from _run import add_common_args, run_benchmark
from _servers import wait_redis_ready
from _stats import summary_ms
from _synthetic_text import SyntheticText

BENCH = "write_block"


def _exec_usec(client: redis.Redis) -> int:
    """Microseconds Redis has spent in EXEC so far (its own count, INFO commandstats)."""
    return int(client.info("commandstats").get("cmdstat_exec", {}).get("usec", 0))


async def _one(index: Any, url: str, text: SyntheticText, k: int, n: int) -> dict[str, Any]:
    from memory.index import analyze
    from memory.records import ChunkRecord

    doc = f"bench/write-block-{k}-{n}.md"
    before = await index.count()
    now = time.time()
    chunks = [
        ChunkRecord(
            chunk_id=f"{doc}_p{i}",
            doc_id=doc,
            position=i,
            text=text.paragraph(200),
            kind="document",
            source="bench",
            tags={},
            metadata={},
            version=1,
            timestamp=now,
        )
        for i in range(n)
    ]
    vectors = np.random.default_rng(n).standard_normal((n, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    # As the daemon does: the BM25 analysis is computed beforehand, off the write.
    analyses = await asyncio.to_thread(analyze, [c.text for c in chunks])
    # The prober is a thread with its own connection: nothing this event loop does (building
    # and sending the transaction) can delay a PING's reply being read.
    prober = redis.Redis.from_url(url, socket_timeout=120)  # not the 5 s default: a PING waits out the longest write
    pings: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            t = time.perf_counter()
            prober.ping()
            pings.append(time.perf_counter() - t)
            time.sleep(0.005)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    await asyncio.sleep(0.3)
    idle = list(pings)
    exec_before = _exec_usec(prober)
    t0 = time.perf_counter()
    result = await index.apply(doc, 1, chunks, vectors, analyses=analyses)
    took = time.perf_counter() - t0
    exec_s = (_exec_usec(prober) - exec_before) / 1e6
    await asyncio.sleep(0.3)
    done.set()
    thread.join()
    prober.close()
    assert result.applied and result.chunks == n, result
    return {
        "chunks": n,
        "index_before": before,
        "apply_s": took,
        "exec_s": exec_s,
        "ping_max_ms": max(pings) * 1000,
        "ping_idle": summary_ms(idle),
        "pings": len(pings),
    }


async def main_async(args: argparse.Namespace, redis_url: str) -> Result:
    from memory.config import IndexConfig
    from memory.index import ChunkIndex

    title = "One document's chunk write: how long Redis answers nothing else, whole and in slices"
    result = Result(BENCH, title, vars(args) | {"out": None})
    # redis-py's default 5 s socket timeout would cut the longest whole writes (the daemon's
    # client waits 10 s); a timeout while watching comes back as a WatchError, and the retry
    # then finds the version stored and reports the write as not applied.
    client = aredis.from_url(redis_url, socket_timeout=120)
    await wait_redis_ready(client)
    default_slice = IndexConfig().write_slice_chunks
    modes = {"whole": IndexConfig(name="writeblock-whole", write_slice_chunks=100_000)}
    modes["sliced"] = IndexConfig(name="writeblock-sliced", write_slice_chunks=default_slice)
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        for mode, cfg in modes.items():
            index = ChunkIndex(client=client, cfg=cfg, dims=384, recreate=True)
            await index.ensure()
            text = SyntheticText(seed=args.seed)  # the same texts for both
            rows = runs[mode] = []
            for k, n in enumerate(args.sizes):
                row = await _one(index, redis_url, text, k, n)
                rows.append(row)
                print(
                    f"{mode}: {n} chunks into {row['index_before']:,}: blocked {row['ping_max_ms']:.1f} ms", flush=True
                )
            await index.drop()
    finally:
        await client.aclose()
    for whole, sliced in zip(runs["whole"], runs["sliced"], strict=True):
        label = f"{whole['chunks']} chunks into {whole['index_before']:,}"
        for mode, row in (("whole", whole), (f"sliced ({default_slice})", sliced)):
            result.figure(f"{label}, {mode}: Redis blocked (longest PING round trip)", row["ping_max_ms"], "ms")
            result.figure(
                f"{label}, {mode}: EXEC time, all transactions (INFO commandstats)", row["exec_s"] * 1000, "ms"
            )
            result.figure(f"{label}, {mode}: ChunkIndex.apply took", row["apply_s"], "s")
        result.figure(
            f"{label}: longest block, sliced / whole",
            sliced["ping_max_ms"] / whole["ping_max_ms"] if whole["ping_max_ms"] else float("nan"),
            "x",
        )
    result.doc["data"]["rows"] = runs
    result.note(
        "Whole: one MULTI/EXEC per document, as every document was written before slicing. Sliced: "
        f"transactions of {default_slice} chunks behind a write marker (memory/visibility.py), the "
        "default for larger documents. Redis indexes every chunk of a transaction inside it and answers "
        "no other client meanwhile; the rest of apply's time (building and sending the commands; the "
        "BM25 analysis is computed before, as the daemon does) does not block Redis. PINGs come from a "
        "thread of their own. The cost per chunk grows with the index (the last size is written again "
        "into the grown index). Vectors are random; in side runs the model's own vectors of the same "
        "texts blocked as long (1,700 chunks: 246 against 250 ms), and ef_construction 200 was ~40% of "
        "the block at 4,000 chunks (50: 460 against 760 ms)."
    )
    _plot(runs, args)
    return result


def _plot(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, marker in (("whole", "o"), ("sliced", "s")):
        rows = runs[mode]
        xs = [r["chunks"] for r in rows]
        ax.plot(xs, [r["ping_max_ms"] for r in rows], marker, label=f"{mode}: Redis blocked (longest PING)")
        ax.plot(xs, [r["apply_s"] * 1000 for r in rows], marker, mfc="none", label=f"{mode}: ChunkIndex.apply")
    for r in runs["whole"]:
        ax.annotate(f"into {r['index_before']:,}", (r["chunks"], r["ping_max_ms"]), fontsize=7)
    ax.set_xlabel("chunks in the document")
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.set_title("One document's chunk write")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path(args.out, BENCH), dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sizes = [300, 1200, 4000, 9400, 300]
    parser.add_argument("--sizes", type=int, nargs="+", default=sizes, help="chunks per document, in order")
    parser.add_argument("--seed", type=int, default=5)
    add_common_args(parser)
    args = parser.parse_args()
    run_benchmark(BENCH, args, main_async, kafka=False)


if __name__ == "__main__":
    main()
