"""Query latency benchmark: request/reply round trips at 1, 4 and 16 concurrent askers.

Run from the project root:

    .venv/bin/python bench/latency.py                          # full size
    .venv/bin/python bench/latency.py --docs 50 --requests 40  # smoke
    .venv/bin/python bench/latency.py --depths 5,50            # by depth (top_k)

Setup: embedded Redis and tansu on free ports, a daemon in this process
(``daemon.app.start_daemon``), a few hundred small synthetic docs indexed (through the
daemon's own ``Ingestor``, to save time; queries then do real BM25 + HNSW work).

Measured, level by level (each level: the baseline first, then the daemon):

* the daemon: plain aiokafka askers (one producer, ``acks=all``, ``linger_ms=0``; one reply
  reader of a one-partition reply topic, ``fetch_max_wait_ms=--reply-wait-ms``, 5 by
  default) publish contract requests with
  ``reply_to`` and ``correlation_id`` headers and time each round trip; every query text is
  distinct, so the query-embedding cache never answers;
* (a) an empty FastStream handler on the same broker with the same settings (a
  ``KafkaBroker`` subscriber with ``fetch_max_wait_ms=5``, the daemon's worker count, that
  publishes a reply to ``reply_to`` at once, as ``consumers/routers.py`` does);
* (b) one query embedding (``embed_query`` on distinct texts, one at a time, no load);
* (c) for context, 16 distinct query embeddings asked at once (micro-batched as in the
  daemon), no other load: the embedding work alone of one round of 16 askers.

Targets at 16 askers: p50 <= 1.5 x (a + b) and p99 <= 3 x (a + b), where a is the empty
handler's p50 round trip at the same concurrency and b the p50 query embedding time; the
daemon's own CPU per query (the whole tree less the empty handler's, the embedding worker's
and Redis's) <= 1.0 core-ms.

``--depths 5,50`` measures depth instead (``latency_depth.json``): one daemon and index, 8
askers (``--depth-askers``), each depth asked in turn in ``--depth-rounds`` rounds (the order
reversed every other round), ``--requests`` per depth in all. Targets: CPU per query (the
whole tree) at each depth <= 1.3 x at the first, p50 <= 1.5 x.
Queries/s at saturation is the best closed-loop throughput over all levels (including the
``--saturation`` level). Nothing is asserted: misses are reported as MISSED.
"""

from __future__ import annotations

import argparse

from _latency_depth import DEPTH_BENCH, depths_async
from _latency_levels import BENCH, levels_async
from _run import add_common_args, run_benchmark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=300, help="small docs indexed before querying (default 300)")
    parser.add_argument("--requests", type=int, default=500, help="timed requests per level (default 500)")
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16], help="default 1,4,16"
    )
    parser.add_argument("--saturation", type=int, default=32, help="extra level for queries/s at saturation")
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--embed-samples", type=int, default=100)
    parser.add_argument("--graph", action="store_true", help="run the daemon with the graph layer on")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for one reply")
    parser.add_argument(
        "--reply-wait-ms",
        type=int,
        default=5,
        help="the askers' reply reader's fetch_max_wait_ms (default 5; tansu may hold a fetch for all of it)",
    )
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--depths",
        type=lambda s: [int(x) for x in s.split(",")],
        default=None,
        help="instead of the levels: these top_k values (e.g. 5,50) interleaved in one run; ratios to the first",
    )
    parser.add_argument("--depth-askers", type=int, default=8, help="concurrent askers of --depths (default 8)")
    parser.add_argument("--depth-rounds", type=int, default=6, help="rounds of --depths (default 6)")
    add_common_args(parser)
    args = parser.parse_args()
    if args.depths:
        run_benchmark(DEPTH_BENCH, args, depths_async, kafka=True, pass_servers=True)
    else:
        run_benchmark(BENCH, args, levels_async, kafka=True, pass_servers=True)


if __name__ == "__main__":
    main()
