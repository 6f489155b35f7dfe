"""Statistics of a run: percentiles in milliseconds, peak memory, CPU by role between two snapshots."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Sequence
from typing import Any


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation); NaN for no values."""
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else float("nan")


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/mean/max of durations given in seconds, in milliseconds."""
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 50), 3),
        "p95_ms": round(pct(ms, 95), 3),
        "p99_ms": round(pct(ms, 99), 3),
        "mean_ms": round(sum(ms) / len(ms), 3) if ms else float("nan"),
        "max_ms": round(max(ms), 3) if ms else float("nan"),
    }


def peak_rss_mb() -> float:
    """This process's peak resident set size so far (getrusage; KiB on Linux)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def pid_peak_rss_mb(pid: int | None) -> float:
    """Another live process's peak resident set size (VmHWM); 0 when unknown."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


def _role(proc: Any) -> str:
    """What a process of the benchmark's tree is, for CPU accounting."""
    try:
        cmd = " ".join(proc.cmdline())
    except Exception:
        return "other"
    if proc.pid == os.getpid():
        return "bench process (askers, daemon or handler)"
    if "redis-server" in cmd:
        return "redis"
    if "tansu" in cmd:
        return "tansu broker"
    if "multiprocessing" in cmd and "resource_tracker" not in cmd:
        return "embedding worker"
    return "other"


def cpu_snapshot() -> dict[str, Any]:
    """CPU seconds (user + system) used so far by this process and its descendants, by role,
    and by the whole machine (non-idle): a delta of two snapshots says what a phase cost."""
    import psutil

    me = psutil.Process()
    by_role: dict[str, float] = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        role = _role(proc)
        by_role[role] = by_role.get(role, 0.0) + t.user + t.system
    total = psutil.cpu_times()
    # Linux counts guest time inside user time, and steal is time the VM did not run at all.
    not_ours = ("idle", "iowait", "steal", "guest", "guest_nice")
    busy = sum(total) - sum(getattr(total, f, 0.0) for f in not_ours)
    return {"roles": by_role, "machine": busy, "at": time.perf_counter()}


def cpu_delta(before: dict[str, Any], after: dict[str, Any], queries: int) -> dict[str, Any]:
    """Core-milliseconds per query, per role and in total, between two snapshots (pure).

    A process that started between them (a restarted worker) counts from zero; with
    ``cores`` cores a closed loop of n askers cannot turn faster than n x total / cores.
    """
    roles = {r: after["roles"][r] - before["roles"].get(r, 0.0) for r in after["roles"]}
    per_q = {r: round(v * 1000 / max(queries, 1), 3) for r, v in sorted(roles.items())}
    tree = sum(roles.values())
    wall = after["at"] - before["at"]
    return {
        "core_ms_per_query": round(tree * 1000 / max(queries, 1), 3),
        "by_role_core_ms_per_query": per_q,
        "cores_busy_tree": round(tree / wall, 3) if wall > 0 else float("nan"),
        "cores_busy_machine": round((after["machine"] - before["machine"]) / wall, 3) if wall > 0 else float("nan"),
    }
