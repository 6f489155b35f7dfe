"""The peers' result: the plot, and the figures and targets in the JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _peer_system import TOP_K
from _result import Result


def plot(path: Path, systems: dict[str, dict[str, Any]]) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    labels, nd, rc, colors = [], [], [], []
    palette = {"agentmemd": "#1f77b4", "AMS": "#d62728", "mem0": "#2ca02c"}
    for name, data in systems.items():
        for mode, row in data.get("modes", {}).items():
            labels.append(f"{name}\n{mode}".replace(", ", ",\n"))
            nd.append(row["scifact_ndcg@10"])
            rc.append(row["locomo_r@10"])
            colors.append(palette.get(name, "grey"))
    for ax, values, title in ((axes[0][0], nd, "SciFact nDCG@10"), (axes[0][1], rc, "LoCoMo dev recall@10, all")):
        bars = ax.bar(range(len(values)), values, color=colors)
        ax.bar_label(bars, fmt="%.3f", fontsize=7)
        ax.set_xticks(range(len(values)), labels, fontsize=6)
        ax.set_ylim(0, 1)
        ax.set_title(title + " (a failed search scores 0)")
    ax = axes[1][0]
    names, p50s, p99s = [], [], []
    for name, data in systems.items():
        for mode, levels in data.get("latency", {}).items():
            for c, lv in levels.items():
                names.append(f"{name}\n{mode}\n{c} asker(s)".replace(", ", ",\n"))
                p50s.append(lv["p50_ms"])
                p99s.append(lv["p99_ms"])
    xs = range(len(names))
    b1 = ax.bar([x - 0.2 for x in xs], p50s, 0.4, label="p50")
    b2 = ax.bar([x + 0.2 for x in xs], p99s, 0.4, label="p99")
    ax.bar_label(b1, fmt="%.0f", fontsize=6)
    ax.bar_label(b2, fmt="%.0f", fontsize=6)
    ax.set_xticks(list(xs), names, fontsize=6)
    ax.set_ylabel("ms")
    ax.set_title(f"query latency, top_k {TOP_K}, LoCoMo questions")
    ax.legend(fontsize=7)
    ax = axes[1][1]
    ing = [(n, d) for n, d in systems.items() if "ingest_scifact" in d]
    xs = range(len(ing))
    b1 = ax.bar([x - 0.2 for x in xs], [d["ingest_scifact"]["per_s"] for _, d in ing], 0.4, label="SciFact docs/s")
    b2 = ax.bar([x + 0.2 for x in xs], [d["ingest_locomo"]["per_s"] for _, d in ing], 0.4, label="LoCoMo turns/s")
    ax.bar_label(b1, fmt="%.1f", fontsize=7)
    ax.bar_label(b2, fmt="%.1f", fontsize=7)
    ax.set_xticks(list(xs), [n for n, _ in ing])
    ax.set_title("ingestion, submit -> searchable")
    ax.legend(fontsize=7)
    fig.suptitle("agentmemd and its peers: same corpus, model and Redis build, one run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def record(result: Result, systems: dict[str, dict[str, Any]]) -> None:
    for name, data in systems.items():
        if "ingest_scifact" not in data:
            continue
        result.figure(f"{name}: SciFact ingestion, submit -> searchable", data["ingest_scifact"]["per_s"], "docs/s")
        result.figure(f"{name}: LoCoMo ingestion, submit -> searchable", data["ingest_locomo"]["per_s"], "turns/s")
        failures = data.get("ingest_failures", {})
        if any(failures.values()):
            result.figure(
                f"{name}: ingestion failed submits / checks that found items missing",
                f"{failures['failed_submits']} / {failures['incomplete']}",
            )
        for mode, row in data["modes"].items():
            result.figure(f"{name}, {mode}: SciFact nDCG@10", row["scifact_ndcg@10"])
            result.figure(f"{name}, {mode}: LoCoMo R@10, all categories", row["locomo_r@10"])
            failed = row["failed_searches"]["scifact"] + row["failed_searches"]["locomo"]
            if failed or row["wrong_results"]:
                result.figure(
                    f"{name}, {mode}: failed searches (Redis crashes) / results from another conversation",
                    f"{failed} ({row['redis_crashes']}) / {row['wrong_results']}",
                )
        for mode, levels in data["latency"].items():
            for c, lv in levels.items():
                result.figure(
                    f"{name}, {mode}: p50 / p99 at {c} asker(s)", f"{lv['p50_ms']:.1f} / {lv['p99_ms']:.1f}", "ms"
                )
    ours, ams = systems.get("agentmemd"), systems.get("AMS")
    if not ours or not ams or "modes" not in ams:
        return
    ours_mode = next(iter(ours["modes"]))
    ours_p50 = ours["latency"][ours_mode]["16"]["p50_ms"]
    ams_lat = {m: lv["16"]["p50_ms"] for m, lv in ams["latency"].items()}
    best_lat = min(ams_lat, key=lambda m: ams_lat[m]) if ams_lat else None
    result.target(
        "agentmemd p50 at 16 askers / AMS's best mode's",
        ours_p50 / ams_lat[best_lat] if best_lat else float("nan"),
        "<=",
        0.5,
        "x",
        f"{ours_p50:.1f} ms / {ams_lat[best_lat]:.1f} ms ({best_lat})" if best_lat else "no AMS mode worked",
    )
    working = {m: r for m, r in ams["modes"].items() if not sum(r["failed_searches"].values())}
    for key, label in (("scifact_ndcg@10", "SciFact nDCG@10"), ("locomo_r@10", "LoCoMo R@10")):
        best = max(working, key=lambda m: working[m][key]) if working else None
        ref = working[best][key] if best else float("nan")
        result.target(
            f"agentmemd {label} (defaults) >= AMS's best working mode + 0.05",
            ours["modes"][ours_mode][key],
            ">=",
            ref + 0.05,
            expr=f"AMS best working: {best} {ref:.4f}" if best else "no AMS mode worked",
        )
    for key, unit in (("ingest_scifact", "docs/s"), ("ingest_locomo", "turns/s")):
        result.target(
            f"agentmemd {key.removeprefix('ingest_')} ingestion >= AMS's",
            ours[key]["per_s"],
            ">=",
            ams[key]["per_s"],
            unit,
            "items/s, submit -> searchable",
        )
