"""`agentmemd reindex` never loses what the live generation holds.

Each case could make a reindex switch to an incomplete generation and drop the old one:
the broker lost its log (tansu keeps it in memory; Apache Kafka has retention), the catch-up
after the switch failed, or a tenant was onboarded mid-build. Also: summaries keep their
fencing tokens, a heartbeat blip does not throw the build away, an abandoned build's
leftovers are dropped, and the build slot is held until the reindex ends.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka.errors import KafkaConnectionError

import daemon.reindex as reindex_mod
import daemon.reindex.handover as handover_mod
import daemon.reindex.replay as replay_mod
import daemon.reindex.slot as slot_mod
from daemon.launcher import free_port, start_tansu
from daemon.topics import ensure_topics
from graph.recompute import COMMUNITY_TOMBSTONE_S
from memory.config import ChunkingConfig
from memory.embedder import SentenceTransformerEmbedder
from memory.errors import BackendUnavailable, EmbedderError, NotFound, ReindexConflict, ReindexWouldLose, WritesHeld
from memory.generations import STALE_BUILD_S, index_spec
from memory.index import ChunkIndex, GenerationRegistry
from memory.keys import chunk_prefix, key_root, physical_name, registry_key, ver_key
from memory.records import COMMUNITY_PREFIX
from tests.conftest import unique
from tests.helpers import (
    agentmemd,
    daemon_and_client,
    eventually,
    in_graph,
    isolated_settings,
    reindex,
    settings_env,
    topic_tenancy_daemon,
)

pytestmark = pytest.mark.integration


def doc(doc_id: str, version: int, text: str) -> dict[str, Any]:
    return {"event_id": uuid.uuid4().hex, "op": "upsert", "doc_id": doc_id, "version": version, "content": text}


def runbook(i: int) -> str:
    return f"Runbook {i}: the ledger-service raised ERR_SAFE_{i:04d} on db-{i % 3}.prod (ticket OPS-{2000 + i})."


async def _versions(daemon: Any, want: dict[str, int], tenant: str = "default") -> bool:
    return await daemon.index.versions(list(want), tenant) == want


def _chunking_change(settings: Any) -> Any:
    return settings.model_copy(update={"chunking": ChunkingConfig(max_tokens=64, overlap=8)})


async def _restarted_empty(broker: Any, settings: Any, log_dir: Path) -> Any:
    """tansu stopped and started again on the same address: its log is gone (it keeps it in
    memory), and the topics are created anew."""
    broker.stop()
    broker = start_tansu(settings.kafka_bootstrap, log_dir=log_dir)
    await ensure_topics(
        settings.kafka_bootstrap, settings.topics.all(), partitions=settings.topic_partitions, replication=1
    )
    return broker


async def test_a_broker_that_lost_its_log_loses_no_doc(redis_url: str, tmp_path: Path) -> None:
    """tansu restarted empty while Redis kept the index: with the same spec every doc is
    carried over from the old generation; with another spec the switch is refused."""
    bootstrap = f"127.0.0.1:{free_port()}"
    broker = start_tansu(bootstrap, log_dir=tmp_path)
    try:
        settings = isolated_settings(unique("reindex-lost-log"), bootstrap, redis_url)
        async with daemon_and_client(settings) as (daemon, client):
            want = {f"lost/{i}": 1 for i in range(5)}
            for d in want:
                await client.send(settings.topics.documents, doc(d, 1, runbook(int(d[-1]))), key=d)
            await client.send(settings.topics.documents, doc("lost/0", 2, runbook(100)), key="lost/0")
            want["lost/0"] = 2
            await client.send(settings.topics.documents, doc("gone", 1, runbook(200)), key="gone")
            delete = {"event_id": "del", "op": "delete", "doc_id": "gone", "version": 2}
            await client.send(settings.topics.documents, delete, key="gone")
            want["gone"] = 2  # a tombstone: no chunks, and an older upsert must stay refused
            await eventually(lambda: _versions(daemon, want), timeout=120, what="docs indexed")
            before = await _texts(daemon)

            broker = await _restarted_empty(broker, settings, tmp_path)
            registry = GenerationRegistry(daemon.redis, settings.index.name)

            with pytest.raises(ReindexWouldLose, match="gone from the topics") as refused:
                await reindex(_chunking_change(settings))
            assert "default/lost/3" in str(refused.value)
            state = await registry.state()
            assert state.active == 1 and state.building == 0

            rep = await reindex(settings)

            await daemon.index.state(fresh=True)  # the daemon's 1 s cache of the active generation
            assert rep.progress.carried == 6 and rep.old_dropped and rep.errors == [], rep
            assert (await registry.state()).active == rep.new_generation
            assert await daemon.index.versions(list(want)) == want
            assert await _texts(daemon) == before  # chunks verbatim, in the new generation
            hits = await daemon.index.search_text("@terms:(err_safe_0003)", k=5)  # and indexed there
            # (a community summary quoting the runbook may match too, if the daemon's own
            # recompute and summary ran meanwhile)
            assert [h.doc_id for h in hits if not h.doc_id.startswith(COMMUNITY_PREFIX)] == ["lost/3"]
            resurrect = await daemon.index.apply("gone", 1, [], np.zeros((0, 1), np.float32))
            assert not resurrect.applied and not await daemon.index.chunk_ids("gone")
    finally:
        broker.stop()


async def _chunk_hashes(client: Any, name: str) -> dict[str, tuple[bytes, bytes, str]]:
    """chunk id -> (text, vector, idents) of the active generation's doc chunks."""
    out: dict[str, tuple[bytes, bytes, str]] = {}
    active = int(await client.hget(registry_key(name), "active"))
    async for key in client.scan_iter(match=f"{chunk_prefix(name, active)}*", count=1000):
        cid, text, vector, idents, kind = await client.hmget(key, ["chunk_id", "text", "vector", "idents", "kind"])
        if cid is not None and kind != b"community":
            out[cid.decode()] = (text, vector, idents.decode())
    return out


async def test_an_analyzer_upgrade_on_a_broker_that_lost_its_log_loses_no_doc(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release that changes the text analysis (ANALYZER_VERSION) over an index whose events
    the broker no longer holds: the new process refuses the old generation and says to
    reindex; the reindex carries every doc over, vectors as they were, with its terms and
    identifiers analyzed again. Before, the switch was refused (or, with --allow-losses,
    every doc lost): an upgrade of the embedded default, whose broker keeps no log over a
    restart, could not keep its memory."""
    import memory.generations as generations_mod
    import memory.index.codec as index_mod

    # The previous release: analyzer 1, which (here) wrote no identifiers at all.
    monkeypatch.setattr(generations_mod, "ANALYZER_VERSION", 1)
    monkeypatch.setattr(index_mod, "identifiers", lambda text, limit=256: [])
    bootstrap = f"127.0.0.1:{free_port()}"
    broker = start_tansu(bootstrap, log_dir=tmp_path)
    try:
        settings = isolated_settings(unique("reindex-analyzer"), bootstrap, redis_url)
        async with daemon_and_client(settings) as (daemon, client):
            want = {f"an/{i}": 1 for i in range(4)}
            for d in want:
                i = int(d[-1])
                text = f"{runbook(i)} Then ERR-LEDGER-{i:04d} on every retry."
                await client.send(settings.topics.documents, doc(d, 1, text), key=d)
            await eventually(lambda: _versions(daemon, want), timeout=120, what="docs indexed")
            before = await _chunk_hashes(daemon.redis, settings.index.name)
            assert before and all(idents == "" for _, _, idents in before.values())

            broker = await _restarted_empty(broker, settings, tmp_path)
            monkeypatch.undo()  # the new release

            dims = daemon.embedder.dims
            spec = index_spec(settings.index, model=settings.embedding.model, dims=dims, chunking=settings.chunking)
            upgraded = ChunkIndex(client=daemon.redis, cfg=settings.index, dims=dims, spec=spec)
            why = await upgraded.mismatch()
            assert why is not None and "text analysis version 1" in why and "agentmemd reindex" in why, why

            rep = await reindex(settings)

            assert rep.progress.carried == 4 and rep.old_dropped and rep.errors == [], rep
            assert await upgraded.mismatch() is None
            assert await upgraded.versions(list(want)) == want
            after = await _chunk_hashes(daemon.redis, settings.index.name)
            assert set(after) == set(before)
            for cid, (text, vector, idents) in after.items():
                assert (text, vector) == before[cid][:2], cid  # the same chunks and vectors
                i = int(cid.split("/")[1][0])
                assert f"errledger{i:04d}" in idents.split() and f"ops{2000 + i}" in idents.split(), idents
            hits = await upgraded.search_text("@idents:(errledger0002)", k=5)
            assert [h.doc_id for h in hits if not h.doc_id.startswith(COMMUNITY_PREFIX)] == ["an/2"]
    finally:
        broker.stop()


async def test_a_log_lost_mid_replay_ends_the_replay_and_loses_no_doc(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tansu restarted empty while the replay reads: it no longer waits forever for records
    below the old end offsets; the docs it did not get are carried over."""
    bootstrap = f"127.0.0.1:{free_port()}"
    broker = start_tansu(bootstrap, log_dir=tmp_path)
    try:
        settings = isolated_settings(unique("reindex-lost-mid"), bootstrap, redis_url)
        async with daemon_and_client(settings) as (daemon, client):
            want = {f"lost/{i}": 1 for i in range(20)}
            for i, d in enumerate(want):
                await client.send(settings.topics.documents, doc(d, 1, runbook(i)), key=d)
            await eventually(lambda: _versions(daemon, want), timeout=120, what="docs indexed")

            restarted: list[bool] = []

            class LosesTheLog(replay_mod.AIOKafkaConsumer):  # type: ignore[misc,name-defined]
                """The replay's real consumer, held from fetching until it has read the end
                offsets; right then the broker restarts empty (no prefetch races it)."""

                async def seek_to_beginning(self, *partitions: Any) -> Any:
                    if not restarted:
                        self.pause(*partitions)
                    return await super().seek_to_beginning(*partitions)

                async def end_offsets(self, partitions: Any) -> Any:
                    ends = await super().end_offsets(partitions)
                    if not restarted:
                        nonlocal broker
                        restarted.append(True)
                        broker.stop()
                        broker = start_tansu(bootstrap, log_dir=tmp_path)
                        await ensure_topics(bootstrap, settings.topics.all(), partitions=2, replication=1)
                        self.resume(*self.paused())
                    return ends

            monkeypatch.setattr(replay_mod, "AIOKafkaConsumer", LosesTheLog)
            monkeypatch.setattr(replay_mod, "REPLAY_STALL_S", 1.0)
            rep = await reindex(settings)
            await daemon.index.state(fresh=True)
            assert restarted and rep.progress.applied == 0 and rep.progress.carried == 20, rep
            assert rep.old_dropped and await daemon.index.versions(list(want)) == want
    finally:
        broker.stop()


async def _texts(daemon: Any) -> dict[str, str]:
    ids = set()
    for i in range(5):
        ids |= await daemon.index.chunk_ids(f"lost/{i}")
    return await daemon.index.texts(sorted(ids))


async def _seed_and_summarize(settings: Any, daemon: Any, client: Any, n: int) -> set[str]:
    """``n`` runbooks indexed, communities recomputed and summarized: the summaries' doc ids."""
    seed = {f"safe/{i}": 1 for i in range(n)}
    for i, d in enumerate(seed):
        await client.send(settings.topics.documents, doc(d, 1, runbook(i)), key=d)
    await eventually(lambda: _versions(daemon, seed), timeout=120, what="seed indexed")
    await eventually(lambda: in_graph(daemon, seed), timeout=60, what="seed in the graph")
    await daemon.graph.service().recompute(force=True)

    async def summarized() -> bool:
        return (await daemon.graph.store().stale())[0] == 0

    await eventually(summarized, timeout=90, what="summaries written")
    return {r.doc_id for r in await daemon.index.community_records()}


@pytest.fixture
async def env(kafka_bootstrap: str, redis_url: str, request: pytest.FixtureRequest) -> Any:
    settings = isolated_settings(unique(request.node.nodeid), kafka_bootstrap, redis_url)
    async with daemon_and_client(settings) as (daemon, client):
        yield settings, daemon, client


async def test_a_failed_catch_up_never_loses_what_the_live_daemons_wrote(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A doc the live daemon wrote to N after the last pre-switch replay, and a catch-up that
    then fails every try: with the same spec the doc is carried over before N is dropped;
    with another spec N is kept and the report says so. The slot stays held meanwhile, and
    summaries arrive in N+1 at their fencing tokens."""
    settings, daemon, client = env
    summaries = await _seed_and_summarize(settings, daemon, client, 12)
    assert summaries
    tokens = await daemon.index.versions(sorted(summaries))
    assert set(tokens) == summaries

    real = replay_mod.Replayer.replay_to_end
    registry = GenerationRegistry(daemon.redis, settings.index.name)
    late: list[str] = []
    calls = 0

    async def flaky(self: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:  # the pre-switch check's replay; then a live write lands in N
            await real(self)
            d = f"late/{len(late)}"
            late.append(d)
            await client.send(settings.topics.documents, doc(d, 1, runbook(500 + len(late))), key=d)
            await eventually(lambda: _versions(daemon, {d: 1}), timeout=60, what="the live write in N")
            return
        if calls >= 3:  # after the switch
            with pytest.raises(ReindexConflict):
                await registry.reserve("intruder")
            raise KafkaConnectionError("injected: the broker went away during the catch-up")
        await real(self)

    monkeypatch.setattr(replay_mod.Replayer, "replay_to_end", flaky)
    monkeypatch.setattr(handover_mod, "CATCH_UP_TRIES", 2)

    rep = await reindex(settings)

    await daemon.index.state(fresh=True)  # the daemon's 1 s cache of the active generation
    assert any("catch-up after the switch failed" in e for e in rep.errors), rep.errors
    assert rep.progress.carried == 1 and rep.old_dropped, rep
    assert await daemon.index.versions(["late/0"]) == {"late/0": 1}
    assert (await registry.state()).building == 0  # released at the end
    # summaries carry their tokens: a late, older summary write is refused in N+1
    # (the late doc re-marked communities, so live workers may have written later tokens)
    after = await daemon.index.versions(sorted(summaries))
    assert set(after) == summaries and all(after[c] >= tokens[c] for c in summaries), (after, tokens)
    cid = sorted(summaries)[0]
    stale_write = await daemon.index.apply(cid, after[cid] - 1, [], np.zeros((0, 1), np.float32))
    assert not stale_write.applied

    calls = 0
    rep = await reindex(_chunking_change(settings))
    await daemon.index.state(fresh=True)  # the daemon's 1 s cache of the active generation
    assert not rep.old_dropped and any("was kept" in e and "default/late/1" in e for e in rep.errors), rep.errors
    assert await daemon.redis.exists(ver_key(settings.index.name, rep.old_generation, "default", "late/1"))
    assert "default/late/1" in (await registry.kept())[rep.old_generation]  # doctor shows why


async def test_a_tenant_onboarded_mid_build_is_replayed(
    kafka_bootstrap: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Topic tenancy: a tenant whose topic appears while the build runs is replayed by the
    catch-up (not merely carried over), so its docs are in the new generation."""
    name = unique("reindex-new-tenant")
    async with topic_tenancy_daemon(name, kafka_bootstrap, redis_url, ("a",)) as (daemon, client, settings):
        topic_a = f"{settings.topics.documents}.a"
        await client.send(topic_a, doc("a1", 1, runbook(1)), key="a1")
        await eventually(lambda: _versions(daemon, {"a1": 1}, "a"), timeout=120, what="tenant a indexed")
        real = replay_mod.Replayer.replay_to_end
        calls = 0

        async def onboard_b(self: Any) -> None:
            nonlocal calls
            calls += 1
            await real(self)
            if calls == 1:
                topic_b = f"{settings.topics.documents}.b"
                await ensure_topics(kafka_bootstrap, [topic_b], partitions=1, replication=1)
                await client.send(topic_b, doc("b1", 1, runbook(2)), key="b1")
                await eventually(lambda: _versions(daemon, {"b1": 1}, "b"), timeout=60, what="tenant b indexed live")

        monkeypatch.setattr(replay_mod.Replayer, "replay_to_end", onboard_b)
        rep = await reindex(settings)
        await daemon.index.state(fresh=True)  # the daemon's 1 s cache of the active generation
        assert rep.old_dropped and rep.errors == [] and rep.progress.carried == 0, rep
        assert rep.progress.applied == 2
        assert await daemon.index.versions(["a1"], "a") == {"a1": 1}
        assert await daemon.index.versions(["b1"], "b") == {"b1": 1}


async def test_a_heartbeat_blip_keeps_the_build_and_an_abandoned_build_is_dropped(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reindex that died mid-build left generation 2's index and keys: the next one takes
    the slot over and drops them. One failed heartbeat does not end that next build."""
    settings, daemon, client = env
    await client.send(settings.topics.documents, doc("hb/1", 1, runbook(7)), key="hb/1")
    await eventually(lambda: _versions(daemon, {"hb/1": 1}), timeout=120, what="doc indexed")

    registry = GenerationRegistry(daemon.redis, settings.index.name)
    dead, _ = await registry.reserve("reindex-dead")
    orphan = ChunkIndex(client=daemon.redis, cfg=settings.index, dims=daemon.embedder.dims, generation=dead)
    await orphan.ensure()
    await daemon.redis.set(ver_key(settings.index.name, dead, "default", "hb/1"), 1)
    await daemon.redis.hset(registry.key, "building_heartbeat", time.time() - 120)

    real_beat = GenerationRegistry.heartbeat
    beats = 0

    async def blip(self: GenerationRegistry, owner: str) -> None:
        nonlocal beats
        beats += 1
        if beats == 1:
            raise BackendUnavailable("injected: redis blipped")
        await real_beat(self, owner)

    monkeypatch.setattr(GenerationRegistry, "heartbeat", blip)
    monkeypatch.setattr(slot_mod, "HEARTBEAT_S", 0.02)
    rep = await reindex(settings)
    await daemon.index.state(fresh=True)  # the daemon's 1 s cache of the active generation
    assert beats >= 2 and rep.old_dropped and rep.errors == [], rep
    assert rep.new_generation == dead + 1
    listed = {x.decode() if isinstance(x, bytes) else x for x in await daemon.redis.execute_command("FT._LIST")}
    assert physical_name(settings.index.name, dead) not in listed
    assert not [k async for k in daemon.redis.scan_iter(match=key_root(settings.index.name, dead) + "*")]
    assert await daemon.index.versions(["hb/1"]) == {"hb/1": 1}


async def test_a_summary_removed_in_the_check_window_stays_removed(env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A community removed (its summary tombstoned) in N while the pre-switch check ran, and a
    catch-up that then fails: the tombstone still reaches N+1 before N is dropped, so the
    removed summary does not come back. (A review's probe, adopted.)"""
    settings, daemon, client = env
    cid = sorted(await _seed_and_summarize(settings, daemon, client, 8))[0]
    real = replay_mod.Replayer.replay_to_end
    calls = 0

    async def flaky(self: Any) -> None:
        nonlocal calls
        calls += 1
        if calls >= 3:
            raise KafkaConnectionError("injected: the broker went away during the catch-up")
        await real(self)
        if calls == 2:  # the pre-switch check's replay: the community is removed in N meanwhile
            token = await daemon.graph.store().fence()
            assert (await daemon.index.apply(cid, token, [], np.zeros((0, 1), np.float32))).applied

    monkeypatch.setattr(replay_mod.Replayer, "replay_to_end", flaky)
    monkeypatch.setattr(handover_mod, "CATCH_UP_TRIES", 1)
    rep = await reindex(settings)
    await daemon.index.state(fresh=True)
    assert rep.old_dropped and any("catch-up after the switch failed" in e for e in rep.errors), rep
    assert await daemon.index.chunk_ids(cid) == set()
    # the copied tombstone expires as the recompute's own do (a copy used to be kept forever)
    ttl = await daemon.redis.ttl(ver_key(settings.index.name, rep.new_generation, "default", cid))
    assert 0 < ttl <= COMMUNITY_TOMBSTONE_S, ttl


async def test_a_build_that_died_after_its_switch_is_never_dropped(env: Any) -> None:
    """The slot of a reindex that died after its switch names the active generation: the next
    claim takes the slot over but reports nothing to drop. The generation it switched away
    from stays marked kept (its final check never ran: writes made during the switch may be
    only there), so drop-generation refuses it without --force."""
    settings, daemon, _ = env
    registry = GenerationRegistry(daemon.redis, settings.index.name)
    old = (await registry.state()).active
    gen, _ = await registry.reserve("reindex-a")
    await ChunkIndex(client=daemon.redis, cfg=settings.index, dims=daemon.embedder.dims, generation=gen).ensure()
    await registry.switch("reindex-a", gen, (await registry.state()).spec)  # then A dies: no release
    await daemon.redis.hset(registry.key, "building_heartbeat", time.time() - 120)
    nxt, abandoned = await registry.reserve("reindex-b")
    assert (nxt, abandoned) == (gen + 1, 0)
    assert (await registry.state()).active == gen
    await registry.release("reindex-b")
    assert "had not checked" in (await registry.kept())[old]
    with pytest.raises(ReindexWouldLose):
        await reindex_mod.drop_generation(settings, daemon.redis, old)


async def test_a_summary_the_model_fails_on_keeps_the_old_generation_and_the_rest_switches(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One community summary the model fails on: the reindex still switches, every other
    summary copied at its token, and keeps the old generation, naming the one the new lacks.
    (Before, that one summary ended the whole reindex before its switch.)"""
    settings, daemon, client = env
    summaries = await _seed_and_summarize(settings, daemon, client, 8)
    bad = sorted(await daemon.index.community_records(), key=lambda r: r.doc_id)[0]
    real = SentenceTransformerEmbedder.embed_documents

    async def failing(self: Any, texts: Any) -> Any:
        if bad.text in texts:
            raise EmbedderError("injected: the model fails on this summary")
        return await real(self, texts)

    monkeypatch.setattr(SentenceTransformerEmbedder, "embed_documents", failing)
    rep = await reindex(settings)
    await daemon.index.state(fresh=True)
    assert rep.new_generation == rep.old_generation + 1 and not rep.old_dropped, rep
    assert any(f"default/{bad.doc_id}" in e and "kept" in e for e in rep.errors), rep.errors
    others = sorted(summaries - {bad.doc_id})
    assert set(await daemon.index.versions(others)) == set(others)  # served by the new generation


async def test_drop_generation_drops_what_was_kept_and_refuses_what_is_live(env: Any) -> None:
    """`agentmemd drop-generation N`: never the active generation nor one a live reindex is
    building; one a reindex kept for missing docs only with --force; then its index, its keys
    and its registry notes are gone, and nothing of the active generation is touched."""
    settings, daemon, client = env
    await client.send(settings.topics.documents, doc("drop/1", 1, runbook(3)), key="drop/1")
    await eventually(lambda: _versions(daemon, {"drop/1": 1}), timeout=120, what="doc indexed")
    registry = GenerationRegistry(daemon.redis, settings.index.name)
    active = (await registry.state()).active
    kept, _ = await registry.reserve("reindex-kept")  # a generation left beside the active one
    await ChunkIndex(client=daemon.redis, cfg=settings.index, dims=daemon.embedder.dims, generation=kept).ensure()
    await daemon.redis.set(ver_key(settings.index.name, kept, "default", "drop/1"), 1)
    await registry.release("reindex-kept")
    await registry.mark_kept(kept, "1 doc(s) missing in the new one")
    env_vars = settings_env(settings)

    res = await agentmemd(["drop-generation", str(active)], env_vars)
    assert res.returncode == 1 and "active one" in res.stdout + res.stderr, res
    res = await agentmemd(["drop-generation", str(kept)], env_vars)
    assert res.returncode == 1 and "--force" in res.stdout + res.stderr, res
    building, _ = await registry.reserve("reindex-live")
    await ChunkIndex(client=daemon.redis, cfg=settings.index, dims=daemon.embedder.dims, generation=building).ensure()
    try:
        with pytest.raises(ReindexConflict, match="running reindex"):
            await reindex_mod.drop_generation(settings, daemon.redis, building)
    finally:
        await registry.release("reindex-live")
        await ChunkIndex(client=daemon.redis, cfg=settings.index, dims=1, generation=building).drop()
    with pytest.raises(NotFound):
        await reindex_mod.drop_generation(settings, daemon.redis, 99)

    res = await agentmemd(["drop-generation", str(kept), "--force"], env_vars)
    # Its two keys: the version written above and the directory's flag (created empty).
    assert res.returncode == 0 and f"generation {kept} dropped (2 keys)" in res.stdout, res
    listed = {x.decode() if isinstance(x, bytes) else x for x in await daemon.redis.execute_command("FT._LIST")}
    assert physical_name(settings.index.name, kept) not in listed
    assert not [k async for k in daemon.redis.scan_iter(match=key_root(settings.index.name, kept) + "*")]
    assert kept not in await registry.kept()
    await daemon.index.state(fresh=True)
    assert (await registry.state()).active == active and await daemon.index.versions(["drop/1"]) == {"drop/1": 1}


async def test_a_forget_the_live_daemon_has_not_applied_stays_forgotten_in_the_new_build(env: Any) -> None:
    """The live generation still holds a session's turns when the reindex replays their
    forget: the new generation keeps the forget's tombstones, and the completeness check
    does not carry the turns back over from the old one. Before, forgotten turns (deleted
    without a trace) looked missing: they were copied back, or, once the live daemon had
    forgotten them too, the switch was refused as losing them."""
    settings, daemon, client = env
    turns = [f"transcript:fg-rx/s1/{n}" for n in (1, 2)]
    for n in (1, 2):
        body = {"event_id": f"t{n}", "agent_id": "fg-rx", "session_id": "s1", "turn": n, "content": runbook(n)}
        await client.send(settings.topics.transcripts, body, key="fg-rx/s1")
    keep = {"event_id": "k", "agent_id": "fg-rx", "session_id": "s2", "turn": 1, "content": runbook(9)}
    await client.send(settings.topics.transcripts, keep, key="fg-rx/s2")

    async def stored() -> bool:
        return all([await daemon.index.chunk_ids(d) for d in [*turns, "transcript:fg-rx/s2/1"]])

    await eventually(stored, timeout=120, what="turns indexed")
    await daemon.stop()  # the live generation will not see the forget before the reindex does
    forget = {"event_id": "f", "op": "forget", "agent_id": "fg-rx", "session_id": "s1"}
    await client.send(settings.topics.transcripts, forget, key="fg-rx/s1")

    rep = await reindex(settings)

    assert rep.errors == [] and rep.progress.carried == 0, rep
    # Each record replayed is counted once: the forget is one event, and the two turns it
    # forgets, replayed in the same batch, were superseded by it.
    p = rep.progress
    assert p.done == 4 and (p.applied, p.skipped, p.invalid, p.failed) == (2, 2, 0, 0), p
    fresh = ChunkIndex(client=daemon.redis, cfg=settings.index, dims=daemon.embedder.dims)
    assert [bool(await fresh.chunk_ids(d)) for d in turns] == [False, False]
    assert await fresh.chunk_ids("transcript:fg-rx/s2/1")


async def test_a_turn_forgotten_live_during_the_catch_up_stays_forgotten(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn's correction is below the catch-up's end offsets, its forget beyond them, and the
    live daemon applies the forget before the catch-up replays the correction: the last pass,
    with live unversioned writes held, replays the forget again. Before, the turn came back
    with the correction's text (turns carry no version to refuse the older event)."""
    settings, daemon, client = env
    turn = "transcript:hold/s1/1"

    def event(event_id: str, text: str) -> dict[str, Any]:
        return {"event_id": event_id, "agent_id": "hold", "session_id": "s1", "turn": 1, "content": text}

    async def text_is(want: str | None) -> bool:
        ids = await daemon.index.chunk_ids(turn)
        if want is None:
            return not ids
        return bool(ids) and want in "".join((await daemon.index.texts(sorted(ids))).values())

    await client.send(settings.topics.transcripts, event("t1", "the first text of the turn"), key="hold/s1")
    await eventually(lambda: text_is("first text"), timeout=120, what="the turn indexed")

    real_to_end, real_apply = replay_mod.Replayer.replay_to_end, replay_mod.Replayer._apply
    corrected = forgotten = False

    async def to_end(self: Any) -> None:
        nonlocal corrected
        if self.switched and not corrected:  # the first pass after the switch: a correction below its ends
            corrected = True
            await client.send(settings.topics.transcripts, event("t2", "a corrected text"), key="hold/s1")
            await eventually(lambda: text_is("corrected text"), timeout=60, what="the live correction")
        await real_to_end(self)

    async def apply(self: Any, topic: str, records: list[Any]) -> None:
        nonlocal forgotten
        ids = {json.loads(r.value).get("event_id") for r in records}
        if self.switched and "t2" in ids and not forgotten:  # the live daemon forgets it first
            forgotten = True
            forget = {"event_id": "f", "op": "forget", "agent_id": "hold", "session_id": "s1"}
            await client.send(settings.topics.transcripts, forget, key="hold/s1")
            await eventually(lambda: text_is(None), timeout=60, what="the live forget")
        await real_apply(self, topic, records)

    monkeypatch.setattr(replay_mod.Replayer, "replay_to_end", to_end)
    monkeypatch.setattr(replay_mod.Replayer, "_apply", apply)

    rep = await reindex(settings)

    assert forgotten and rep.errors == [], rep
    await daemon.index.state(fresh=True)
    assert await text_is(None)
    registry = GenerationRegistry(daemon.redis, settings.index.name)
    assert (await registry.state()).held == 0  # released: live turns are written again
    await client.send(settings.topics.transcripts, event("t3", "written after the reindex"), key="hold/s1")
    await eventually(lambda: text_is("after the reindex"), timeout=60, what="a turn written after the hold")


async def test_a_hold_refuses_live_unversioned_writes_only_while_its_reindex_lives(env: Any) -> None:
    """``hold_unversioned`` makes the daemons' unversioned writes wait (``WritesHeld``, an
    outage: retried, nothing committed); versioned writes go on, and a hold whose reindex
    stopped beating lapses with its build slot."""
    settings, daemon, _ = env
    registry = GenerationRegistry(daemon.redis, settings.index.name)
    active = (await registry.state()).active
    empty = np.zeros((0, daemon.embedder.dims), np.float32)
    owner = "reindex-test-hold"
    await registry.reserve(owner)
    try:
        with pytest.raises(ReindexConflict):
            await registry.hold_unversioned("someone-else", active)
        await registry.hold_unversioned(owner, active)
        with pytest.raises(WritesHeld):
            await daemon.index.apply("held/turn", None, [], empty)
        assert (await daemon.index.apply("held/doc", 3, [], empty)).applied
        # the reindex stopped beating: its hold lapses with its slot
        await daemon.redis.hset(registry.key, "building_heartbeat", str(time.time() - 2 * STALE_BUILD_S))
        assert (await daemon.index.apply("held/turn", None, [], empty)).applied
        await daemon.redis.hset(registry.key, "building_heartbeat", str(time.time()))
        await registry.release_unversioned(owner)
        assert (await registry.state()).held == 0
        await registry.hold_unversioned(owner, active)
    finally:
        await registry.release(owner)
    assert (await registry.state()).held == 0  # the slot's release ends its hold too
    assert (await daemon.index.apply("held/turn2", None, [], empty)).applied
