"""The root ``agentmemd`` command, its consoles, and what every command group shares:
settings, clean failures, signal handling and a Redis client.

Every flag our commands declare (a ``bool`` option) passes ``metavar=""``: typer's help would
otherwise show it as ``--json <bool>``, which reads as if it took a value (typer's own
``--help`` still shows so).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError
from rich.console import Console
from rich.markup import escape
from rich.segment import Segment

from consumers.decoding import validation_reason
from daemon.connections import redis_client
from daemon.control_pictures import for_terminal
from daemon.logging import configure_logging
from daemon.settings import Settings
from daemon.settings_check import ConfigError
from memory.errors import BackendUnavailable, MemdError

T = TypeVar("T")

#: Where every command's settings come from, said under the help of the root and the servers.
SETTINGS_EPILOG = (
    "Settings: AGENTMEM_* environment variables, or the same in a .env file in the working directory "
    "(every command started there reads it). Addresses: AGENTMEM_KAFKA_BOOTSTRAP (127.0.0.1:9092), "
    "AGENTMEM_REDIS_URL (redis://127.0.0.1:6379/0), AGENTMEM_HTTP_PORT (8080). "
    "`agentmemd config show` prints them all; docs/configuration.md says what each does."
)

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="agent-memory-daemon: long-term memory for agents.",
    epilog=SETTINGS_EPILOG,
)


class _SafeConsole(Console):
    """A console that never sends a stored text's control characters to the terminal
    (``daemon.control_pictures``): what a memory holds is shown, never obeyed. Applied to the
    rendered segments, so tables, panels and texts alike are covered."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            seg if seg.control else Segment(for_terminal(seg.text), seg.style, seg.control) for seg in buffer
        )


out = _SafeConsole()
# Piped output is for grep and scripts: whole lines (a chunk id cut at 80 columns names nothing).
out.soft_wrap = not out.is_terminal
err = _SafeConsole(stderr=True)
err.soft_wrap = not err.is_terminal  # the same for what goes to a log file


def settings_problem() -> tuple[Settings | None, str]:
    """The settings, or why there are none, in words (not a traceback): each invalid one, or
    an environment variable that does not parse."""
    try:
        return Settings(), ""
    except ValidationError as exc:
        return None, f"invalid settings ({exc.error_count()}): {validation_reason(exc, root='settings')}"
    except ConfigError as exc:
        return None, f"invalid settings: {exc}"
    except SettingsError as exc:
        # A list or mapping in an environment variable must be JSON; pydantic names the field only.
        return None, (
            f"invalid settings: {exc}. A list or a mapping in an AGENTMEM_ variable is JSON, "
            """e.g. AGENTMEM_INDEX__EXTRA_FILTER_KEYS='["team", "role"]'"""
        )


def _load_settings() -> Settings:
    """The settings, or a clean failure naming each invalid one (not a traceback)."""
    settings, problem = settings_problem()
    if settings is None:
        raise _fail(ValueError(problem))
    return settings


def _level_named() -> bool:
    """Whether the environment or ``.env`` names the log level. Not "set by any source": a
    config file written by `config toml` sets every key, the default level included, and made
    each one-shot command log all its info lines."""
    from pydantic_settings import DotEnvSettingsSource

    name = "agentmem_log_level"
    return any(k.lower() == name for k in os.environ) or name in DotEnvSettingsSource(Settings).env_vars


def _settings(*, quiet: bool = False) -> Settings:
    """The settings, with logging configured. ``quiet``: a one-shot command, whose printed
    result says what its info lines would; warnings and errors still show (the broker
    client's say why a connection failed, which its exception does not), and
    AGENTMEM_LOG_LEVEL=info shows them all."""
    settings = _load_settings()
    explicit = _level_named() or settings.log_level != Settings.model_fields["log_level"].default
    configure_logging(settings.log_level if explicit or not quiet else "warning", settings.log_format)
    return settings


def _run_with_signals(main: Callable[[asyncio.Event], Awaitable[None]], again: asyncio.Event | None = None) -> None:
    """Run ``main(stop)``, ``stop`` set by SIGINT or SIGTERM; ``again``, if given, by a second one."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def signalled() -> None:
            if stop.is_set() and again is not None:
                again.set()
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, signalled)
        await main(stop)

    asyncio.run(runner())


def _fail(exc: Exception, message: str | None = None) -> typer.Exit:
    """``exc`` told on stderr (as ``message`` where given: in the command line's words), and the exit."""
    # An outage's message says what failed; the hint says where to look next.
    outage = type(exc) is BackendUnavailable and "agentmemd doctor" not in str(exc)  # (not an index mismatch)
    hint = " (`agentmemd doctor` says what is down, and how to start it)" if outage else ""
    err.print(f"[red]error:[/red] {escape(str(exc) if message is None else message)}{hint}")
    return typer.Exit(code=1)


def _with_redis(fn: Callable[[Settings, Any], Awaitable[T]]) -> T:
    """Run ``fn(settings, redis client)`` to the end; a MemdError becomes a clean CLI failure."""
    settings = _settings(quiet=True)

    async def main() -> T:
        client = redis_client(settings)
        try:
            return await fn(settings, client)
        finally:
            await client.aclose()

    try:
        return asyncio.run(main())
    except MemdError as exc:
        raise _fail(exc) from exc
