"""Small writes on other partitions while a large document is applied: with lanes and without.

Run from the project root:

    .venv/bin/python bench/lanes.py              # a 512 KiB document, 8 small writes, one a second
    .venv/bin/python bench/lanes.py --kib 1024

Path: embedded tansu and Redis on free ports, a daemon in this process
(``daemon.app.start_daemon``, graph layer off, 4 partitions), one ``consumers.MemoryClient``.
Each mode in turn, in one run, in its own namespace: a large document is published (waited
for in the background), and once the daemon holds it (1 s later), small documents, each keyed
to another partition than the large one, are published one a second (``--every-s``), each
waited for (``wait=True``: acked once searchable) and timed from its own publish. Modes: the defaults (lanes on) and
``consumer.ingest_lanes = 0`` (each batch applied before the next poll, as before lanes).

No target: the figures say how long a small write waited, and how long the large document
took, in each mode.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import uuid
from typing import Any

from _result import Result, png_path
from _run import add_common_args, run_benchmark
from _servers import Servers
from _stats import summary_ms

BENCH = "lanes"
PARTITIONS = 4
WORDS = (
    "ledger lock timeout replica shard quorum backlog cursor vacuum index snapshot rollback latency "
    "throughput partition consumer offset retention compaction heartbeat lease fencing token"
).split()


def long_text(kib: int, seed: int) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    size = n = 0
    while size < kib * 1024:
        s = f"Step {n}: the {' '.join(rng.choices(WORDS, k=14))}."
        out.append(s + ("\n\n" if n % 6 == 5 else " "))
        size += len(s) + 1
        n += 1
    return "".join(out)


def partition_of(key: str) -> int:
    from aiokafka.partitioner import DefaultPartitioner

    parts = list(range(PARTITIONS))
    return int(DefaultPartitioner()(key.encode(), parts, parts))


async def one_mode(args: argparse.Namespace, servers: Servers, mode: str) -> dict[str, Any]:
    from consumers.client import MemoryClient
    from consumers.config import ConsumerConfig
    from daemon.app import start_daemon
    from daemon.settings import namespaced
    from graph.config import GraphConfig

    name = f"bench_lanes_{mode.replace(' ', '_')}_{uuid.uuid4().hex[:6]}"
    consumer = ConsumerConfig(group_id=name, ingest_lanes=4 if mode == "lanes" else 0)
    settings = namespaced(
        name,
        kafka_bootstrap=servers.kafka_bootstrap,
        redis_url=servers.redis_url,
        graph=GraphConfig(enabled=False),
        topic_partitions=PARTITIONS,
        consumer=consumer,
    )
    daemon = await start_daemon(settings)
    client = MemoryClient(bootstrap=servers.kafka_bootstrap, topics=settings.topics, timeout_s=900)
    small: list[float] = []
    chunks: int | None = None
    big_done_at = 0.0
    try:
        await client.start()
        warm = await client.publish_document("warm.md", "Warm the path.", wait=True)
        assert warm.ack is not None
        big_id = "big.md"
        big_part = partition_of(big_id)
        text = long_text(args.kib, seed=1)
        t0 = time.perf_counter()

        async def timed_big() -> tuple[Any, float]:
            receipt = await client.publish_document(big_id, text, wait=True)
            return receipt, time.perf_counter() - t0  # from its publish

        big = asyncio.create_task(timed_big())
        await asyncio.sleep(1.0)
        ids = (f"small-{i}.md" for i in range(10_000))
        others = [d for d in ids if partition_of(d) != big_part][: args.small]

        async def one(i: int, doc: str) -> float:
            s0 = time.perf_counter()
            receipt = await client.publish_document(
                doc, f"Note {i}: the vacuum of ledger_{i} runs at night.", wait=True
            )
            assert receipt.ack is not None and receipt.ack.status == "indexed", receipt.ack
            return time.perf_counter() - s0

        tasks = []
        for i, doc in enumerate(others):
            tasks.append(asyncio.create_task(one(i, doc)))
            await asyncio.sleep(args.every_s)
        small = list(await asyncio.gather(*tasks))
        receipt, big_done_at = await big
        assert receipt.ack is not None and receipt.ack.status == "indexed", receipt.ack
        chunks = receipt.ack.chunks
    finally:
        await client.close()
        await daemon.stop()
    return {
        "small_ms": summary_ms(small),
        "small_s": small,
        "large_acked_s": big_done_at,
        "large_chunks": chunks,
    }


async def main_async(args: argparse.Namespace, servers: Servers) -> Result:
    result = Result(
        BENCH,
        "Small writes on other partitions behind a large document: lanes on and off",
        {"kib": args.kib, "small": args.small, "partitions": PARTITIONS},
    )
    data: dict[str, Any] = {}
    for mode in ("lanes", "no lanes"):
        data[mode] = await one_mode(args, servers, mode)
        d = data[mode]
        result.figure(f"{mode}: small write, p50", d["small_ms"]["p50_ms"], "ms")
        result.figure(f"{mode}: small write, max", max(d["small_s"]) * 1000, "ms")
        result.figure(f"{mode}: large document acked after", d["large_acked_s"], "s")
    result.figure(
        "small write p50, no lanes / lanes",
        data["no lanes"]["small_ms"]["p50_ms"] / data["lanes"]["small_ms"]["p50_ms"],
        "x",
    )
    result.figure(
        "large document's time, lanes / no lanes",
        data["lanes"]["large_acked_s"] / data["no lanes"]["large_acked_s"],
        "x",
    )
    result.doc["data"] = data
    plot(png_path(args.out, BENCH), data)
    return result


def plot(path: Any, data: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    modes = list(data)
    ax.boxplot([[x for x in data[m]["small_s"]] for m in modes])
    ax.set_xticks(range(1, len(modes) + 1), modes)
    ax.set_yscale("log")
    ax.set_ylabel("s, publish to ack")
    ax.set_title("Small writes behind a large document on another partition")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kib", type=int, default=512, help="the large document's size")
    parser.add_argument("--small", type=int, default=8, help="small writes")
    parser.add_argument("--every-s", type=float, default=1.0, help="seconds between the small writes' publishes")
    add_common_args(parser)
    run_benchmark(BENCH, parser.parse_args(), main_async, kafka=True, pass_servers=True)


if __name__ == "__main__":
    main()
