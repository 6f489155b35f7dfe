"""`agentmemd reindex`: a rebuild from Kafka into a new generation while the daemon serves and ingests."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from daemon.instance import Daemon
from daemon.launcher import free_port
from daemon.reindex import reindex as build
from daemon.settings import Settings
from graph.store import GraphStore
from memory.config import ChunkingConfig
from memory.embed_worker import CRASH_MARKER_ENV
from memory.embedder import SentenceTransformerEmbedder
from memory.errors import BackendUnavailable, ReindexWouldLose
from memory.index import GenerationRegistry
from memory.metrics import CHUNKS_REUSED
from memory.schema import physical_name
from tests.conftest import unique
from tests.helpers import (
    PlainClient,
    agentmemd,
    daemon_and_client,
    eventually,
    isolated_settings,
    reindex,
    settings_env,
    start_daemon,
    stored_chunks,
)

pytestmark = pytest.mark.integration

N_DOCS = 24
# ~80 more tokens: one chunk at 254 tokens, two or more at 64
LONG = 3 * "The on-call engineer checked the connection pool, the replica lag and the queue depth first. "


def doc(i: int, version: int, extra: str = "") -> dict[str, Any]:
    return {
        "event_id": uuid.uuid4().hex,
        "op": "upsert",
        "doc_id": f"rx/{i}",
        "version": version,
        "content": f"Runbook {i}: the payments-service raised ERR_RX_{i:04d} on db-{i % 3}.prod "
        f"(ticket OPS-{1000 + i}). {extra}",
        "metadata": {"env": "production", "service": "payments-service"},
    }


async def _all_indexed(daemon: Daemon, ids: dict[str, int]) -> bool:
    versions = await daemon.index.versions(list(ids))
    return versions == ids


@pytest.fixture
async def env(
    kafka_bootstrap: str, redis_url: str, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Settings, Daemon, PlainClient]]:
    name = unique(request.node.nodeid)
    settings = isolated_settings(name, kafka_bootstrap, redis_url)
    async with daemon_and_client(settings) as (daemon, client):
        yield settings, daemon, client


async def _seed(daemon: Daemon, client: PlainClient) -> None:
    for i in range(N_DOCS):
        await client.send(client.topics.documents, doc(i, 1), key=f"rx/{i}")
    await eventually(
        lambda: _all_indexed(daemon, {f"rx/{i}": 1 for i in range(N_DOCS)}), timeout=120, what="seed docs indexed"
    )
    assert daemon.graph is not None
    await daemon.graph.service().recompute(force=True)

    async def summarized() -> bool:
        return (await daemon.graph.store().stale())[0] == 0  # type: ignore[union-attr]

    await eventually(summarized, timeout=90, what="community summaries written")


async def test_reindex_switches_atomically_while_queries_and_writes_go_on(
    env: tuple[Settings, Daemon, PlainClient],
) -> None:
    """Every query during the rebuild is answered correctly; writes made meanwhile survive the switch."""
    settings, daemon, client = env
    await _seed(daemon, client)
    communities_before = {r.doc_id for r in await daemon.index.community_records()}
    assert communities_before, "the seed corpus should form communities"

    answered: list[int] = []
    wrong: list[str] = []
    stop = asyncio.Event()

    async def ask_forever() -> None:
        i = 0
        while not stop.is_set():
            k = i % N_DOCS
            _, reply = await client.ask({"query_id": f"q{i}", "search_text": f"ERR_RX_{k:04d}", "top_k": 3})
            top = (reply.get("results") or [{}])[0]
            if top.get("doc_id") != f"rx/{k}":
                wrong.append(f"q{i}: {reply}")
            answered.append(i)
            i += 1

    async def write_meanwhile() -> None:
        # updates of old docs and new docs, published while the replay runs
        for i in range(6):
            await client.send(client.topics.documents, doc(i, 2, f"Fixed in release R{i}."), key=f"rx/{i}")
            await client.send(client.topics.documents, doc(100 + i, 1), key=f"rx/{100 + i}")
            await asyncio.sleep(0.3)

    phases: list[str] = []
    askers = asyncio.create_task(ask_forever())
    writer = asyncio.create_task(write_meanwhile())
    rep = await reindex(settings, on_progress=lambda p: phases.append(p.phase))
    await writer
    # the daemon applies the last writes to whichever generation is active
    want = {f"rx/{i}": 1 for i in range(6, N_DOCS)} | {f"rx/{i}": 2 for i in range(6)}
    want |= {f"rx/{100 + i}": 1 for i in range(6)}
    await eventually(lambda: _all_indexed(daemon, want), timeout=60, what="writes made during the rebuild")
    await asyncio.sleep(1.0)  # a few more queries against the new generation
    stop.set()
    await askers

    assert not wrong, wrong[:3]
    assert len(answered) >= 10, "queries kept being answered during the rebuild"
    assert rep.old_generation == 1 and rep.new_generation == 2 and rep.old_dropped
    assert rep.progress.done >= N_DOCS and rep.progress.invalid == 0 and rep.progress.failed == 0
    assert "switching" in phases and phases[-1] == "done"

    redis = daemon.redis
    registry = GenerationRegistry(redis, settings.index.name)
    state = await registry.state()
    assert state.active == 2 and state.building == 0
    # the dropped generation's notes went with it (no spec:N is left behind by a reindex)
    notes = {k.decode() for k in await redis.hgetall(registry.key)}
    assert not [k for k in notes if k.endswith(":1")], notes
    indexes = {x.decode() for x in await redis.execute_command("FT._LIST")}
    assert physical_name(settings.index.name, 2) in indexes and physical_name(settings.index.name, 1) not in indexes
    assert not [k async for k in redis.scan_iter(match=f"{settings.index.name}:g1:*")], "old generation left keys"
    # the new generation holds exactly the latest state of every doc, and the summaries
    chunks = await stored_chunks(redis, settings.index.name)
    assert {c.rsplit("_p", 1)[0] for c in chunks} == set(want)
    assert all("Fixed in release" in chunks[f"rx/{i}_p0"] for i in range(6))
    assert {r.doc_id for r in await daemon.index.community_records()} >= communities_before
    _, reply = await client.ask({"query_id": "after", "search_text": "release R3", "top_k": 1})
    assert reply["results"][0]["doc_id"] == "rx/3"


async def test_an_edit_right_after_a_switch_reuses_vectors_from_the_live_index(
    env: tuple[Settings, Daemon, PlainClient],
) -> None:
    """A daemon that still holds the old generation in its cache looks vectors up in the index
    searches see: an edit lands (not dead-lettered for the dropped index) and keeps its vectors;
    and a read of chunk texts (what a summary is written from) finds them in the live generation."""
    settings, daemon, client = env
    for i in range(4):
        await client.send(client.topics.documents, doc(i, 1, LONG), key=f"rx/{i}")
    await eventually(lambda: _all_indexed(daemon, {f"rx/{i}": 1 for i in range(4)}), timeout=120, what="indexed")
    stale = await daemon.index.state()
    assert stale.active == 1
    rep = await reindex(settings)
    assert rep.new_generation == 2 and rep.old_dropped
    # The daemon still holds the state from before the switch, as it may for up to a second
    # (any write it made meanwhile would have refreshed it).
    daemon.index.STATE_TTL_S = 3600.0
    daemon.index._state, daemon.index._state_at = stale, time.monotonic()
    reused = CHUNKS_REUSED.labels(client.topics.documents)._value.get()
    # the same text, so every chunk's vector is stored under its key in generation 2.
    # Waited for by its write ack, not by its stored version: the version shows as soon as
    # the chunks are written, before the graph hook runs and the batch's reuse is counted.
    cid = uuid.uuid4().hex
    headers = [("reply_to", client.reply_topic.encode()), ("correlation_id", cid.encode())]
    await client.send(client.topics.documents, doc(2, 2, LONG), key="rx/2", headers=headers)
    _, ack = await client.reply(cid, timeout=60)
    assert ack["status"] == "indexed" and ack["version"] == 2, ack
    assert await daemon.index.versions(["rx/2"]) == {"rx/2": 2}
    assert CHUNKS_REUSED.labels(client.topics.documents)._value.get() > reused
    # A read for a summary, with the same stale state, finds the texts in the live generation.
    daemon.index._state, daemon.index._state_at = stale, time.monotonic()
    texts = await daemon.index.texts(["rx/1_p0", "rx/3_p0"])
    assert sorted(texts) == ["rx/1_p0", "rx/3_p0"] and "ERR_RX_0003" in texts["rx/3_p0"]


@pytest.mark.timeout(360)  # above the reindex command's own 300 s
async def test_reindex_with_new_chunking_pauses_old_daemons_until_restarted(
    env: tuple[Settings, Daemon, PlainClient], tmp_path: Path
) -> None:
    """`agentmemd reindex` with other settings: old daemons stop writing and say why; nothing is lost."""
    settings, daemon, client = env
    # An error code at the end: in the one 254-token chunk now, in a later chunk at 64 tokens.
    for i in range(8):
        late = f"{LONG} Escalated with ERR_ESC_{7000 + i}."
        await client.send(client.topics.documents, doc(i, 1, late), key=f"rx/{i}")
    await eventually(lambda: _all_indexed(daemon, {f"rx/{i}": 1 for i in range(8)}), timeout=120, what="indexed")
    graph = GraphStore(client=daemon.redis, name=settings.index.name)

    async def graph_has_all() -> bool:  # the graph is written right after each doc's chunks
        return len(await graph.doc_ids()) == 8

    await eventually(graph_has_all, what="every doc in the graph")

    new_env = {**settings_env(settings), "AGENTMEM_CHUNKING__MAX_TOKENS": "64", "AGENTMEM_CHUNKING__OVERLAP": "8"}
    res = await agentmemd(["reindex"], new_env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "generation 2 is live (was 1)" in res.stdout and "8 applied" in res.stdout
    assert "8 graph docs re-pointed to the new chunks" in res.stdout, res.stdout
    # the progress bar, not a log line per replayed doc (an operator's stderr had hundreds)
    assert "ingest.doc_applied" not in res.stderr and "reindex.build_started" not in res.stderr
    # Not at a terminal: a line per phase as it starts, and the switch said when it happens,
    # before the catch-up, not only in the summary at the end.
    said = " ".join(res.stderr.split())
    assert "generation 2: replaying" in said and "generation 2: checking" in said, res.stderr
    # whole lines, for grep, and no bar's last frame
    assert any(
        line.startswith("switched: generation 2") and line.endswith("restart them with these")
        for line in res.stderr.splitlines()
    ), res.stderr
    assert "━" not in res.stderr, res.stderr
    switched = said.index("switched: generation 2 serves queries now")
    assert switched < said.index("generation 2: catching up") < said.index("note: it was built with other"), said

    # the graph follows the new chunks: each late error code points at the chunk that now holds it
    nodes, _ = await graph.graph()
    texts = await stored_chunks(daemon.redis, settings.index.name)
    for i in range(8):
        keys = [k for k, (name, _) in nodes.items() if f"ERR_ESC_{7000 + i}" in name]
        assert len(keys) == 1, (i, keys)
        (refs,) = (await graph.chunks_of_each(keys)).values()
        assert refs and all(f"ERR_ESC_{7000 + i}" in texts[c] for c in refs), (refs, [texts.get(c) for c in refs])
        assert all(not c.endswith("_p0") for c in refs), refs
    again = await agentmemd(["graph", "repoint"], new_env)
    assert again.returncode == 0 and "8 graph docs re-pointed" in again.stdout, again.stdout + again.stderr

    # doctor with the old settings names the mismatch; with the new ones all is well
    old_doc = await agentmemd(["doctor"], settings_env(settings))
    assert old_doc.returncode == 1 and "✗ index generation" in old_doc.stdout and "chunking=64/8" in old_doc.stdout

    # the old daemon (254-token chunks) now refuses to write or embed queries for this index
    why = await daemon.index.mismatch()
    assert why is not None and "chunking=64/8" in why
    _, reply = await client.ask({"query_id": "old", "search_text": "ERR_RX_0003", "top_k": 3})
    assert reply["error"]["code"] == "unavailable" and "restart" in reply["error"]["message"]
    # the BM25 and identifier legs alone too (their terms come from this process's analysis)
    bm25_only = {"query_id": "old-bm25", "search_text": "ERR_RX_0003", "hybrid_params": {"dense_weight": 0}}
    _, reply = await client.ask(bm25_only)
    assert reply["error"]["code"] == "unavailable" and "restart" in reply["error"]["message"], reply
    await client.send(client.topics.documents, doc(50, 1, LONG), key="rx/50")
    await asyncio.sleep(2)
    assert await daemon.index.versions(["rx/50"]) == {}  # not written, and not committed either
    await daemon.stop()

    # a daemon with the new settings picks the uncommitted event up and serves queries
    new_settings = settings.model_copy(update={"chunking": ChunkingConfig(max_tokens=64, overlap=8)})
    fresh = await start_daemon(new_settings)
    try:
        await eventually(lambda: _all_indexed(fresh, {"rx/50": 1}), timeout=90, what="the paused event applied")
        assert await fresh.index.mismatch() is None
        _, reply = await client.ask({"query_id": "new", "search_text": "ERR_RX_0003", "top_k": 3})
        assert reply["results"][0]["doc_id"] == "rx/3", reply
        chunks = await stored_chunks(fresh.redis, settings.index.name)
        assert len(chunks) >= 18, "64-token chunks split every doc in two or more"
    finally:
        await fresh.stop()


async def test_reindex_since_a_time_replays_only_later_events(env: tuple[Settings, Daemon, PlainClient]) -> None:
    """--since replays what was published from that time on. Older docs are not lost: with
    the same settings they are carried over from the old generation; with a new chunking the
    switch is refused until losses are allowed, and then the new generation holds only the
    replayed docs."""
    settings, daemon, client = env
    for i in range(4):
        await client.send(client.topics.documents, doc(i, 1), key=f"rx/{i}")
    await eventually(lambda: _all_indexed(daemon, {f"rx/{i}": 1 for i in range(4)}), timeout=120, what="old docs")
    await asyncio.sleep(1.0)
    since_ms = int(time.time() * 1000)
    for i in range(4, 7):
        await client.send(client.topics.documents, doc(i, 1), key=f"rx/{i}")
    await eventually(lambda: _all_indexed(daemon, {f"rx/{i}": 1 for i in range(7)}), timeout=60, what="new docs")

    rep = await reindex(settings, since_ms=since_ms)
    assert rep.progress.done == 3 and rep.progress.applied == 3 and rep.progress.carried == 4
    assert not rep.settings_changed  # running daemons carry on
    chunks = await stored_chunks(daemon.redis, settings.index.name)
    assert {c.rsplit("_p", 1)[0] for c in chunks} == {f"rx/{i}" for i in range(7)}

    rechunked = settings.model_copy(update={"chunking": ChunkingConfig(max_tokens=64, overlap=8)})
    with pytest.raises(ReindexWouldLose, match="rx/0"):
        await reindex(rechunked, since_ms=since_ms)
    rep = await reindex(rechunked, since_ms=since_ms, allow_losses=True)
    assert rep.progress.done == 3 and rep.progress.carried == 0 and rep.old_dropped
    assert rep.settings_changed  # the running daemon, on the old chunking, now refuses it
    chunks = await stored_chunks(daemon.redis, settings.index.name)
    assert {c.rsplit("_p", 1)[0] for c in chunks} == {"rx/4", "rx/5", "rx/6"}


async def test_a_reindex_keeps_the_history_that_fell_out_of_the_replay(
    env: tuple[Settings, Daemon, PlainClient],
) -> None:
    """A doc whose latest event the replay holds comes out at the version the old generation
    holds, so it is not copied: its earlier versions, older than the replay, come over from
    the old generation's history."""
    settings, daemon, client = env
    for v in (1, 2):
        await client.send(client.topics.documents, doc(0, v, f"edit {v}"), key="rx/0")
        await eventually(lambda v=v: _all_indexed(daemon, {"rx/0": v}), timeout=60, what=f"v{v}")
    await asyncio.sleep(1.0)
    since_ms = int(time.time() * 1000)
    await client.send(client.topics.documents, doc(0, 3, "edit 3"), key="rx/0")
    await eventually(lambda: _all_indexed(daemon, {"rx/0": 3}), timeout=60, what="v3")
    before = (await daemon.index.history(["rx/0"]))["rx/0"]
    assert [(v.version, v.content.endswith(f"edit {v.version}")) for v in before] == [(2, True), (1, True)]

    rep = await reindex(settings, since_ms=since_ms)
    assert rep.progress.done == 1 and rep.progress.carried == 0
    assert (await daemon.index.state(fresh=True)).active != 1
    assert (await daemon.index.history(["rx/0"]))["rx/0"] == before


# Three builds, each restarting its crashed worker twice (a model load each): minutes when the
# suite's 3 processes share 2 cores, so the hang guard is 360 s, not 180.
@pytest.mark.timeout(360)
async def test_reindex_refuses_to_switch_when_the_new_build_would_lose_docs(
    env: tuple[Settings, Daemon, PlainClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A doc the live generation serves but the new build cannot embed (here: its worker
    crashes on it). With the same spec it is carried over from the old generation; with a new
    one (here: chunking) it stops the switch, and nothing changes until the operator allows
    the loss."""
    settings, daemon, client = env
    marker = f"crash-{uuid.uuid4().hex[:8]}"
    for i, extra in ((0, ""), (1, f"Marked {marker}."), (2, "")):
        await client.send(client.topics.documents, doc(i, 1, extra), key=f"rx/{i}")
    await eventually(lambda: _all_indexed(daemon, {f"rx/{i}": 1 for i in range(3)}), what="docs live")
    registry = GenerationRegistry(daemon.redis, settings.index.name)

    # Only workers spawned from now on (the rebuilds') crash on the marked doc: one embedder,
    # loaded under the marker and lent to the three builds, spares two model loads; each
    # build still embeds through it and sees its worker crash (it restarts on the next request).
    monkeypatch.setenv(CRASH_MARKER_ENV, marker)
    same = settings.model_copy(update={"ingest": settings.ingest.model_copy(update={"embed_crash_limit": 1})})
    marked = await SentenceTransformerEmbedder.load(same.embedding)
    try:
        rep = await build(same, embedder=marked)
        assert rep.progress.failed >= 1 and rep.progress.carried == 1 and rep.old_dropped, rep
        await daemon.index.state(fresh=True)
        assert await daemon.index.chunk_ids("rx/1")

        before = (await registry.state()).active
        rechunked = same.model_copy(update={"chunking": ChunkingConfig(max_tokens=64, overlap=8)})
        with pytest.raises(ReindexWouldLose) as refused:
            await build(rechunked, embedder=marked)
        assert "rx/1" in str(refused.value) and "rx/0" not in str(refused.value)
        state = await registry.state()
        assert state.active == before and state.building == 0, state
        _, reply = await client.ask({"query_id": "still", "search_text": "ERR_RX_0001", "top_k": 1})
        assert reply["results"][0]["doc_id"] == "rx/1", reply

        rep = await build(rechunked, allow_losses=True, embedder=marked)
        assert rep.new_generation != before and rep.progress.failed >= 1

        async def switched_without_rx1() -> bool:
            return not await daemon.index.chunk_ids("rx/1") and bool(await daemon.index.chunk_ids("rx/0"))

        await eventually(switched_without_rx1, what="the new generation serves, without the lost doc")
    finally:
        marked.close()


async def test_a_reindex_with_no_redis_running_says_what_starts_it_before_loading_the_model(
    kafka_bootstrap: str,
) -> None:
    """Nothing runs (an upgrade's steps done in the wrong order): it fails naming the command
    that starts Redis, checked before the model loads, not with a bare connection error."""
    settings = isolated_settings(unique("reindex-no-redis"), kafka_bootstrap, f"redis://127.0.0.1:{free_port()}")
    with pytest.raises(BackendUnavailable, match=r"redis unreachable at .*`agentmemd up`"):
        await build(settings)


async def test_a_reindex_judges_a_claimed_turn_by_what_the_old_generation_holds(
    env: tuple[Settings, Daemon, PlainClient],
) -> None:
    """A's claim took turn 5 before --since; B's claim of turn 5 came after, was refused, and B
    sent its turn again as 6. The replay starts at B's refused claim: judged by the new
    generation alone (which lacks turn 5 until the carry-over) it wrote B at 5, the carry-over
    then kept it, and A's turn was lost with B's stored twice (decision 0069)."""
    settings, daemon, client = env

    def turn(n: int, text: str) -> dict[str, Any]:
        return {"event_id": uuid.uuid4().hex, "agent_id": "ag", "session_id": "s", "turn": n, "content": text,
                "if_absent": True}  # fmt: skip

    async def holds(n: int, text: str) -> bool:
        return (await daemon.index.turn_texts([f"transcript:ag/s/{n}"])).get(f"transcript:ag/s/{n}") == text

    await client.send(client.topics.transcripts, turn(5, "A said this."), key="ag/s")
    await eventually(lambda: holds(5, "A said this."), timeout=60, what="A's turn")
    await asyncio.sleep(1.0)
    since_ms = int(time.time() * 1000)
    await client.send(client.topics.transcripts, turn(5, "B said that."), key="ag/s")  # refused: A holds it
    await client.send(client.topics.transcripts, turn(6, "B said that."), key="ag/s")
    await eventually(lambda: holds(6, "B said that."), timeout=60, what="B's turn")
    assert await holds(5, "A said this.")

    rep = await reindex(settings, since_ms=since_ms)
    assert (rep.progress.applied, rep.progress.carried) == (1, 1), rep.progress  # B at 6; A at 5, carried over
    wanted = [{"agent_id": "ag", "session_id": "s", "turn": n} for n in (5, 6)]
    said: list[Any] = []

    async def both_read() -> bool:  # the daemon reads the new generation once it sees the switch
        _, reply = await client.ask({"query_id": uuid.uuid4().hex, "op": "get", "turns": wanted})
        said[:] = [i["content"] for i in reply["items"]]
        return None not in said

    await eventually(both_read, timeout=30, what="the turns read from the new generation")
    assert said == ["A said this.", "B said that."], said


async def test_a_reindex_replays_a_batched_log_to_its_end(env: tuple[Settings, Daemon, PlainClient]) -> None:
    """Events a producer batched (the CLI publishing a folder, up to 16 sends in flight):
    tansu's end offset counts a whole batch as one record, and a replay that stopped there
    left the rest of the batch out; with new chunking the switch was refused as if the
    events were gone. The replay reads to the log's end as the fetches give it (decision 0024)."""
    import json

    from aiokafka import AIOKafkaProducer

    settings, daemon, client = env
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", linger_ms=50)
    await producer.start()
    try:
        sent = [
            await producer.send(client.topics.documents, json.dumps(doc(i, 1)).encode(), key=b"x", partition=0)
            for i in range(12)
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    ids = {f"rx/{i}": 1 for i in range(12)}
    await eventually(lambda: _all_indexed(daemon, ids), timeout=120, what="the batch indexed")
    rechunked = settings.model_copy(update={"chunking": ChunkingConfig(max_tokens=64, overlap=8)})
    rep = await reindex(rechunked)
    assert rep.progress.applied == 12, rep.progress
    chunks = await stored_chunks(daemon.redis, settings.index.name)
    assert {c.rsplit("_p", 1)[0] for c in chunks} == set(ids)
