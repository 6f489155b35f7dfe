"""The hold on live unversioned writes during a reindex's last catch-up (decision 0041): a forget
read while held, a turn's context rewrite, a host clock ahead of Redis, and a hold whose release
or reply is lost.

The first three drive two real ``Ingestor``s on one Redis, as the reindex does: a live one that
follows the active generation and a replay pinned to it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aredis

import daemon.reindex.handover as handover_mod
from consumers.events import ForgetEvent, TranscriptEvent
from memory.config import ChunkingConfig, IndexConfig, IngestConfig
from memory.errors import BackendUnavailable, WritesHeld
from memory.filters import BASE_FILTER_KEYS
from memory.index import ChunkIndex, GenerationRegistry
from memory.ingest import Ingestor
from memory.records import MemoryItem
from tests.conftest import unique
from tests.helpers import daemon_and_client, isolated_settings, reindex

pytestmark = pytest.mark.integration

AGENT = "hold"


def turn(session: str, n: int, text: str) -> MemoryItem:
    event = TranscriptEvent(event_id=f"{session}{n}{text}", agent_id=AGENT, session_id=session, turn=n, content=text)
    return dataclasses.replace(event.to_item(BASE_FILTER_KEYS), timestamp=1000.0 + n)


def forget(session: str) -> MemoryItem:
    return ForgetEvent(event_id=f"f{session}", op="forget", agent_id=AGENT, session_id=session).to_item(
        BASE_FILTER_KEYS
    )


@dataclasses.dataclass
class Switched:
    """A generation switched to by a reindex that still holds the build slot."""

    registry: GenerationRegistry
    owner: str
    generation: int
    live_index: ChunkIndex
    live: Ingestor
    replay: Ingestor


@pytest.fixture
async def switched(redis_url: str, embedder: Any, request: pytest.FixtureRequest) -> AsyncIterator[Switched]:
    client = aredis.from_url(redis_url)
    cfg = IndexConfig(name=unique(request.node.name))
    live_index = ChunkIndex(client=client, cfg=cfg, dims=embedder.dims)
    await live_index.ensure()
    registry = GenerationRegistry(client, cfg.name)
    owner = "reindex-hold-test"
    generation, _ = await registry.reserve(owner)
    target = ChunkIndex(client=client, cfg=cfg, dims=embedder.dims, spec=live_index.spec, generation=generation)
    await target.ensure()
    await registry.switch(owner, generation, live_index.spec)
    await live_index.state(fresh=True)

    def ingestor(index: ChunkIndex) -> Ingestor:
        return Ingestor(index=index, embedder=embedder, chunking=ChunkingConfig(), cfg=IngestConfig())

    try:
        yield Switched(registry, owner, generation, live_index, ingestor(live_index), ingestor(target))
    finally:
        await registry.release(owner)
        await live_index.drop()
        await target.drop()
        await client.aclose()


async def test_a_forget_consumed_during_the_hold_waits_and_lists_the_turns_after_it(switched: Switched) -> None:
    """Partition order: a forget F0 below the first pass's end, the turn written again after it,
    then a forget F published during the hold. The first pass replays F0 over the live turn (the
    passing state); F, consumed during the hold, used to find nothing to delete there, was
    committed, and the second pass brought the turn back for good. Now F waits for the hold's
    end and lists the session's turns only then."""
    s, doc = switched, f"transcript:{AGENT}/s1/1"
    await s.live.apply([forget("s1")])
    await s.live.apply([turn("s1", 1, "a secret the user forgets later")])
    await s.replay.apply([forget("s1")])  # the first pass, after the live write
    assert not await s.live_index.chunk_ids(doc)
    await s.registry.hold_unversioned(s.owner, s.generation)
    late = asyncio.ensure_future(s.live.apply([forget("s1")]))
    await asyncio.sleep(1.0)
    assert not late.done()  # held, not committed
    await s.replay.apply([turn("s1", 1, "a secret the user forgets later")])  # the second pass
    await s.registry.release_unversioned(s.owner)
    report = await asyncio.wait_for(late, timeout=30)
    assert report.failed == [] and not await s.live_index.chunk_ids(doc)


async def test_a_turns_context_rewrite_is_held_too(switched: Switched) -> None:
    """A live batch's context rewrite of a neighbour reads the replay's passing state: it waits."""
    s = switched
    await s.live.apply([turn("s2", 1, "alpha one"), turn("s2", 2, "beta two")])
    (entry,) = (await s.live_index.turn_entries([f"transcript:{AGENT}/s2/1"]))[f"transcript:{AGENT}/s2/1"]
    await s.registry.hold_unversioned(s.owner, s.generation)
    with pytest.raises(WritesHeld):
        await s.live_index.recontext(f"transcript:{AGENT}/s2/1", [(entry, "written during the hold", "", None)])


async def test_the_hold_is_judged_by_redis_clock_not_the_hosts(
    switched: Switched, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host 90 s ahead of Redis used to read the hold's heartbeat as stale and write through it."""
    s = switched
    await s.registry.hold_unversioned(s.owner, s.generation)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 90)
    with pytest.raises(WritesHeld):
        await s.live_index.apply(f"transcript:{AGENT}/s3/1", None, [], np.zeros((0, 1), np.float32))


@pytest.mark.parametrize("lost", ["release", "hold reply"])
async def test_a_hold_ends_with_the_catch_up_though_a_call_fails(
    kafka_bootstrap: str, redis_url: str, monkeypatch: pytest.MonkeyPatch, lost: str
) -> None:
    """A release that fails once is retried; a hold whose reply is lost (it took effect) is
    released and reported. Either used to keep every live turn waiting through the drop of the
    old generation and the graph's re-pointing, until the build slot's release."""
    settings = isolated_settings(unique(f"hold-{lost}"), kafka_bootstrap, redis_url)
    async with daemon_and_client(settings) as (daemon, _):
        registry = GenerationRegistry(daemon.redis, settings.index.name)
        failures = 0
        if lost == "release":
            real_release = GenerationRegistry.release_unversioned

            async def release_once_failing(self: GenerationRegistry, owner: str) -> None:
                nonlocal failures
                if failures == 0:
                    failures += 1
                    raise BackendUnavailable("injected: a redis blip at the release")
                await real_release(self, owner)

            monkeypatch.setattr(GenerationRegistry, "release_unversioned", release_once_failing)
        else:
            real_hold = GenerationRegistry.hold_unversioned

            async def hold_losing_reply(self: GenerationRegistry, owner: str, generation: int) -> None:
                nonlocal failures
                failures += 1
                await real_hold(self, owner, generation)
                raise BackendUnavailable("injected: the hold's reply lost")

            monkeypatch.setattr(GenerationRegistry, "hold_unversioned", hold_losing_reply)
        held_at_drop: list[int] = []
        real_drop = handover_mod.Handover.drop_old

        async def drop_old(self: Any, accepted: Any) -> bool:
            held_at_drop.append((await registry.state()).held)
            return bool(await real_drop(self, accepted))

        monkeypatch.setattr(handover_mod.Handover, "drop_old", drop_old)

        rep = await reindex(settings)

    assert failures == 1 and held_at_drop == [0], (failures, held_at_drop)
    if lost == "release":
        assert rep.errors == [], rep.errors
    else:
        assert any("could not hold live writes" in e for e in rep.errors), rep.errors
