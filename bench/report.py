"""Regenerate the benchmark table (markdown) from the JSON results; print it and write TABLE.md.

Run from the project root:

    .venv/bin/python bench/report.py                        # bench/results/*.json
    .venv/bin/python bench/report.py --results /tmp/smoke   # another results dir

Every figure and every target of every result file goes into one table; targets are marked
MET or MISSED exactly as the benchmark computed them (nothing is recomputed or hidden).
Below the table, each benchmark's run (date, machine, commit, parameters, notes) and plot.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ORDER = [
    "peers",
    "locomo",
    "acks",
    "idle",
    "edits",
    "ingest",
    "latency",
    "latency_depth",
    "scifact",
    "identifiers",
    "scale",
    "stale_latency",
    "write_block",
    "explore",
]
SCRIPTS = {
    "peers": "bench/peers.py",
    "locomo": "bench/locomo.py",
    "ingest": "bench/ingest.py",
    "latency": "bench/latency.py",
    "latency_depth": "bench/latency.py --depths 5,50",
    "scifact": "bench/scifact.py",
    "scale": "bench/scale.py",
    "stale_latency": "bench/stale_latency.py",
    "identifiers": "bench/identifiers.py",
    "write_block": "bench/write_block.py",
    "acks": "bench/acks.py",
    "idle": "bench/idle.py",
    "edits": "bench/edits.py",
    "explore": "bench/explore.py",
}
README = Path(__file__).resolve().parent / "README.md"
#: The project's front page quotes the count of targets met; --readme keeps it the table's.
PROJECT_README = README.parent.parent / "README.md"
COUNT = re.compile(r"Targets: \d+ met, \d+ missed of \d+\.")
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if value != value:
        return "n/a"
    v = abs(value)
    if isinstance(value, int) or v >= 1000:
        return f"{value:,.0f}"
    if v >= 100:
        return f"{value:.1f}"
    if v >= 1:
        return f"{value:.2f}"
    return f"{value:.4g}"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def load(results: Path) -> list[dict[str, Any]]:
    docs = []
    for path in sorted(results.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"skipping {path}: {exc}", file=sys.stderr)
            continue
        if isinstance(doc, dict) and "benchmark" in doc and "figures" in doc:
            docs.append(doc)
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(docs, key=lambda d: (rank.get(d["benchmark"], len(ORDER)), d["benchmark"]))


def machine_line(m: dict[str, Any]) -> str:
    parts = [f"{m.get('cores')} cores (os.cpu_count())", str(m.get("cpu") or "")]
    if m.get("memory_gib"):
        parts.append(f"{m['memory_gib']} GiB RAM")
    if m.get("torch_threads"):
        parts.append(f"torch threads {m['torch_threads']}")
    if m.get("loadavg_at_start"):
        parts.append(f"load avg at start {m['loadavg_at_start'][0]}")
    if m.get("loadavg_at_end"):
        parts.append(f"at end {m['loadavg_at_end'][0]}")
    return ", ".join(p for p in parts if p)


def render(docs: list[dict[str, Any]]) -> str:
    now = datetime.now(UTC).isoformat(timespec="seconds")
    met = sum(t["met"] for d in docs for t in d["targets"])
    total = sum(len(d["targets"]) for d in docs)
    lines = [
        "# agentmemd benchmarks",
        "",
        f"Table generated {now} by `bench/report.py` on {os.cpu_count()} cores (os.cpu_count()), "
        f"{platform.machine()}, {platform.system()} {platform.release()}, Python {platform.python_version()}.",
        f"Targets: **{met} MET, {total - met} MISSED** of {total}.",
        "",
    ]
    if any(d.get("smoke") for d in docs):
        lines += [
            "> Some results below come from smoke-size runs (marked *smoke*): "
            "their figures are not representative; run the full-size commands in bench/README.md.",
            "",
        ]
    lines += ["| Benchmark | Run (UTC) | Measure | Value | Target | Status |", "|---|---|---|---|---|---|"]
    for d in docs:
        name = d["benchmark"] + (" *(smoke)*" if d.get("smoke") else "")
        when = d.get("date", "")[:16].replace("T", " ")
        for f in d["figures"]:
            value = f"{fmt(f['value'])} {f.get('unit') or ''}".strip()
            lines.append(f"| {name} | {when} | {cell(f['name'])} | {cell(value)} | | |")
        for t in d["targets"]:
            value = f"{fmt(t['value'])} {t.get('unit') or ''}".strip()
            target = f"{t['op']} {fmt(t['threshold'])} {t.get('unit') or ''}".strip()
            if t.get("expr"):
                target += f" ({t['expr']})"
            status = "**MET**" if t["met"] else "**MISSED**"
            lines.append(f"| {name} | {when} | {cell(t['name'])} | {cell(value)} | {cell(target)} | {status} |")
    lines.append("")
    for d in docs:
        git = d.get("git") or {}
        commit = (git.get("commit") or "unknown")[:10] + (" (uncommitted changes)" if git.get("dirty") else "")
        lines += [
            f"## {d['title']}",
            "",
            f"- Script: `{SCRIPTS.get(d['benchmark'], d['benchmark'])}`; command: `{d.get('command', '')}`",
            f"- Run: {d.get('date', '')}, took {d.get('duration_s', '?')} s, peak RSS {d.get('peak_rss_mb', '?')} MB; "
            f"commit {commit}" + (" — **smoke-size run**" if d.get("smoke") else ""),
            f"- Machine: {machine_line(d.get('machine') or {})}",
            "- Parameters: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in (d.get("params") or {}).items()),
        ]
        lines += [f"- Note: {n}" for n in d.get("notes", [])]
        lines += ["", f"![{d['benchmark']}]({d['benchmark']}.png)", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="directory of result JSON files")
    parser.add_argument("--output", type=Path, default=None, help="markdown file (default: <results>/TABLE.md)")
    parser.add_argument(
        "--readme", action="store_true", help=f"also replace the table between {START} and {END} in bench/README.md"
    )
    args = parser.parse_args()
    docs = load(args.results)
    if not docs:
        parser.error(f"no benchmark results in {args.results}: run the benchmarks first (see bench/README.md)")
    text = render(docs)
    out = args.output or args.results / "TABLE.md"
    out.write_text(text + "\n")
    print(text)
    print(f"\nwrote {out}", file=sys.stderr)
    if args.readme:
        readme = README.read_text()
        if START not in readme or END not in readme:
            parser.error(f"README.md has no {START} ... {END} block")
        head, rest = readme.split(START, 1)
        _, tail = rest.split(END, 1)
        table = "\n".join(
            line for line in text.split("\n## ", 1)[0].rstrip().splitlines() if not line.startswith("# ")
        ).strip()
        details = "Per-run details (commit, parameters, notes) and plots: [results/TABLE.md](results/TABLE.md)."
        README.write_text(f"{head}{START}\n{table}\n\n{details}\n{END}{tail}")
        print(f"updated {README}", file=sys.stderr)
        met = sum(t["met"] for d in docs for t in d["targets"])
        total = sum(len(d["targets"]) for d in docs)
        front = PROJECT_README.read_text()
        if not COUNT.search(front):
            parser.error(f"{PROJECT_README} has no 'Targets: N met, M missed of T.' sentence to update")
        PROJECT_README.write_text(COUNT.sub(f"Targets: {met} met, {total - met} missed of {total}.", front, count=1))
        print(f"updated the count of targets in {PROJECT_README}", file=sys.stderr)


if __name__ == "__main__":
    main()
