"""The latency benchmark by depth (``--depths``): top_k values interleaved on one daemon and index."""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Callable
from typing import Any

from _latency_asker import Asker, closed_loop
from _latency_daemon import NAME, latency_settings, start_indexed
from _result import Result, png_path
from _servers import Servers
from _stats import summary_ms
from _synthetic_text import SyntheticText

from daemon.topics import ensure_topics

DEPTH_BENCH = "latency_depth"


def plot_depths(path: Any, rows: list[dict[str, Any]]) -> None:
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [f"top_k {r['top_k']}" for r in rows]
    xs = list(range(len(rows)))
    width = 0.25
    for i, q in enumerate(("p50", "p95", "p99")):
        ax1.bar([x + (i - 1) * width for x in xs], [r[f"{q}_ms"] for r in rows], width, label=q)
    ax1.set_xticks(xs, labels)
    ax1.set_ylabel("round trip (ms)")
    ax1.set_title(f"Round trip by depth at {rows[0]['concurrency']} askers (interleaved)")
    ax1.legend()
    bottom = [0.0] * len(rows)
    for role in sorted({k for r in rows for k in r["by_role_core_ms_per_query"]}):
        values = [r["by_role_core_ms_per_query"].get(role, 0.0) for r in rows]
        ax2.bar(xs, values, 0.5, bottom=bottom, label=role)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax2.set_xticks(xs, labels)
    ax2.set_ylabel("core-ms per query (whole process tree)")
    ax2.set_title("CPU per query by process")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def depths_async(args: argparse.Namespace, servers: Servers) -> Result:
    """``--depths``: the same daemon and index asked for each depth (top_k) in turn, in rounds
    whose order alternates, so that the drift of a shared machine falls on every depth alike;
    the first depth is the base of the ratios."""
    name = NAME
    settings = latency_settings(servers, args.graph)
    depths = args.depths
    per_round = max(1, args.requests // args.depth_rounds)
    result = Result(
        DEPTH_BENCH,
        "Query latency and CPU by result depth (top_k), interleaved in one run",
        {
            "docs": args.docs,
            "depths": depths,
            "askers": args.depth_askers,
            "rounds": args.depth_rounds,
            "requests_per_round_and_depth": per_round,
            "graph": args.graph,
            "query_workers": settings.consumer.query_workers,
            "fetch_multiplier": settings.retrieval.fetch_multiplier,
        },
        smoke=args.docs < 300 or args.requests < 500,
    )
    synth = SyntheticText(seed=args.seed)
    await ensure_topics(servers.kafka_bootstrap, [f"{name}.my-replies"], partitions=1, replication=1)

    def body_of(top_k: int) -> Callable[[], bytes]:
        def body() -> bytes:
            # distinct text every time: the daemon's query-embedding cache never answers
            text = synth.query(synth.rng.randint(3, 8))
            return json.dumps({"query_id": f"q_{uuid.uuid4().hex[:12]}", "search_text": text, "top_k": top_k}).encode()

        return body

    daemon, chunks = await start_indexed(settings, synth, args.docs)
    samples: dict[int, list[float]] = {d: [] for d in depths}
    runs: dict[int, list[dict[str, Any]]] = {d: [] for d in depths}
    asker = Asker(servers.kafka_bootstrap, settings.topics.requests, f"{name}.my-replies", args.reply_wait_ms)
    try:
        await asker.start()
        sizes: dict[int, float] = {}
        for d in depths:  # warm-up, and what a reply weighs at this depth
            await closed_loop(asker, body_of(d), args.depth_askers, args.depth_askers * 4, 2, args.timeout)
            _, reply = await asker.ask(body_of(d)(), args.timeout)
            sizes[d] = len(reply or b"")
        for r in range(args.depth_rounds):
            for d in depths if r % 2 == 0 else depths[::-1]:
                run = await closed_loop(
                    asker, body_of(d), args.depth_askers, per_round, 0, args.timeout, sink=samples[d]
                )
                runs[d].append(run)
                print(
                    f"round {r + 1}/{args.depth_rounds} top_k {d:>3}: p50 {run['p50_ms']:.1f} ms, {run['qps']} q/s, "
                    f"{run['cpu']['core_ms_per_query']} core-ms/query",
                    flush=True,
                )
    finally:
        await asker.stop()
        await daemon.stop()

    rows: list[dict[str, Any]] = []
    for d in depths:
        done = len(samples[d])
        # Each run's CPU per query times its answered queries (what cpu_delta divided by).
        tree = 0.0
        roles: dict[str, float] = {}
        for run in runs[d]:
            n = run["requests"] - run["timeouts"]
            tree += run["cpu"]["core_ms_per_query"] * n
            for role, v in run["cpu"]["by_role_core_ms_per_query"].items():
                roles[role] = roles.get(role, 0.0) + v * n
        wall = sum(run["wall_s"] for run in runs[d])
        rows.append(
            {
                "top_k": d,
                "concurrency": args.depth_askers,
                **summary_ms(samples[d]),
                "qps": round(done / wall, 2) if wall else float("nan"),
                "core_ms_per_query": round(tree / max(done, 1), 3),
                "by_role_core_ms_per_query": {k: round(v / max(done, 1), 3) for k, v in sorted(roles.items())},
                "reply_bytes": sizes[d],
                "errors": sum(run["errors"] for run in runs[d]),
                "timeouts": sum(run["timeouts"] for run in runs[d]),
                "runs": runs[d],
            }
        )
    result.doc["data"] = {"chunks_indexed": chunks, "rows": rows}
    for row in rows:
        d = row["top_k"]
        trio = f"{row['p50_ms']:.1f} / {row['p95_ms']:.1f} / {row['p99_ms']:.1f}"
        result.figure(f"round trip p50 / p95 / p99 at top_k {d}, {args.depth_askers} askers", trio, "ms")
        result.figure(f"queries/s at top_k {d}, {args.depth_askers} askers", row["qps"], "q/s")
        result.figure(f"CPU per query at top_k {d}, whole process tree", row["core_ms_per_query"], "core-ms")
        result.figure(
            f"CPU per query at top_k {d} by process",
            ", ".join(f"{r} {v:.2f}" for r, v in row["by_role_core_ms_per_query"].items()),
            "core-ms",
        )
        result.figure(f"reply size at top_k {d}", row["reply_bytes"], "bytes")
        if row["errors"] or row["timeouts"]:
            result.note(f"top_k {d}: {row['errors']} error replies, {row['timeouts']} timeouts")
    base = rows[0]
    for row in rows[1:]:
        d, b = row["top_k"], base["top_k"]
        result.target(
            f"CPU per query at top_k {d} <= 1.3 x at top_k {b} (whole tree, {args.depth_askers} askers)",
            row["core_ms_per_query"] / base["core_ms_per_query"], "<=", 1.3, "x",
            expr=f"{row['core_ms_per_query']:.2f} / {base['core_ms_per_query']:.2f} core-ms",
        )  # fmt: skip
        result.target(
            f"p50 at top_k {d} <= 1.5 x at top_k {b} ({args.depth_askers} askers)",
            row["p50_ms"] / base["p50_ms"], "<=", 1.5, "x",
            expr=f"{row['p50_ms']:.1f} / {base['p50_ms']:.1f} ms",
        )  # fmt: skip
    result.note(
        f"one daemon and index ({chunks} chunks); each of {args.depth_rounds} rounds asks every depth in turn "
        f"({per_round} requests each, the order reversed every other round); figures pool the rounds; CPU is the "
        "whole process tree (askers and daemon in this process, the embedding worker, Redis, tansu)"
    )
    plot_depths(png_path(args.out, DEPTH_BENCH), rows)
    return result
