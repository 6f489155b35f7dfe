"""One benchmark's result: the JSON document (figures, targets, machine, commit) and the PNG's path."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import ROOT
from _stats import peak_rss_mb


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on (the load average matters on a shared machine)."""
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": mem_gib,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def git_info() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": dirty}


OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
}


class Result:
    """One benchmark's JSON document: figures, targets (MET/MISSED), params and raw data."""

    def __init__(self, benchmark: str, title: str, params: dict[str, Any], *, smoke: bool = False) -> None:
        self.doc: dict[str, Any] = {
            "benchmark": benchmark,
            "title": title,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": machine_info(),
            "git": git_info(),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "params": params,
            "smoke": smoke,
            "figures": [],
            "targets": [],
            "notes": [],
            "data": {},
        }
        self._t0 = time.monotonic()

    def figure(self, name: str, value: float | int | str | None, unit: str = "") -> None:
        if isinstance(value, float):
            value = round(value, 4)
        self.doc["figures"].append({"name": name, "value": value, "unit": unit})

    def target(self, name: str, value: float, op: str, threshold: float, unit: str = "", expr: str = "") -> bool:
        """Record a target; ``met`` is computed, never asserted. A NaN value is MISSED."""
        met = value == value and threshold == threshold and OPS[op](value, threshold)
        self.doc["targets"].append(
            {
                "name": name,
                "value": round(value, 4) if value == value else None,
                "op": op,
                "threshold": round(threshold, 4) if threshold == threshold else None,
                "unit": unit,
                "expr": expr,
                "met": bool(met),
            }
        )
        return bool(met)

    def note(self, text: str) -> None:
        self.doc["notes"].append(text)

    def write(self, out_dir: Path) -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.doc["duration_s"] = round(time.monotonic() - self._t0, 1)
        self.doc["peak_rss_mb"] = peak_rss_mb()
        self.doc["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        if "torch" in sys.modules:
            self.doc["machine"]["torch_threads"] = sys.modules["torch"].get_num_threads()
        path = out_dir / f"{self.doc['benchmark']}.json"
        path.write_text(json.dumps(self.doc, indent=2, default=str) + "\n")
        return path

    def print_summary(self) -> None:
        print(f"\n== {self.doc['title']} ==")
        for f in self.doc["figures"]:
            print(f"  {f['name']}: {f['value']} {f['unit']}".rstrip())
        for t in self.doc["targets"]:
            status = "MET" if t["met"] else "MISSED"
            print(f"  target {t['name']}: {t['value']} {t['op']} {t['threshold']} {t['unit']} -> {status}")
        for n in self.doc["notes"]:
            print(f"  note: {n}")


def png_path(out_dir: Path, benchmark: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir / f"{benchmark}.png"
