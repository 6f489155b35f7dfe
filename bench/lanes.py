"""Small writes while a large document, or a bulk load, is applied: with lanes and without.

Run from the project root:

    .venv/bin/python bench/lanes.py              # a 512 KiB document, then 64 documents of 8 KiB
    .venv/bin/python bench/lanes.py --kib 1024 --bulk 128

Path: embedded tansu and Redis on free ports, a daemon in this process
(``daemon.app.start_daemon``, graph layer off, 4 partitions), one ``consumers.MemoryClient``.
Each scenario and mode in turn, in one run, each in its own namespace:

- **one large document**: it is published (waited for in the background), and once the daemon
  holds it (1 s later) small documents are published one a second (``--every-s``), every
  other one keyed to the large document's own partition, the rest to the other partitions;
- **a bulk load**: ``--bulk`` documents of ``--bulk-kib`` each are published at once (as
  ``agentmemd publish doc DIR`` does, over every partition), then the small documents, keyed
  round the partitions.

Each small write is waited for (``wait=True``: acked once searchable) and timed from its own
publish. Modes: the defaults (lanes on) and ``consumer.ingest_lanes = 0`` (each batch applied
before the next poll, as before lanes).

No target: the figures say how long a small write waited, where, and how long the large
document or the load took, in each mode.
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
SCENARIOS = ("one large", "bulk load")
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


async def one_mode(args: argparse.Namespace, servers: Servers, mode: str, scenario: str) -> dict[str, Any]:
    from consumers.client import MemoryClient
    from consumers.config import ConsumerConfig
    from daemon.app import start_daemon
    from daemon.settings import namespaced
    from graph.config import GraphConfig

    name = f"bench_lanes_{scenario.split()[-1]}_{mode.replace(' ', '_')}_{uuid.uuid4().hex[:6]}"
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
    same: list[float] = []
    other: list[float] = []
    chunks = 0
    big_done_at = 0.0
    try:
        await client.start()
        warm = await client.publish_document("warm.md", "Warm the path.", wait=True)
        assert warm.ack is not None
        if scenario == "one large":
            loads = {"big.md": long_text(args.kib, seed=1)}
        else:
            loads = {f"bulk/{i}.md": long_text(args.bulk_kib, seed=100 + i) for i in range(args.bulk)}
        big_parts = {partition_of(d) for d in loads}
        t0 = time.perf_counter()

        async def timed_big(doc: str, text: str) -> tuple[Any, float]:
            receipt = await client.publish_document(doc, text, wait=True)
            return receipt, time.perf_counter() - t0  # from the first publish

        big = [asyncio.create_task(timed_big(d, t)) for d, t in loads.items()]
        await asyncio.sleep(1.0)
        ids = [f"small-{i}.md" for i in range(10_000)]
        if scenario == "one large":
            here = [d for d in ids if partition_of(d) in big_parts]
            there = [d for d in ids if partition_of(d) not in big_parts]
            smalls = [d for pair in zip(here, there, strict=False) for d in pair][: args.small]
        else:
            by_part = [[d for d in ids if partition_of(d) == p] for p in range(PARTITIONS)]
            smalls = [by_part[i % PARTITIONS][i // PARTITIONS] for i in range(args.small)]

        async def one(i: int, doc: str) -> float:
            s0 = time.perf_counter()
            receipt = await client.publish_document(
                doc, f"Note {i}: the vacuum of ledger_{i} runs at night.", wait=True
            )
            assert receipt.ack is not None and receipt.ack.status == "indexed", receipt.ack
            return time.perf_counter() - s0

        tasks = []
        for i, doc in enumerate(smalls):
            tasks.append(asyncio.create_task(one(i, doc)))
            await asyncio.sleep(args.every_s)
        waited = list(await asyncio.gather(*tasks))
        for doc, s in zip(smalls, waited, strict=True):
            (same if partition_of(doc) in big_parts else other).append(s)
        for receipt, at in await asyncio.gather(*big):
            assert receipt.ack is not None and receipt.ack.status == "indexed", receipt.ack
            chunks += receipt.ack.chunks
            big_done_at = max(big_done_at, at)
    finally:
        await client.close()
        await daemon.stop()
    return {
        "same_partition_s": same,
        "other_partitions_s": other,
        "small_s": same + other,
        "small_ms": summary_ms(same + other),
        "large_acked_s": big_done_at,
        "large_chunks": chunks,
    }


async def main_async(args: argparse.Namespace, servers: Servers) -> Result:
    result = Result(
        BENCH,
        "Small writes beside a large document and beside a bulk load: lanes on and off",
        {"kib": args.kib, "bulk": args.bulk, "bulk_kib": args.bulk_kib, "small": args.small, "partitions": PARTITIONS},
    )
    data: dict[str, Any] = {}
    for scenario in SCENARIOS:
        for mode in ("lanes", "no lanes"):
            key = f"{scenario}, {mode}"
            data[key] = d = await one_mode(args, servers, mode, scenario)
            if scenario == "one large":
                for where in ("same_partition", "other_partitions"):
                    xs = d[f"{where}_s"]
                    if xs:
                        said = where.replace("_", " ")
                        result.figure(f"{key}: small write on the {said}, p50", summary_ms(xs)["p50_ms"], "ms")
            result.figure(f"{key}: small write, p50", d["small_ms"]["p50_ms"], "ms")
            result.figure(f"{key}: small write, max", max(d["small_s"]) * 1000, "ms")
            result.figure(f"{key}: large documents acked after", d["large_acked_s"], "s")
        on, off = data[f"{scenario}, lanes"], data[f"{scenario}, no lanes"]
        result.figure(
            f"{scenario}: small write p50, no lanes / lanes", off["small_ms"]["p50_ms"] / on["small_ms"]["p50_ms"], "x"
        )
        result.figure(
            f"{scenario}: large documents' time, lanes / no lanes", on["large_acked_s"] / off["large_acked_s"], "x"
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
    ax.set_xticks(range(1, len(modes) + 1), [m.replace(", ", "\n") for m in modes], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("s, publish to ack")
    ax.set_title("Small writes beside a large document or a bulk load")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kib", type=int, default=512, help="the large document's size")
    parser.add_argument("--bulk", type=int, default=64, help="documents in the bulk load")
    parser.add_argument("--bulk-kib", type=int, default=8, help="each bulk document's size")
    parser.add_argument("--small", type=int, default=8, help="small writes")
    parser.add_argument("--every-s", type=float, default=1.0, help="seconds between the small writes' publishes")
    add_common_args(parser)
    run_benchmark(BENCH, parser.parse_args(), main_async, kafka=True, pass_servers=True)


if __name__ == "__main__":
    main()
