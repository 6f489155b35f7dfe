"""An idle daemon and an idle client on tansu: CPU with and without the idle backoff, and what
the first question after a pause pays for it.

Run from the project root:

    .venv/bin/python bench/idle.py                 # 30 s windows, 8 pauses
    .venv/bin/python bench/idle.py --window 10 --pauses 3

Path: embedded tansu and Redis on free ports; ``agentmemd run`` in its own process (as it is
deployed, graph layer off) with ``idle_after_s`` 5 so a run takes minutes, not hours; one
``consumers.MemoryClient`` in this process that has asked once and published once (with
``wait``), then sits idle. Two phases on the same servers, one after the other:

* **before**: the daemon with the backoff off (``idle_fetch_max_wait_ms`` 0: every subscriber
  keeps its own 5 or 20 ms wait) and a client whose reply reader is never paused
  (``reply_idle_pause_s`` 0, as the client was before);
* **after**: the defaults (idle wait 100 ms; the client's reader paused after 5 s, moved to the
  end of its partitions when the next question is sent).

Each phase: past ``idle_after_s``, CPU seconds of the daemon (with its embedding worker),
tansu, Redis and this process (the client) over one window, as cores. Then, in the after
phase, ``--pauses`` times: a pause past ``idle_after_s``, one question timed (the first after
the pause), then 20 questions back to back (their p50 is the same run's steady state).

Nothing is asserted and no target is set: the figures are what was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from _result import Result, png_path
from _run import add_common_args, run_benchmark
from _servers import Servers, start_agentmemd, stop_process
from _stats import summary_ms

BENCH = "idle"
IDLE_AFTER_S = 5.0
DOC = "The billing pool resets with ERR_CONN_RESET_4F2A when pgbouncer restarts."


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds so far of each named process; the daemon's with its children
    (its embedding worker), never this process's (the servers and the daemon are its children)."""
    import psutil

    out: dict[str, float] = {}
    for name, pid in pids.items():
        total = 0.0
        try:
            proc = psutil.Process(pid)
            for p in [proc, *(proc.children(recursive=True) if pid != os.getpid() else ())]:
                times = p.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            pass
        out[name] = total
    return out


async def phase(args: argparse.Namespace, servers: Servers, tmp: Path, *, before: bool) -> dict[str, Any]:
    from consumers.client import MemoryClient
    from daemon.settings import Settings

    settings = Settings(kafka_bootstrap=servers.kafka_bootstrap, redis_url=servers.redis_url)
    idle_wait_ms = 0 if before else settings.consumer.idle_fetch_max_wait_ms
    env = {
        "AGENTMEM_CONSUMER__IDLE_AFTER_S": str(IDLE_AFTER_S),
        "AGENTMEM_CONSUMER__IDLE_FETCH_MAX_WAIT_MS": str(idle_wait_ms),
    }
    proc = await start_agentmemd(servers, tmp / f"agentmemd-{idle_wait_ms}.log", env)
    # Before: a reader that is never paused, as the client's was.
    pause = {"reply_idle_pause_s": 0.0} if before else {}
    client = MemoryClient(bootstrap=servers.kafka_bootstrap, topics=settings.topics, timeout_s=60, **pause)
    out: dict[str, Any] = {}
    try:
        await client.start()
        await client.publish_document("runbooks/billing.md", DOC, version=1, wait=True)
        await client.query("ERR_CONN_RESET_4F2A", top_k=3)
        await asyncio.sleep(IDLE_AFTER_S + 3)
        pids = {"daemon (and its embedding worker)": proc.pid, "bench process (the client)": os.getpid()}
        pids.update({"tansu": servers.procs[1].proc.pid, "redis": servers.procs[0].proc.pid})
        a, t0 = cpu_seconds(pids), time.perf_counter()
        await asyncio.sleep(args.window)
        b, t1 = cpu_seconds(pids), time.perf_counter()
        # The bench process's own share is the client's: nothing else runs in it meanwhile.
        out["idle_cores"] = {k: round((b[k] - a[k]) / (t1 - t0), 4) for k in pids}
        out["idle_cores_total"] = round(sum(out["idle_cores"].values()), 4)
        if not before:
            first, steady = [], []
            for _ in range(args.pauses):
                await asyncio.sleep(IDLE_AFTER_S + 2)
                s = time.perf_counter()
                await client.query("pgbouncer restarts", top_k=3)
                first.append(time.perf_counter() - s)
                for _ in range(20):
                    s = time.perf_counter()
                    await client.query("pgbouncer restarts", top_k=3)
                    steady.append(time.perf_counter() - s)
            out["first_after_pause_ms"] = summary_ms(first)
            out["first_after_pause_ms"]["max_ms"] = round(max(first) * 1000, 2)
            out["steady_ms"] = summary_ms(steady)
    finally:
        await client.close()
        stop_process(proc)
    return out


async def main_async(args: argparse.Namespace, servers: Servers) -> Result:
    result = Result(
        BENCH,
        "Idle CPU on tansu with and without the idle backoff; the first question after a pause",
        {"window_s": args.window, "pauses": args.pauses, "idle_after_s": IDLE_AFTER_S},
    )
    with tempfile.TemporaryDirectory() as tmp:
        before = await phase(args, servers, Path(tmp), before=True)
        after = await phase(args, servers, Path(tmp), before=False)
    for name, data in (("before", before), ("after", after)):
        result.figure(f"idle cores, all processes, {name}", data["idle_cores_total"], "cores")
        for proc, cores in data["idle_cores"].items():
            result.figure(f"idle cores, {proc}, {name}", cores, "cores")
    result.figure("idle cores after / before", after["idle_cores_total"] / max(before["idle_cores_total"], 1e-9), "x")
    first, steady = after["first_after_pause_ms"], after["steady_ms"]
    result.figure("first question after a pause, p50 / max", f"{first['p50_ms']:.1f} / {first['max_ms']:.1f}", "ms")
    result.figure("questions back to back, p50", steady["p50_ms"], "ms")
    result.doc["notes"].append(
        "before: idle_fetch_max_wait_ms 0 and reply_idle_pause_s 0 (a client reading all the time); "
        "after: the defaults "
        f"(idle_after_s {IDLE_AFTER_S:g} here, 30 by default)"
    )
    result.doc["data"] = {"before": before, "after": after}
    plot(png_path(args.out, BENCH), before, after)
    return result


def plot(path: Any, before: dict[str, Any], after: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(before["idle_cores"])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [before["idle_cores"][n] for n in names], width=0.4, label="before")
    ax.bar([i + 0.2 for i in x], [after["idle_cores"][n] for n in names], width=0.4, label="after")
    ax.set_xticks(list(x), [n.split(" (")[0] for n in names])
    ax.set_ylabel("cores, idle")
    ax.set_title("Idle CPU on tansu, with and without the idle backoff")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=30.0, help="seconds of idle CPU measured per phase")
    parser.add_argument("--pauses", type=int, default=8, help="pauses, each followed by one timed question")
    add_common_args(parser)
    run_benchmark(BENCH, parser.parse_args(), main_async, kafka=True, pass_servers=True)


if __name__ == "__main__":
    main()
