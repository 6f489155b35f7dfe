"""The daemon the latency benchmark asks: in this process, over a fresh index of synthetic docs."""

from __future__ import annotations

from typing import Any

from _synthetic_text import SyntheticText

from daemon.app import start_daemon
from daemon.settings import Settings, namespaced
from graph.config import GraphConfig
from memory.records import MemoryItem

#: The namespace of the benchmark's topics and index (both modes share it).
NAME = "bench_latency"


def latency_settings(servers: Any, graph: bool) -> Settings:
    """The daemon's settings for either mode: its defaults on these servers, under :data:`NAME`."""
    return namespaced(
        NAME, kafka_bootstrap=servers.kafka_bootstrap, redis_url=servers.redis_url, graph=GraphConfig(enabled=graph)
    )


async def start_indexed(settings: Any, synth: SyntheticText, docs: int) -> tuple[Any, int]:
    """A daemon in this process over a fresh index of ``docs`` synthetic docs; (daemon, chunks)."""
    print("starting daemon ...", flush=True)
    daemon = await start_daemon(settings)
    try:
        await daemon.index.drop()
        await daemon.index.ensure()
        items = [
            MemoryItem(
                op="upsert",
                doc_id=f"lat/doc-{i:05d}",
                version=1,
                content=synth.paragraph(synth.rng.randint(40, 120)),
                source=f"lat/doc-{i:05d}",
                tags={"service": "bench-service", "environment": "bench"},
            )
            for i in range(docs)
        ]
        print(f"indexing {len(items)} docs through the daemon's Ingestor ...", flush=True)
        for i in range(0, len(items), 64):
            await daemon.ingestor.apply(items[i : i + 64])
        chunks = await daemon.index.count()
        print(f"{chunks} chunks indexed", flush=True)
    except BaseException:
        await daemon.stop()
        raise
    return daemon, chunks
