"""Graph layer benchmark: document change -> communities marked stale, p50/p95 over ~100 edits.

Run from the project root:

    .venv/bin/python bench/stale_latency.py               # 60 docs, 100 edits
    .venv/bin/python bench/stale_latency.py --edits 15    # smoke

The stack is assembled as tests/integration/test_graph.py does: embedded Redis, the real
embedding model, spaCy NER, ``ChunkIndex``, ``GraphStore``, ``GraphService`` and an
``Ingestor`` whose change hook is the ``GraphService``. A synthetic ops corpus (topics
of services, error codes, config keys, hosts and tables, with some cross-links) is ingested,
communities are computed (``recompute(force=True)``) and every summary written, so the
stale queue starts empty. Then each edit rewrites one document (new version) and is timed:

* graph: the hook's own time, i.e. entity extraction (identifiers + NER, ``prepare``, which
  runs while the chunks are embedded) plus the atomic Lua step that updates the graph and
  marks the touched communities (``apply``; the daemon logs that step as
  ``change_to_stale_ms``);
* end to end: from ``Ingestor.apply`` being called (chunking, embedding, the chunk write)
  to the marks being in Redis.

Every mark is checked with ``GraphStore.is_stale``. No background workers run during the
edits (the daemon's recompute and summarizer tasks would compete for the same cores).
No target is set for this one; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aredis
from _result import Result, png_path
from _run import add_common_args, run_benchmark
from _servers import wait_redis_ready
from _stats import summary_ms
from _synthetic_text import SyntheticText

from graph.config import GraphConfig
from graph.contribution import ContributionResult
from graph.ner import SpacyNer
from graph.service import GraphService
from graph.store import GraphStore
from memory.config import ChunkingConfig, EmbeddingConfig, IndexConfig, IngestConfig
from memory.embedder import SentenceTransformerEmbedder
from memory.index import ChunkIndex
from memory.ingest import Ingestor
from memory.records import ChunkRecord, MemoryItem

BENCH = "stale_latency"
TOPICS = [
    "billing", "auth", "search", "ledger", "payments", "orders", "inventory", "notify",
    "reports", "shipping", "catalog", "profile", "fraud", "pricing", "session", "gateway",
]  # fmt: skip


class Corpus:
    """Ops-style docs: each topic has its own entities; docs mention several, some cross-link."""

    def __init__(self, synth: SyntheticText, topics: int) -> None:
        self.synth = synth
        self.topics = TOPICS[:topics]
        self.entities = {
            t: [
                f"{t}-service",
                f"ERR_{t.upper()}_{synth.rng.randrange(256):02X}",
                f"{t}_timeout",
                f"{t}-db-0{synth.rng.randint(1, 9)}.prod.internal",
                f"HTTP {synth.rng.choice([500, 502, 503, 504, 401, 429])}",
                f"{t}_pool_size",
            ]
            for t in self.topics
        }

    def text(self, topic: str, extra: str | None = None) -> str:
        rng = self.synth.rng
        ents = rng.sample(self.entities[topic], k=rng.randint(3, 5))
        if rng.random() < 0.3:
            other = rng.choice([t for t in self.topics if t != topic])
            ents.append(rng.choice(self.entities[other]))
        if extra:
            ents.append(extra)
        sentences = []
        for ent in ents:
            words = self.synth.words_n(rng.randint(6, 14))
            words.insert(rng.randrange(len(words)), ent)
            sentences.append(" ".join(words).capitalize() + ".")
        return f"Runbook for the {topic}-service. " + " ".join(sentences)


async def main_async(args: argparse.Namespace, redis_url: str) -> Result:
    result = Result(
        BENCH,
        "Graph layer: document change -> marked stale",
        {"docs": args.docs, "topics": args.topics, "edits": args.edits, "spacy_model": "en_core_web_sm"},
        smoke=args.edits < 100,
    )
    synth = SyntheticText(seed=args.seed)
    corpus = Corpus(synth, args.topics)
    client = aredis.from_url(redis_url, socket_timeout=60)
    embedder: SentenceTransformerEmbedder | None = None
    ner: SpacyNer | None = None
    graph_s: list[float] = []
    e2e_s: list[float] = []
    marked: list[int] = []
    verified = unverified = 0
    try:
        await wait_redis_ready(client)
        embedder = await SentenceTransformerEmbedder.load(EmbeddingConfig())  # type: ignore[call-arg]
        ner = await SpacyNer.load("en_core_web_sm")
        name = "bench_stale"
        index = ChunkIndex(client=client, cfg=IndexConfig(name=name), dims=embedder.dims)
        await index.drop()
        await index.ensure()
        store = GraphStore(client=client, name=name)
        graph = GraphService(
            store=store,
            index=index,
            embedder=embedder,
            ner=ner,
            cfg=GraphConfig(summarizer_rate_per_min=60_000),
        )
        # (graph layer seconds, when apply returned, outcome) per applied change. The graph
        # layer is the hook's two steps: prepare (extraction, run while the chunks are
        # embedded) plus apply (the Lua call that marks communities stale).
        timings: list[tuple[float, float, ContributionResult]] = []
        prepared_s: list[float] = []

        class TimedHook:
            async def prepare(self, changes: Sequence[tuple[MemoryItem, Sequence[ChunkRecord]]]) -> list[Any]:
                t0 = time.perf_counter()
                out = await graph.prepare(changes)
                prepared_s.append(time.perf_counter() - t0)
                return out

            async def apply(self, item: MemoryItem, prepared: Any) -> ContributionResult:
                t0 = time.perf_counter()
                out = await graph.apply(item, prepared)
                t1 = time.perf_counter()
                timings.append((prepared_s[-1] + t1 - t0, t1, out))
                return out

        ingestor = Ingestor(
            index=index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig(), hook=TimedHook()
        )
        docs = {f"runbooks/doc-{i:03d}.md": corpus.topics[i % len(corpus.topics)] for i in range(args.docs)}
        versions = dict.fromkeys(docs, 1)
        print(f"ingesting {len(docs)} docs ...", flush=True)
        await ingestor.apply(
            [MemoryItem(op="upsert", doc_id=d, version=1, content=corpus.text(t)) for d, t in docs.items()]
        )
        report = await graph.recompute(force=True)
        communities = report.communities if report else 0
        levels = report.levels if report else 0
        print(f"{communities} communities on {levels} level(s); writing every summary ...", flush=True)
        while await graph.work_once():
            pass
        depth_before, _ = await store.stale()

        print(f"timing {args.edits} edits ...", flush=True)
        doc_ids = list(docs)
        for i in range(args.edits):
            doc = synth.rng.choice(doc_ids)
            versions[doc] += 1
            extra = f"ERR_{docs[doc].upper()}_EDIT_{i:03d}" if synth.rng.random() < 0.3 else None
            item = MemoryItem(op="upsert", doc_id=doc, version=versions[doc], content=corpus.text(docs[doc], extra))
            timings.clear()
            t0 = time.perf_counter()
            await ingestor.apply([item])
            if not timings:
                result.note(f"edit {i}: the change hook did not run")
                continue
            took, h1, out = timings[-1]
            graph_s.append(took)
            e2e_s.append(h1 - t0)
            marked.append(len(out.marked))
            if out.marked:
                stale = await store.is_stale(out.marked)
                ok = all(stale.values())
                verified += ok
                unverified += not ok
            if args.pause_ms:
                await asyncio.sleep(args.pause_ms / 1000)
        depth_after, _ = await store.stale()
    finally:
        if ner is not None:
            ner.close()
        if embedder is not None:
            embedder.close()
        await client.aclose()

    g, e = summary_ms(graph_s), summary_ms(e2e_s)
    result.doc["data"] = {
        "communities": communities,
        "levels": levels,
        "stale_depth_before": depth_before,
        "stale_depth_after": depth_after,
        "graph_ms": {**g, "all": [round(x * 1000, 3) for x in graph_s]},
        "end_to_end_ms": {**e, "all": [round(x * 1000, 3) for x in e2e_s]},
        "marked_per_edit": marked,
        "marks_verified": verified,
        "marks_not_found": unverified,
    }
    result.figure("communities (all levels)", communities)
    result.figure("change -> marked stale, graph layer (prepare + apply) p50", g["p50_ms"], "ms")
    result.figure("change -> marked stale, graph layer (prepare + apply) p95", g["p95_ms"], "ms")
    result.figure("change -> marked stale, from Ingestor.apply p50", e["p50_ms"], "ms")
    result.figure("change -> marked stale, from Ingestor.apply p95", e["p95_ms"], "ms")
    avg_marked = sum(marked) / len(marked) if marked else 0.0
    result.figure("communities marked per edit (mean)", avg_marked)
    result.figure("edits whose marks were all found stale", f"{verified} of {verified + unverified}")
    result.note("no target is set for this benchmark; stale queue depth went from "
                f"{depth_before} to {depth_after}")  # fmt: skip
    plot(png_path(args.out, BENCH), graph_s, e2e_s)
    return result


def plot(path: Any, graph_s: list[float], e2e_s: list[float]) -> None:
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for values, label in ((graph_s, "graph layer (prepare + apply)"), (e2e_s, "from Ingestor.apply")):
        ms = sorted(v * 1000 for v in values)
        if ms:
            ax1.step(ms, [(i + 1) / len(ms) for i in range(len(ms))], where="post", label=label)
    ax1.axhline(0.95, color="grey", linestyle=":")
    ax1.set_xlabel("change -> marked stale (ms)")
    ax1.set_ylabel("fraction of edits")
    ax1.set_title("Latency CDF")
    ax1.legend()
    ax2.plot([v * 1000 for v in graph_s], marker=".", linewidth=0.8, label="graph layer")
    ax2.plot([v * 1000 for v in e2e_s], marker=".", linewidth=0.8, label="from Ingestor.apply")
    ax2.set_xlabel("edit #")
    ax2.set_ylabel("ms")
    ax2.set_title("Per edit")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=60, help="docs in the corpus (default 60)")
    parser.add_argument("--topics", type=int, default=12, help=f"topics (at most {len(TOPICS)})")
    parser.add_argument("--edits", type=int, default=100, help="timed edits (default 100)")
    parser.add_argument("--pause-ms", type=float, default=0.0, help="pause between edits")
    parser.add_argument("--seed", type=int, default=13)
    add_common_args(parser)
    args = parser.parse_args()
    args.topics = min(args.topics, len(TOPICS))
    run_benchmark(BENCH, args, main_async, kafka=False)


if __name__ == "__main__":
    main()
