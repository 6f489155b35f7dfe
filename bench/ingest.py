"""Ingestion benchmark: events -> searchable chunks/s end to end, and event -> searchable latency.

Run from the project root:

    .venv/bin/python bench/ingest.py                 # 600 docs, graph on and off
    .venv/bin/python bench/ingest.py --docs 40 --fresh-docs 10   # smoke

What it does, per mode (graph layer on = the daemon's default config, and off):

1. starts the embedded Redis and tansu on free ports and a daemon in this process
   (``daemon.app.start_daemon``), with fresh topics and a fresh index;
2. throughput: publishes N synthetic documents to the documents topic with aiokafka (all at
   once) and polls ``ChunkIndex.count()`` until every chunk they make is indexed;
   chunks/s = chunks / (last chunk indexed - first publish);
3. freshness: publishes more documents at ~50% of the docs/s just measured, one at a time,
   and for each notes when its chunks exist in the index (polled every 5 ms): the
   event -> searchable latency.

Raw embedding throughput of the same model and batch size on the same chunk texts
(``SentenceTransformerEmbedder.embed_documents``) is measured in the same run, right before
and right after each daemon run (no daemon running); each mode's ratio uses the mean of its
two adjacent measurements. Targets: e2e / raw >= 0.85 and freshness p95 <= 1 s. Nothing is
asserted: misses are reported as MISSED.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
import uuid
from typing import Any

from _result import Result, png_path
from _run import add_common_args, run_benchmark
from _servers import Servers, wait_until
from _stats import summary_ms
from _synthetic_text import SyntheticText
from aiokafka import AIOKafkaProducer

from daemon.app import start_daemon
from daemon.settings import Settings, namespaced
from graph.config import GraphConfig
from memory.chunking import spans_for
from memory.config import ChunkingConfig, EmbeddingConfig
from memory.embedder import SentenceTransformerEmbedder

BENCH = "ingest"


def make_docs(synth: SyntheticText, n: int, prefix: str, min_words: int, max_words: int) -> list[tuple[str, str]]:
    """``(doc_id, content)`` pairs of synthetic prose, a few paragraphs each."""
    docs = []
    for i in range(n):
        words = synth.rng.randint(min_words, max_words)
        paras = [synth.paragraph(max(20, words // 3)) for _ in range(3)]
        docs.append((f"{prefix}/doc-{i:05d}.md", "\n\n".join(paras)))
    return docs


async def chunk_texts(
    embedder: SentenceTransformerEmbedder, cfg: ChunkingConfig, docs: list[tuple[str, str]]
) -> list[str]:
    """The exact chunk texts the daemon will make (same tokenizer, same chunker)."""
    texts: list[str] = []
    for _doc_id, content in docs:
        offsets = await embedder.token_offsets(content)
        spans = spans_for(content, offsets, cfg)
        texts.extend(s.text for s in spans)
    return texts


async def raw_embedding(embedder: SentenceTransformerEmbedder, texts: list[str]) -> dict[str, Any]:
    await embedder.embed_documents(texts[:64])  # warm-up
    t0 = time.perf_counter()
    await embedder.embed_documents(texts)
    dt = time.perf_counter() - t0
    return {
        "chunks": len(texts),
        "seconds": round(dt, 3),
        "chunks_per_s": round(len(texts) / dt, 2),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def event(doc_id: str, content: str) -> bytes:
    return json.dumps(
        {
            "event_id": uuid.uuid4().hex,
            "op": "upsert",
            "doc_id": doc_id,
            "version": 1,
            "source": doc_id,
            "content": content,
            "metadata": {"service": "bench-service", "environment": "bench"},
        }
    ).encode()


async def run_mode(
    args: argparse.Namespace,
    servers: Servers,
    graph: bool,
    docs: list[tuple[str, str]],
    expected_chunks: int,
    fresh_docs: list[tuple[str, str]],
) -> dict[str, Any]:
    label = "graph" if graph else "nograph"
    name = f"bench_ingest_{label}"
    settings = namespaced(
        name,
        kafka_bootstrap=servers.kafka_bootstrap,
        redis_url=servers.redis_url,
        topic_partitions=args.partitions,
        graph=GraphConfig(enabled=graph),
    )
    print(f"[{label}] starting daemon (graph layer {'on' if graph else 'off'}) ...", flush=True)
    daemon = await start_daemon(settings)
    producer = AIOKafkaProducer(bootstrap_servers=servers.kafka_bootstrap, acks="all", linger_ms=0)
    await producer.start()
    out: dict[str, Any] = {"graph": graph, "partitions": args.partitions}
    try:
        await daemon.index.drop()
        await daemon.index.ensure()
        # A long-running daemon is warm: pay the model's first-call cost before timing.
        await daemon.embedder.embed_documents(["warm-up text for the embedding model"] * 8)
        out["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]

        # -- throughput: everything published at once, timed until the last chunk is indexed
        print(f"[{label}] throughput: publishing {len(docs)} docs ({expected_chunks} chunks) ...", flush=True)
        t0 = time.perf_counter()
        futures = [
            await producer.send(settings.topics.documents, event(doc_id, content), key=doc_id.encode())
            for doc_id, content in docs
        ]
        await asyncio.gather(*futures)
        published = time.perf_counter()
        progress: list[tuple[float, int]] = []

        async def all_indexed() -> bool:
            n = await daemon.index.count()
            progress.append((time.perf_counter() - t0, n))
            return n >= expected_chunks

        done = await wait_until(all_indexed, timeout_s=args.timeout, interval_s=0.02)
        t1 = time.perf_counter()
        indexed = progress[-1][1] if progress else 0
        elapsed = t1 - t0
        out["throughput"] = {
            "docs": len(docs),
            "chunks_expected": expected_chunks,
            "chunks_indexed": indexed,
            "completed": done,
            "publish_s": round(published - t0, 3),
            "elapsed_s": round(elapsed, 3),
            "chunks_per_s": round(indexed / elapsed, 2),
            "docs_per_s": round(len(docs) * indexed / max(expected_chunks, 1) / elapsed, 2),
            "progress": [(round(t, 3), n) for t, n in progress[:: max(1, len(progress) // 200)]],
        }
        print(f"[{label}] throughput: {out['throughput']['chunks_per_s']} chunks/s in {elapsed:.1f}s", flush=True)

        # -- freshness: paced publishing at ~50% of the measured max rate
        rate = max(0.1, out["throughput"]["docs_per_s"] * args.fresh_rate_fraction)
        interval = 1.0 / rate
        print(f"[{label}] freshness: {len(fresh_docs)} docs at {rate:.2f} docs/s ...", flush=True)
        sent_at: dict[str, float] = {}
        seen_at: dict[str, float] = {}
        pending: set[str] = set()
        stop = asyncio.Event()

        async def poller() -> None:
            while not stop.is_set() or pending:
                batch = list(pending)
                if batch:
                    found = await asyncio.gather(*(daemon.index.chunk_ids(d) for d in batch))
                    now = time.perf_counter()
                    for doc_id, ids in zip(batch, found, strict=True):
                        if ids:
                            seen_at[doc_id] = now
                            pending.discard(doc_id)
                await asyncio.sleep(0.005)

        poll_task = asyncio.create_task(poller())
        start = time.perf_counter()
        for i, (doc_id, content) in enumerate(fresh_docs):
            delay = start + i * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent_at[doc_id] = time.perf_counter()
            pending.add(doc_id)
            await producer.send_and_wait(settings.topics.documents, event(doc_id, content), key=doc_id.encode())
        stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(poll_task, timeout=args.timeout)
        lat = [seen_at[d] - sent_at[d] for d in sent_at if d in seen_at]
        out["freshness"] = {
            "rate_docs_per_s": round(rate, 3),
            "docs": len(fresh_docs),
            "seen": len(lat),
            "never_seen": len(fresh_docs) - len(lat),
            **summary_ms(lat),
            "latencies_ms": [round(x * 1000, 2) for x in lat],
        }
        print(
            f"[{label}] freshness: p50 {out['freshness']['p50_ms']} ms, p95 {out['freshness']['p95_ms']} ms",
            flush=True,
        )
        out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        await producer.stop()
        await daemon.stop()
    return out


def plot(path: Any, raw: dict[str, Any], modes: dict[str, dict[str, Any]]) -> None:
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = 0.0
    ticks, names = [], []
    for m in modes.values():
        adj, e2e = m["raw_chunks_per_s_adjacent"], m["throughput"]["chunks_per_s"]
        bars = ax1.bar([x, x + 0.8], [adj, e2e], width=0.75, color=["#999999", "#1f77b4" if m["graph"] else "#ff7f0e"])
        ax1.bar_label(bars, fmt="%.1f")
        ax1.hlines(adj * 0.85, x + 0.4, x + 1.2, color="red", linestyle="--")
        ax1.text(x + 0.8, e2e / 2, f"{e2e / adj:.2f}x", ha="center", color="white", fontweight="bold")
        ticks += [x, x + 0.8]
        names += ["raw embedding", f"end to end\n(graph {'on' if m['graph'] else 'off'})"]
        x += 2.2
    ax1.set_xticks(ticks, names)
    ax1.plot([], [], color="red", linestyle="--", label="target: 0.85 x raw")
    ax1.set_ylabel("chunks / s")
    ax1.set_title(f"Ingestion throughput ({raw['measurements'][0]['chunks']} chunks)")
    ax1.legend()
    for m in modes.values():
        lat = sorted(m["freshness"]["latencies_ms"])
        if lat:
            ys = [(i + 1) / len(lat) for i in range(len(lat))]
            ax2.step(
                lat,
                ys,
                where="post",
                label=f"graph {'on' if m['graph'] else 'off'} ({m['freshness']['rate_docs_per_s']} docs/s)",
            )
    ax2.axvline(1000, color="red", linestyle="--", label="target: p95 <= 1000 ms")
    ax2.axhline(0.95, color="grey", linestyle=":")
    ax2.set_xlabel("event -> searchable latency (ms)")
    ax2.set_ylabel("fraction of events")
    ax2.set_title("Freshness at ~50% of max rate")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def main_async(args: argparse.Namespace, servers: Servers) -> Result:
    synth = SyntheticText(seed=args.seed)
    docs = make_docs(synth, args.docs, "tp", args.min_words, args.max_words)
    modes_wanted = {"on": [True], "off": [False], "both": [True, False]}[args.graph]
    fresh = {g: make_docs(synth, args.fresh_docs, f"fresh-{g}", args.min_words, args.max_words) for g in modes_wanted}
    settings = Settings()
    result = Result(
        BENCH,
        "Ingestion: events -> searchable chunks/s, and freshness",
        {
            "docs": args.docs,
            "fresh_docs": args.fresh_docs,
            "words_per_doc": [args.min_words, args.max_words],
            "graph": args.graph,
            "partitions": args.partitions,
            "fresh_rate_fraction": args.fresh_rate_fraction,
            "embedding_batch_size": settings.embedding.batch_size,
            "chunking": settings.chunking.model_dump(),
            "ingest_max_records": settings.consumer.ingest_max_records,
        },
        smoke=args.docs < 600 or args.fresh_docs < 100,
    )
    print("loading the model for the raw-embedding baseline ...", flush=True)
    embedder = await SentenceTransformerEmbedder.load(EmbeddingConfig())  # type: ignore[call-arg]
    modes: dict[str, dict[str, Any]] = {}
    raws: list[dict[str, Any]] = []
    try:
        texts = await chunk_texts(embedder, settings.chunking, docs)
        print(f"{len(docs)} docs -> {len(texts)} chunks", flush=True)
        # Raw embedding is measured right before and right after each daemon run (with no
        # daemon running), so each ratio compares numbers taken under the same machine load.
        raws.append(await raw_embedding(embedder, texts))
        print(f"raw embedding: {raws[-1]['chunks_per_s']} chunks/s", flush=True)
        for graph in modes_wanted:
            key = "graph_on" if graph else "graph_off"
            modes[key] = await run_mode(args, servers, graph, docs, len(texts), fresh[graph])
            raws.append(await raw_embedding(embedder, texts))
            print(f"raw embedding: {raws[-1]['chunks_per_s']} chunks/s", flush=True)
            adjacent = (raws[-2]["chunks_per_s"] + raws[-1]["chunks_per_s"]) / 2
            modes[key]["raw_chunks_per_s_adjacent"] = round(adjacent, 2)
    finally:
        embedder.close()

    raw_cps = sum(r["chunks_per_s"] for r in raws) / len(raws)
    raw = {"measurements": raws, "chunks_per_s": round(raw_cps, 2)}
    result.doc["data"] = {"raw_embedding": raw, "modes": modes}
    result.figure("raw embedding throughput (same model, batch size, chunk texts; mean)", raw_cps, "chunks/s")
    for key, m in modes.items():
        tag = "graph on, default config" if m["graph"] else "graph off"
        tp, fr = m["throughput"], m["freshness"]
        result.figure(f"end-to-end throughput ({tag})", tp["chunks_per_s"], "chunks/s")
        if not tp["completed"]:
            result.note(f"{key}: only {tp['chunks_indexed']} of {tp['chunks_expected']} chunks indexed in time")
        result.figure(
            f"freshness rate ({tag}, ~{args.fresh_rate_fraction:.0%} of max)", fr["rate_docs_per_s"], "docs/s"
        )
        result.figure(f"freshness p50 ({tag})", fr["p50_ms"], "ms")
        result.figure(f"freshness p95 ({tag})", fr["p95_ms"], "ms")
        if fr["never_seen"]:
            result.note(f"{key}: {fr['never_seen']} freshness docs never became searchable within the timeout")
        ratio = tp["chunks_per_s"] / m["raw_chunks_per_s_adjacent"]
        result.target(
            f"e2e / raw embedding ratio ({tag})",
            ratio,
            ">=",
            0.85,
            expr="e2e chunks/s / raw chunks/s measured just before and after",
        )
        p95 = fr["p95_ms"] if fr["never_seen"] == 0 else float("nan")
        result.target(f"freshness p95 ({tag})", p95 / 1000, "<=", 1.0, "s")
    result.note(
        "daemon, client and servers share this machine's cores; the daemon runs in this process "
        "(start_daemon), the servers and the daemon's embedding worker are child processes"
    )
    result.note(
        "raw embedding = SentenceTransformerEmbedder.embed_documents on the same chunk texts, "
        "measured right before and right after each daemon run (no daemon running); each mode's ratio uses "
        "the mean of its two adjacent measurements (the machine may be shared: see loadavg in the data)"
    )
    plot(png_path(args.out, BENCH), raw, modes)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=600, help="documents for the throughput run (default 600)")
    parser.add_argument("--fresh-docs", type=int, default=100, help="documents for the freshness run (default 100)")
    parser.add_argument("--min-words", type=int, default=120)
    parser.add_argument("--max-words", type=int, default=360)
    parser.add_argument("--graph", choices=["on", "off", "both"], default="both", help="graph layer (default both)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions per topic (daemon default 4)")
    parser.add_argument("--fresh-rate-fraction", type=float, default=0.5, help="freshness rate / measured max")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for indexing")
    parser.add_argument("--seed", type=int, default=7)
    add_common_args(parser)
    args = parser.parse_args()
    run_benchmark(BENCH, args, main_async, kafka=True, pass_servers=True)


if __name__ == "__main__":
    main()
