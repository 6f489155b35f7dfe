"""Write acknowledgements: how long a write an agent waits for takes, against a query round trip.

Run from the project root:

    .venv/bin/python bench/acks.py            # 100 rounds
    .venv/bin/python bench/acks.py --rounds 20

Path: embedded tansu and Redis on free ports, a daemon with its default settings in this process
(``daemon.app.start_daemon``, graph layer off), one ``consumers.MemoryClient`` (one host). Each
round, interleaved in one run: ``publish_observation(..., wait=True)`` of a new turn (what the MCP
``remember`` tool does: publish, then the daemon's ack once the turn is searchable), then a query
of that turn's words, filtered to its agent (top_k 10), which must find it (read-your-writes).

Target (issue 23): p50 of the waited-for write <= 2 x p50 of one query round trip, same run.
Nothing is asserted: a miss is reported as MISSED.
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from _result import Result, png_path
from _run import add_common_args, run_benchmark
from _servers import Servers
from _stats import summary_ms

BENCH = "acks"
WORDS = ["ledger", "quota", "heron", "lock", "retry", "bucket", "shard", "token", "beta", "invoice"]


async def main_async(args: argparse.Namespace, servers: Servers) -> Result:
    from consumers.client import MemoryClient
    from daemon.app import start_daemon
    from daemon.settings import namespaced
    from graph.config import GraphConfig

    result = Result(BENCH, "Write acknowledgements: a waited-for write vs a query", {"rounds": args.rounds})
    settings = namespaced(
        "bench_acks",
        kafka_bootstrap=servers.kafka_bootstrap,
        redis_url=servers.redis_url,
        graph=GraphConfig(enabled=False),
    )
    daemon = await start_daemon(settings)
    client = MemoryClient(bootstrap=servers.kafka_bootstrap, topics=settings.topics, timeout_s=60)
    writes: list[float] = []
    queries: list[float] = []
    missed = 0
    try:
        await client.start()
        agent = f"bench-{uuid.uuid4().hex[:6]}"
        for n in range(args.rounds + 5):  # the first five warm the path and are not counted
            code = f"{WORDS[n % len(WORDS)]}_{n:04d}"
            t0 = time.perf_counter()
            receipt = await client.publish_observation(
                agent_id=agent, session_id="s1", turn=n, content=f"We set {code} after the incident.", wait=True
            )
            t1 = time.perf_counter()
            reply = await client.query(code, top_k=10, metadata_filter={"agent_id": agent})
            t2 = time.perf_counter()
            if n < 5:
                continue
            assert receipt.ack is not None
            writes.append(t1 - t0)
            queries.append(t2 - t1)
            missed += receipt.doc_id not in [r.doc_id for r in reply.results]
    finally:
        await client.close()
        await daemon.stop()
    w, q = summary_ms(writes), summary_ms(queries)
    result.figure("waited-for write p50", w["p50_ms"], "ms")
    result.figure("waited-for write p95", w["p95_ms"], "ms")
    result.figure("query round trip p50", q["p50_ms"], "ms")
    result.figure("query round trip p95", q["p95_ms"], "ms")
    result.figure("queries right after the ack that missed the write", missed)
    result.target("write p50 / query p50", w["p50_ms"] / q["p50_ms"], "<=", 2.0, "x", "same run, interleaved")
    result.target("read-your-writes misses", float(missed), "<=", 0.0)
    result.doc["data"] = {"write_ms": w, "query_ms": q}
    plot(png_path(args.out, BENCH), writes, queries)
    return result


def plot(path: Any, writes: list[float], queries: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.boxplot([[x * 1000 for x in writes], [x * 1000 for x in queries]])
    ax.set_xticks([1, 2], ["write, wait=True", "query"])
    ax.set_ylabel("ms")
    ax.set_title("A waited-for write vs a query round trip (1 host)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=100)
    add_common_args(parser)
    run_benchmark(BENCH, parser.parse_args(), main_async, kafka=True, pass_servers=True)


if __name__ == "__main__":
    main()
