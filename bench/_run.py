"""How a benchmark script runs: its ``--out`` argument, SIGTERM as Ctrl-C, quiet logs, and the common tail."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import RESULTS_DIR
from _result import png_path
from _servers import embedded_servers


def quiet_logs() -> None:
    """Only warnings and errors from the daemon's structlog events (one per doc otherwise)."""
    from daemon.logging import configure_logging

    configure_logging(level="warning", fmt="console")


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so ``finally`` blocks stop the servers."""
    signal.signal(signal.SIGTERM, _raise_exit)


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
