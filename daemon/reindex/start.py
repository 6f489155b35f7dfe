"""Starting a reindex: the checks before the model loads, the model, and the run (``build``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from daemon.connections import redis_client
from daemon.reindex.build import Reindex
from daemon.reindex.report import ReindexProgress, ReindexReport
from daemon.settings import Settings
from daemon.teardown import bounded
from memory.embedder import SentenceTransformerEmbedder
from memory.errors import BackendUnavailable, EmbedderError
from memory.index import translate_errors


async def reindex(
    settings: Settings,
    *,
    since_ms: int | None = None,
    keep_old: bool = False,
    allow_losses: bool = False,
    on_progress: Callable[[ReindexProgress], None] = lambda _p: None,
    embedder: SentenceTransformerEmbedder | None = None,
) -> ReindexReport:
    """Rebuild the index into a new generation from Kafka with ``settings`` and switch to it.

    Args:
        settings: the settings to build with (model, chunking, schema) and to reach Kafka/Redis.
        since_ms: replay from the first offsets at or after this Unix time in ms (None: earliest).
        keep_old: keep the old generation's index and keys after the switch.
        allow_losses: switch even if docs the old generation serves are not in the new one
            (and cannot be copied over: another spec).
        on_progress: called as the replay advances (from the event loop; keep it quick).
        embedder: a loaded embedder to borrow (never closed here; its settings must be
            ``settings.embedding``); by default the build loads its own.

    Returns:
        The generations before and after, what was replayed, and what is left to redo.

    Raises:
        NotFound: there is no index to rebuild yet.
        ReindexConflict: another reindex is running.
        ReindexWouldLose: docs the old generation serves are not in the new one (and
            ``allow_losses`` is not set); nothing changed.
        BackendUnavailable: Redis or Kafka went away before the switch (nothing changed).
        ValueError: a lent embedder was loaded with other embedding settings.
    """
    from daemon.components import offline_environment

    offline_environment()
    await _redis_reachable(settings)  # before the model's load: unreachable, it is said in a second, not twenty
    if embedder is not None:
        embedder.check_lent_to(settings.embedding, "build's")
    owns_embedder = embedder is None
    if embedder is None:  # before the Redis client: a model that fails to load leaks nothing
        embedder = await SentenceTransformerEmbedder.load(settings.embedding)
    try:
        embedder.check_chunks_fit(settings.chunking.max_tokens)
    except EmbedderError:
        if owns_embedder:
            embedder.close()
        raise
    started = time.monotonic()  # the rebuild's time, not the model's loading
    run = Reindex(
        settings,
        embedder=embedder,
        owns_embedder=owns_embedder,
        since_ms=since_ms,
        keep_old=keep_old,
        allow_losses=allow_losses,
        on_progress=on_progress,
        started=started,
    )
    return await run.run()


async def _redis_reachable(settings: Settings) -> None:
    """Check that the memory's Redis answers.

    Raises:
        BackendUnavailable: it does not (nothing runs: the message says what starts it).
    """
    client = redis_client(settings)
    try:
        async with translate_errors("ping"):
            await client.ping()
    except BackendUnavailable as exc:  # not a refusal of the credentials: that is no server to start
        raise BackendUnavailable(
            f"redis unreachable at {settings.redis_url} ({exc}): the memory's Redis must run "
            "(`agentmemd up`, or `agentmemd servers` for the embedded servers alone, starts it)"
        ) from exc
    finally:
        await bounded("redis", client.aclose())
