"""Where an edit's time goes, event to ack: each ingestion phase of edits of one document.

Run from the project root (a profile, not a target: nothing goes to bench/results):

    .venv/bin/python bench/edits_phases.py                 # 20 edits of a 50-paragraph doc
    .venv/bin/python bench/edits_phases.py --sizes 50,200 --edits 10

One daemon with the defaults (graph on), the documents and edits of ``bench/edits.py``. Each
phase is timed by wrapping the method that does it (wall time, summed per edit): chunking
(``Ingestor._chunk_all``: tokenizer and chunker), the vector lookup
(``ChunkIndex.stored_vectors``), the model (``ChunkVectors.embed``), the graph's extraction
(``Ingestor._prepare``, beside the embedding), the chunk write (``ChunkIndex.apply``), the
graph's write (``GraphService.apply``) and the acks. ``total`` is the client's publish to its
ack; what ``ingestor.apply`` does not cover is the broker, the poll and the ack's way back.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import edits
from _run import quiet_logs
from _servers import embedded_servers

PHASES: dict[str, list[float]] = collections.defaultdict(list)
_current: dict[str, float] = {}


def timed(owner: Any, name: str, label: str) -> None:
    """Replace ``owner.name`` (an async method) with one that adds its wall time to ``label``."""
    inner: Callable[..., Awaitable[Any]] = getattr(owner, name)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await inner(*args, **kwargs)
        finally:
            _current[label] = _current.get(label, 0.0) + time.perf_counter() - t0

    setattr(owner, name, wrapper)


async def main_async(args: argparse.Namespace, servers: Any) -> None:
    from consumers.client import MemoryClient
    from consumers.ingestion import Ingestion
    from daemon.app import start_daemon
    from daemon.settings import namespaced
    from graph.service import GraphService
    from memory.chunk_vectors import ChunkVectors
    from memory.index import ChunkIndex
    from memory.ingest import Ingestor

    for owner, name, label in (
        (Ingestor, "apply", "ingestor.apply"),
        (Ingestor, "_chunk_all", "chunk"),
        (Ingestor, "_prepare", "graph.prepare"),
        (ChunkVectors, "embed", "embed"),
        (Ingestor, "_embed_and_prepare", "embed_and_prepare"),
        (ChunkIndex, "versions", "versions"),
        (ChunkIndex, "stored_vectors", "reuse_lookup"),
        (ChunkIndex, "apply", "index.apply"),
        (GraphService, "apply", "graph.apply"),
        (Ingestion, "_send_acks", "send_acks"),
    ):
        timed(owner, name, label)
    settings = namespaced(
        f"bench_phases_{uuid.uuid4().hex[:6]}", kafka_bootstrap=servers.kafka_bootstrap, redis_url=servers.redis_url
    )
    daemon = await start_daemon(settings)
    client = MemoryClient(bootstrap=servers.kafka_bootstrap, topics=settings.topics, timeout_s=300)
    await client.start()
    arm = edits.Arm("stable", daemon, client, settings.topics.documents, (None, None))
    try:
        for size in args.sizes:
            doc = edits.runbook(random.Random(args.seed + size), size)
            doc_id = f"runbooks/size-{size}.md"
            await client.publish_document(doc_id, doc.text(), version=1, wait=True)
            rng = random.Random(args.seed * 7 + size)
            for n in range(args.edits):
                kind = edits.KINDS[n % len(edits.KINDS)]
                doc, _removed = edits.edit(doc, kind, rng, f"mk{size}x{n}")
                await edits.settle([arm])
                _current.clear()
                t0 = time.perf_counter()
                await client.publish_document(doc_id, doc.text(), version=n + 2, wait=True)
                PHASES[f"{size}: total"].append(time.perf_counter() - t0)
                for label, took in _current.items():
                    PHASES[f"{size}: {label}"].append(took)
    finally:
        await client.close()
        await daemon.stop()
    for label in sorted(PHASES):
        v = sorted(PHASES[label])
        print(
            f"{label:28s} mean {statistics.mean(v) * 1000:7.1f}  p50 {v[len(v) // 2] * 1000:7.1f}  "
            f"max {v[-1] * 1000:7.1f} ms  ({len(v)} edits)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="50", help="body paragraphs per document, comma-separated")
    parser.add_argument("--edits", type=int, default=20, help="edits per document size (kinds cycled)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    quiet_logs()
    with embedded_servers(kafka=True, appendonly=True) as servers:
        asyncio.run(main_async(args, servers))


if __name__ == "__main__":
    main()
