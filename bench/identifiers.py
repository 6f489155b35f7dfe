"""Exact-identifier retrieval: MRR@10 of dense, BM25, RRF and RRF + identifier leg on look-alike ids.

Run from the project root:

    .venv/bin/python bench/identifiers.py

Corpus, built from what the standard library ships (no download): one document per
``errno`` name (``ECONNREFUSED (errno 111): Connection refused``), per ``http.HTTPStatus``
(``HTTP 504 Gateway Timeout: ...``) and per ``signal`` (``SIGTERM (signal 15): Terminated``),
written as an ops note. These identifiers look alike (ECONNRESET / ECONNREFUSED / ECONNABORTED,
HTTP 502 / 503 / 504, SIGUSR1 / SIGUSR2) and their descriptions overlap, which is where
dense vectors blur and BM25 stems and splits. Each query names exactly one identifier in a
sentence ("we keep seeing ECONNABORTED from the payment worker, what is it?"); the relevant
document is that identifier's.

Path: documents through the daemon's ``Ingestor`` into Redis, queries through ``Retriever``.
Target: RRF + identifier leg MRR@10 >= 0.95. (The no-loss-on-SciFact half of that target is
measured by bench/scifact.py, whose last configuration runs every leg at its default weight.)
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import http
import os
import random
import signal

from _result import Result, png_path
from _run import add_common_args, quiet_logs
from _servers import embedded_servers

TEMPLATES = [
    "we keep seeing {id} from the payment worker, what does it mean?",
    "what is {id}",
    "{id} showed up in the logs after the deploy",
    "how should a client react to {id}?",
]


def corpus() -> list[tuple[str, str, str]]:
    """(doc_id, identifier as written in queries, text)."""
    docs: list[tuple[str, str, str]] = []
    for name in sorted(n for n in dir(errno) if n.startswith("E") and n.isupper()):
        num = getattr(errno, name)
        docs.append(
            (
                f"errno/{name}",
                name,
                f"{name} (errno {num}): {os.strerror(num)}. "
                f"A system call failed with {name}; check the socket or file it was given.",
            )
        )
    for status in http.HTTPStatus:
        docs.append(
            (
                f"http/{status.value}",
                f"HTTP {status.value}",
                f"HTTP {status.value} {status.phrase}: {status.description or status.phrase}. "
                f"Upstream services answer {status.value} when this happens.",
            )
        )
    for sig in sorted(signal.Signals, key=lambda s: s.value):
        desc = signal.strsignal(sig) or sig.name
        docs.append(
            (
                f"signal/{sig.name}",
                sig.name,
                f"{sig.name} (signal {sig.value}): {desc}. The process received {sig.name} from the supervisor.",
            )
        )
    seen: set[str] = set()
    unique = []
    for d in docs:  # errno has aliases (EWOULDBLOCK == EAGAIN): keep the first name of each doc id
        if d[0] not in seen:
            seen.add(d[0])
            unique.append(d)
    return unique


def mrr_at_10(ranked: list[str], relevant: str) -> float:
    for i, doc in enumerate(ranked[:10], start=1):
        if doc == relevant:
            return 1.0 / i
    return 0.0


async def run(args: argparse.Namespace) -> None:
    import redis.asyncio as aredis

    from memory.config import ChunkingConfig, EmbeddingConfig, IndexConfig, IngestConfig, RetrievalConfig
    from memory.embedder import SentenceTransformerEmbedder
    from memory.index import ChunkIndex
    from memory.ingest import Ingestor
    from memory.records import MemoryItem
    from memory.retrieval import Retriever
    from memory.search_spec import SearchSpec

    docs = corpus()
    rng = random.Random(7)
    queries = [(doc_id, rng.choice(TEMPLATES).format(id=ident)) for doc_id, ident, _ in docs]
    result = Result("identifiers", "Exact identifiers: MRR@10 on look-alike ids", {"docs": len(docs)})
    with embedded_servers(kafka=False, appendonly=False) as servers:
        client = aredis.from_url(servers.redis_url)
        emb = await SentenceTransformerEmbedder.load(EmbeddingConfig())
        index = ChunkIndex(client=client, cfg=IndexConfig(name="bench_ids"), dims=emb.dims)
        await index.ensure()
        ingestor = Ingestor(index=index, embedder=emb, chunking=ChunkingConfig(), cfg=IngestConfig())
        await ingestor.apply([MemoryItem(op="upsert", doc_id=d, version=1, content=t) for d, _, t in docs])
        retriever = Retriever(index=index, embedder=emb, cfg=RetrievalConfig())
        configs = {
            "dense": {"dense_weight": 1.0, "sparse_weight": 0.0, "identifier_weight": 0.0},
            "BM25": {"dense_weight": 0.0, "sparse_weight": 1.0, "identifier_weight": 0.0},
            "RRF (dense + BM25)": {"dense_weight": 1.0, "sparse_weight": 1.0, "identifier_weight": 0.0},
            "RRF + identifier leg": {"dense_weight": 1.0, "sparse_weight": 1.0, "identifier_weight": 1.0},
        }
        scores: dict[str, float] = {}
        for name, weights in configs.items():
            total = 0.0
            for relevant, text in queries:
                out = await retriever.search(SearchSpec(text=text, top_k=10, **weights))
                ranked = list(dict.fromkeys(h.chunk.doc_id for h in out.hits))
                total += mrr_at_10(ranked, relevant)
            scores[name] = total / len(queries)
            result.figure(f"MRR@10, {name}", scores[name])
        emb.close()
        await client.aclose()
    result.target("RRF + identifier leg MRR@10", scores["RRF + identifier leg"], ">=", 0.95)
    result.note(f"{len(docs)} docs (errno, http.HTTPStatus, signal) and one query per doc naming its identifier")
    result.doc["data"]["scores"] = scores

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    names = list(scores)
    ax.barh(names, [scores[n] for n in names], color=["#888", "#888", "#888", "#c0392b"])
    ax.axvline(0.95, color="k", linestyle="--", linewidth=1)
    ax.set_xlim(0, 1)
    ax.set_xlabel("MRR@10")
    ax.set_title("Look-alike identifiers (target 0.95)")
    fig.tight_layout()
    fig.savefig(png_path(args.out, "identifiers"))
    result.write(args.out)
    result.print_summary()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    quiet_logs()
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
