"""``up``, ``run`` and ``servers``: the daemon and the embedded broker and Redis, in the foreground."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from pydantic import ValidationError

from daemon.cli._app import SETTINGS_EPILOG, _fail, _run_with_signals, _settings, app
from daemon.settings import Settings
from memory.errors import MemdError


def _embedded(settings: Settings) -> Any:
    """The embedded servers as the settings describe them (`up`, `servers`)."""
    if settings.redis_username not in ("", "default"):
        raise MemdError(
            f"the embedded Redis has only the default user, not {settings.redis_username!r}: unset "
            "AGENTMEM_REDIS_USERNAME (AGENTMEM_REDIS_PASSWORD still applies), or run `agentmemd run` against your Redis"
        )
    from daemon.launcher import describe_data_dir, embedded_servers  # every other command starts faster without

    password = settings.redis_password.get_secret_value() or None
    # Relative by default: started from another directory, the memory would look lost.
    print(f"agentmemd data: {describe_data_dir(settings.data_dir)}", flush=True)
    return embedded_servers(settings.kafka_bootstrap, settings.redis_url, settings.data_dir, redis_password=password)


@app.command(epilog=SETTINGS_EPILOG)
def up() -> None:
    """Start the embedded broker and Redis, then the daemon, in the foreground (Ctrl-C stops all)."""
    settings = _embedded_session(_settings())
    again = asyncio.Event()  # a second Ctrl-C: stop without applying what the broker still holds

    def main(stop: asyncio.Event) -> Awaitable[None]:
        from daemon.app import run_until_stopped
        from daemon.drain import drain_events
        from daemon.instance import Daemon

        async def drain(daemon: Daemon) -> int:
            daemon.hurry = again  # the second Ctrl-C also ends the stop's wait for lanes
            busy = lambda: daemon.ingestor.activity.in_flight > 0  # noqa: E731
            return await drain_events(settings, again, refused=daemon.index.mismatch, busy=busy)

        return run_until_stopped(settings, stop, before_stop=drain)

    try:
        with _embedded(settings):
            _run_with_signals(main, again)
    except MemdError as exc:
        raise _fail(exc) from exc


#: The embedded default's consumer session unless one is configured: Apache Kafka's smallest
#: (6 s). tansu holds a group's first join for half of it, so `up` is ready 2 s sooner than
#: with the 10 s default, and a daemon killed on this one machine gives its partitions up sooner.
EMBEDDED_SESSION_MS = 6_000


def _embedded_session(settings: Settings) -> Settings:
    try:
        consumer = settings.consumer.with_default_session(EMBEDDED_SESSION_MS)
    except ValidationError:  # a heartbeat set alone that does not fit it: the default session
        return settings
    return settings.model_copy(update={"consumer": consumer})


@app.command(epilog=SETTINGS_EPILOG)
def run() -> None:
    """Run only the daemon, against the configured Kafka and Redis (production)."""
    settings = _settings()
    try:
        from daemon.app import run_until_stopped

        _run_with_signals(lambda stop: run_until_stopped(settings, stop))
    except MemdError as exc:
        raise _fail(exc) from exc


@app.command(epilog=SETTINGS_EPILOG)
def servers() -> None:
    """Start only the embedded broker (tansu, in-memory log) and Redis with search (AOF)."""
    settings = _settings()

    async def wait(stop: asyncio.Event) -> None:
        print(
            f"servers ready: kafka {settings.kafka_bootstrap}, redis {settings.redis_url} (Ctrl-C stops)",
            flush=True,
        )
        await stop.wait()

    try:
        with _embedded(settings):
            _run_with_signals(wait)
    except MemdError as exc:
        raise _fail(exc) from exc
