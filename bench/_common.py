"""Shared plumbing of the benchmark scripts: environment, servers, synthetic text, results.

Importing this module first (before any project module) sets the offline environment,
puts the project root on ``sys.path`` and selects matplotlib's Agg backend, so every
script runs as ``/work/venv/bin/python bench/<name>.py`` from the project root.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "MPLBACKEND": "Agg",
}.items():
    os.environ.setdefault(_key, _value)

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
CACHE_DIR = BENCH_DIR / ".cache"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import asyncio  # noqa: E402  (after the environment on purpose)
import contextlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from typing import Any  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")


# -- lifecycle -----------------------------------------------------------------------------


def quiet_logs() -> None:
    """Only warnings and errors from the daemon's structlog events (one per doc otherwise)."""
    from daemon.logging import configure_logging

    configure_logging(level="warning", fmt="console")


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so ``finally`` blocks stop the servers."""
    signal.signal(signal.SIGTERM, _raise_exit)


@dataclass
class Servers:
    """Embedded servers started for one benchmark run."""

    redis_url: str = ""
    kafka_bootstrap: str = ""
    redis_dir: Path | None = None
    procs: list[Any] = field(default_factory=list)


@contextlib.contextmanager
def embedded_servers(
    *, kafka: bool = True, redis_dir: Path | None = None, appendonly: bool = True
) -> Iterator[Servers]:
    """Redis (with RediSearch) and, optionally, the tansu broker on free ports.

    Args:
        kafka: also start the broker.
        redis_dir: Redis's data dir (kept); a temporary one (removed) when ``None``.
        appendonly: persist with AOF, as the daemon's own ``agentmemd up`` does.

    Both are stopped (SIGTERM, then SIGKILL) in reverse order when the block exits.
    """
    from daemon.launcher import free_port, start_redis, start_tansu

    tmp = Path(tempfile.mkdtemp(prefix="agentmemd-bench-"))
    servers = Servers()
    try:
        data_dir = redis_dir if redis_dir is not None else tmp / "redis"
        servers.redis_dir = data_dir
        servers.redis_url = f"redis://127.0.0.1:{free_port()}/0"
        servers.procs.append(start_redis(servers.redis_url, data_dir=data_dir, appendonly=appendonly))
        if kafka:
            broker = start_tansu(f"127.0.0.1:{free_port()}", log_dir=tmp / "tansu")
            servers.kafka_bootstrap = broker.address
            servers.procs.append(broker)
        yield servers
    finally:
        for proc in reversed(servers.procs):
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def spawn_logged(args: list[str], log_path: Path, env: dict[str, str] | None) -> subprocess.Popen[Any]:
    """``args`` started with its output in ``log_path``, stopped (SIGTERM) with this process."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent
        )


def _die_with_parent() -> None:
    import ctypes

    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 60.0) -> None:
    """A clean stop (SIGTERM, as Ctrl-C), then SIGKILL after ``timeout_s``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _log_tail(path: Path, chars: int | None = 2000) -> str:
    text = path.read_text(errors="replace")
    return text if chars is None else text[-chars:]


async def start_agentmemd(servers: Servers, log_path: Path, env: dict[str, str]) -> subprocess.Popen[Any]:
    """``agentmemd run`` as its own process (as it is deployed) on ``servers``, graph off, no HTTP
    server, with the ``AGENTMEM_*`` settings of ``env`` on top; returned once it consumes."""
    settings = {
        "AGENTMEM_KAFKA_BOOTSTRAP": servers.kafka_bootstrap,
        "AGENTMEM_REDIS_URL": servers.redis_url,
        "AGENTMEM_GRAPH__ENABLED": "false",
        "AGENTMEM_HTTP_PORT": "0",
        "AGENTMEM_LOG_LEVEL": "warning",
    }
    args = [str(Path(sys.executable).parent / "agentmemd"), "run"]
    proc = spawn_logged(args, log_path, {**os.environ, **settings, **env})

    async def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"agentmemd exited {proc.returncode}: {_log_tail(log_path)}")
        return "agentmemd ready" in _log_tail(log_path, None)

    try:
        if not await wait_until(ready, timeout_s=300, interval_s=0.1):
            raise RuntimeError(f"agentmemd not ready in 300 s: {_log_tail(log_path)}")
    except BaseException:
        stop_process(proc)
        raise
    return proc


async def wait_redis_ready(client: Any, timeout_s: float = 300.0) -> None:
    """Wait until Redis answers and has finished loading its AOF."""
    from redis import exceptions as rexc

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await client.ping()
            info = await client.info("persistence")
            if int(info.get("loading", 0)) == 0:
                return
        except (rexc.BusyLoadingError, rexc.ConnectionError, rexc.TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"redis not ready within {timeout_s}s")
        await asyncio.sleep(0.2)


async def wait_until(check: Callable[[], Any], *, timeout_s: float, interval_s: float = 0.02) -> bool:
    """Poll the async ``check`` until it is true; False on timeout (never raises for it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(interval_s)
    return False


# -- statistics ----------------------------------------------------------------------------


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


# -- synthetic text ------------------------------------------------------------------------

SERVICES = [
    "billing-service", "auth-service", "search-api", "ledger-service", "payments-gateway",
    "orders-service", "inventory-worker", "notify-queue", "session-cache", "reports-api",
    "shipping-service", "catalog-api", "profile-service", "fraud-worker", "pricing-service",
]  # fmt: skip
CONFIG_KEYS = [
    "max_connections", "token_ttl", "refresh_interval", "lock_timeout", "pool_size",
    "retry_backoff", "batch_size", "idle_timeout", "queue_depth", "cache_ttl",
]  # fmt: skip
HTTP_STATUSES = ["HTTP 500", "HTTP 502", "HTTP 503", "HTTP 504", "HTTP 401", "HTTP 429"]


class SyntheticText:
    """Deterministic English-looking text: words drawn (Zipf-like) from the model's vocabulary.

    Whole words of the embedding model's WordPiece vocabulary, roughly in frequency order,
    give realistic token counts per word, and a few technical identifiers per paragraph
    give BM25 and the graph layer something to find. Nothing is downloaded.
    """

    def __init__(self, seed: int = 7) -> None:
        from memory.embedder import PACKAGED_MINILM, resolve_model_path

        vocab = Path(resolve_model_path(PACKAGED_MINILM)) / "vocab.txt"
        words = [w.strip() for w in vocab.read_text(encoding="utf-8").splitlines()]
        self.words = [w for w in words[1990:22000] if w.isalpha() and w.isascii() and len(w) >= 3]
        self.rng = random.Random(seed)
        n = len(self.words)
        self._weights = [1.0 / (i + 10) for i in range(n)]
        self._cum: list[float] = []
        total = 0.0
        for w in self._weights:
            total += w
            self._cum.append(total)

    def word(self) -> str:
        return self.rng.choices(self.words, cum_weights=self._cum, k=1)[0]

    def words_n(self, n: int) -> list[str]:
        return self.rng.choices(self.words, cum_weights=self._cum, k=n)

    def identifier(self) -> str:
        r = self.rng.random()
        if r < 0.35:
            return self.rng.choice(SERVICES)
        if r < 0.6:
            return self.rng.choice(CONFIG_KEYS)
        if r < 0.8:
            return self.rng.choice(HTTP_STATUSES)
        return f"ERR_{self.word().upper()}_{self.rng.randrange(16**3):03X}"

    def sentence(self) -> str:
        words = self.words_n(self.rng.randint(8, 20))
        if self.rng.random() < 0.4:
            words.insert(self.rng.randrange(len(words)), self.identifier())
        return " ".join(words).capitalize() + "."

    def paragraph(self, n_words: int) -> str:
        out: list[str] = []
        count = 0
        while count < n_words:
            s = self.sentence()
            out.append(s)
            count += len(s.split())
        return " ".join(out)

    def query(self, n_words: int = 6) -> str:
        return " ".join(self.words_n(n_words))


# -- results -------------------------------------------------------------------------------


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


def add_common_args(parser: Any) -> None:
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR, help="where the JSON and PNG go (default: bench/results)"
    )


def run_benchmark(
    bench: str,
    args: Any,
    main_async: Callable[[Any, Any], Any],
    *,
    kafka: bool,
    appendonly: bool = True,
    pass_servers: bool = False,
) -> None:
    """The common tail of every script: servers up, run, write JSON, print the summary."""
    exit_on_sigterm()
    quiet_logs()
    with embedded_servers(kafka=kafka, appendonly=appendonly) as servers:
        result = asyncio.run(main_async(args, servers if pass_servers else servers.redis_url))
    path = result.write(args.out)
    result.print_summary()
    print(f"\nwrote {path} and {png_path(args.out, bench)}")
