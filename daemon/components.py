"""Components wired from the settings alike by the daemon, the CLI's commands and a reindex."""

from __future__ import annotations

import os

import redis.asyncio as aredis

from daemon.settings import Settings
from graph import Offload, SpacyNer, TenantGraphs, in_thread
from memory.activity import IngestActivity
from memory.embedder import Embedder
from memory.index import ChunkIndex, GenerationRegistry, translate_errors


def offline_environment() -> None:
    """Models and tokenizers load from disk only; nothing may download at run time."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


async def load_ner(settings: Settings) -> SpacyNer | None:
    """The graph's entity recognizer, or None when no spaCy model is configured."""
    return await SpacyNer.load(settings.graph.spacy_model) if settings.graph.spacy_model else None


def build_graph(
    settings: Settings,
    *,
    redis: aredis.Redis,
    index: ChunkIndex,
    embedder: Embedder | None,
    ner: SpacyNer | None,
    activity: IngestActivity | None = None,
    offload: Offload = in_thread,
) -> TenantGraphs:
    """The graph layer over ``index``: one service per tenant, as the daemon, the CLI's graph
    commands and a reindex's re-pointing all wire it."""
    return TenantGraphs(
        client=redis,
        name=settings.index.name,
        index=index,
        embedder=embedder,
        ner=ner,
        cfg=settings.graph,
        activity=activity,
        offload=offload,
    )


async def active_index(settings: Settings, redis: aredis.Redis) -> ChunkIndex:
    """The index as the active generation was built, for commands that load no model.

    A placeholder spec (no model, 0 dims) fails the settings check of every write, so a
    `graph rebuild` that removed a community failed deleting its summary chunk, after its
    communities were already committed.

    Raises:
        MemdError: the active generation could not be read from Redis.
    """
    async with translate_errors("generation read"):
        state = await GenerationRegistry(redis, settings.index.name).state()
    dims = state.spec.dims if state.spec is not None else 0
    return ChunkIndex(client=redis, cfg=settings.index, dims=dims, spec=state.spec)
