"""A new filter key over an index whose events the broker no longer holds: the reindex keeps
every doc and turn, and the new key filters them from their stored metadata."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from daemon.launcher import free_port, start_tansu
from daemon.settings import Settings
from daemon.topics import ensure_topics
from memory.config import RetrievalConfig
from memory.conversation import turn_doc_id
from memory.errors import IndexMismatch, InvalidRequest, ReindexWouldLose
from memory.generations import index_spec
from memory.index import ChunkIndex
from memory.keys import chunk_prefix, registry_key
from memory.records import COMMUNITY_PREFIX
from memory.retrieval import Retriever
from memory.search_spec import SearchSpec
from tests.conftest import unique
from tests.helpers import daemon_and_client, eventually, isolated_settings, reindex, start_daemon

pytestmark = pytest.mark.integration

DOCS = {
    "fk/alpha": ("Runbook: the ledger-service pool exhausts under the nightly batch.", {"user_id": "u1"}),
    "fk/beta": ("Runbook: the ledger-service pool exhausts when replicas lag.", {"user_id": "u2"}),
}
TURNS = [
    ("user", "The ledger-service pool exhausted again during the nightly batch.", {"user_id": "u1"}),
    ("assistant", "I raised the ledger-service pool size to 40 for the nightly batch.", {}),
    ("user", "Thanks, the ledger-service nightly batch finished.", {"user_id": "u1"}),
]


def _with_keys(settings: Settings, keys: list[str]) -> Settings:
    raw = settings.model_dump()
    raw["index"]["extra_filter_keys"] = keys
    return Settings.model_validate(raw)


async def _stored(client: Any, name: str) -> dict[str, tuple[bytes, bytes]]:
    """chunk id -> (text, vector) of the active generation's doc and turn chunks."""
    out: dict[str, tuple[bytes, bytes]] = {}
    active = int(await client.hget(registry_key(name), "active"))
    async for key in client.scan_iter(match=f"{chunk_prefix(name, active)}*", count=1000):
        cid, text, vector, kind = await client.hmget(key, ["chunk_id", "text", "vector", "kind"])
        if cid is not None and kind != b"community":
            out[cid.decode()] = (text, vector)
    return out


def _key(name: str, generation: int, chunk_id: str) -> str:
    return f"{chunk_prefix(name, generation)}default:{chunk_id}"


async def _hash(client: Any, name: str, chunk_id: str) -> dict[bytes, bytes]:
    active = int(await client.hget(registry_key(name), "active"))
    return dict(await client.hgetall(_key(name, active, chunk_id)))


async def _found(retriever: Retriever, flt: dict[str, str]) -> set[str]:
    outcome = await retriever.search(
        SearchSpec(text="ledger-service pool nightly batch", top_k=20, metadata_filter=flt)
    )
    return {h.chunk.doc_id for h in outcome.hits if not h.chunk.doc_id.startswith(COMMUNITY_PREFIX)}


async def test_a_new_filter_key_on_a_broker_that_lost_its_log_loses_no_memory(redis_url: str, tmp_path: Path) -> None:
    """Docs and turns indexed without a ``user_id`` or ``role`` key; the broker then restarts
    empty (tansu keeps its log in memory). A process with those keys refuses the index and
    says a reindex keeps everything; the reindex carries every doc and turn over with the
    same chunks and vectors, and the new keys filter them: ``user_id`` from the events'
    metadata, ``role`` from the turns' own field."""
    bootstrap = f"127.0.0.1:{free_port()}"
    broker = start_tansu(bootstrap, log_dir=tmp_path)
    try:
        settings = isolated_settings(unique("reindex-fields"), bootstrap, redis_url)
        keyed = _with_keys(settings, ["user_id", "role"])
        turn_ids = [turn_doc_id("planner", "s1", n) for n in range(len(TURNS))]
        async with daemon_and_client(settings) as (daemon, client):
            for doc_id, (text, meta) in DOCS.items():
                event = {"event_id": uuid.uuid4().hex, "op": "upsert", "doc_id": doc_id, "version": 1}
                await client.send(settings.topics.documents, {**event, "content": text, "metadata": meta}, key=doc_id)
            for n, (role, text, meta) in enumerate(TURNS):
                turn = {"event_id": uuid.uuid4().hex, "agent_id": "planner", "session_id": "s1", "turn": n}
                turn |= {"role": role, "content": text, "metadata": meta}
                await client.send(settings.topics.transcripts, turn, key="planner/s1")

            async def all_indexed() -> bool:
                return all([await daemon.index.chunk_ids(d) for d in [*DOCS, *turn_ids]])

            await eventually(all_indexed, timeout=120, what="docs and turns indexed")
            before = await _stored(daemon.redis, settings.index.name)
            assert len(before) == len(DOCS) + len(TURNS)

            # A turn stored by a release that did not yet name the agent as a speaker.
            await daemon.redis.hset(_key(settings.index.name, 1, f"{turn_ids[1]}_p0"), "speaker", "assistant")

            broker.stop()
            broker = start_tansu(settings.kafka_bootstrap, log_dir=tmp_path)
            await ensure_topics(bootstrap, settings.topics.all(), partitions=settings.topic_partitions, replication=1)

            dims = daemon.embedder.dims
            spec = index_spec(keyed.index, model=keyed.embedding.model, dims=dims, chunking=keyed.chunking)
            index = ChunkIndex(client=daemon.redis, cfg=keyed.index, dims=dims, spec=spec)
            why = await index.mismatch()
            assert why is not None and "index fields differ" in why and "every chunk" in why, why

            # New HNSW settings too: a schema the old index cannot be shown to differ from in its
            # keys alone, so nothing is carried and the switch is refused.
            hnsw = Settings.model_validate({**keyed.model_dump(), "index": {**keyed.index.model_dump(), "hnsw_m": 32}})
            with pytest.raises(ReindexWouldLose, match="gone from the topics"):
                await reindex(hnsw)

            rep = await reindex(keyed)

            assert rep.progress.carried == len(DOCS) + len(TURNS) and rep.old_dropped and rep.errors == [], rep
            assert await index.mismatch() is None
            assert await _stored(daemon.redis, settings.index.name) == before  # the same chunks and vectors
            # As a replay writes them now: the turn's own role as a tag, the agent's own turn
            # said by the agent, and no field of a key the metadata does not hold.
            spoken = await _hash(daemon.redis, settings.index.name, f"{turn_ids[1]}_p0")
            assert (spoken[b"role"], spoken[b"speaker"]) == (b"assistant", b"assistant|planner"), spoken
            assert b"user_id" not in spoken and b"h_user_id" not in spoken
            retriever = Retriever(index=index, embedder=daemon.embedder, cfg=RetrievalConfig())
            assert await _found(retriever, {}) == {*DOCS, *turn_ids}
            assert await _found(retriever, {"user_id": "u1"}) == {"fk/alpha", turn_ids[0], turn_ids[2]}
            assert await _found(retriever, {"user_id": "u2"}) == {"fk/beta"}
            assert await _found(retriever, {"role": "assistant"}) == {turn_ids[1]}
            assert await _found(retriever, {"role": "user", "user_id": "u1"}) == {turn_ids[0], turn_ids[2]}
            # The old generation's settings no longer filter on the new key.
            old = Retriever(index=daemon.index, embedder=daemon.embedder, cfg=RetrievalConfig())
            with pytest.raises(InvalidRequest, match="unknown metadata_filter key 'user_id'"):
                await _found(old, {"user_id": "u1"})
    finally:
        broker.stop()


async def test_a_daemon_started_on_an_index_it_cannot_use_says_so_instead_of_ready(
    kafka_bootstrap: str, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A restart with a new filter key over an existing index: the start-up line names why
    the index is refused and the reindex that keeps everything, not ``agentmemd ready``."""
    settings = isolated_settings(unique("refused-start"), kafka_bootstrap, redis_url)
    daemon = await start_daemon(settings)
    await daemon.stop()
    assert "agentmemd ready" in capsys.readouterr().out
    daemon = await start_daemon(_with_keys(settings, ["user_id"]))
    try:
        out = capsys.readouterr().out
        assert "agentmemd ready" not in out
        assert "cannot use its index" in out and "index fields differ" in out and "agentmemd reindex" in out, out
        assert "its filter keys: environment, service" in out and ", doc_id, source, user_id)" in out, out
        # Reads that search no leg refuse as a search does, rather than answer from the old index.
        retriever = Retriever(index=daemon.index, embedder=daemon.embedder, cfg=RetrievalConfig())
        for read in (
            retriever.lookups.recent("planner"),
            retriever.lookups.lookup(["fk/alpha"]),
            retriever.lookups.list_values(tenant="default", field="doc_id"),
            retriever.search(SearchSpec(text="ledger", top_k=5)),
        ):
            with pytest.raises(IndexMismatch, match="index fields differ"):
                await read
        # Reindexed from another shell: the daemon says it is ready, unrestarted, and its watch
        # of the index ends there, as it should (no task "died").
        await reindex(_with_keys(settings, ["user_id"]))

        async def said_ready() -> bool:
            return "agentmemd ready: the index is usable now" in capsys.readouterr().out

        with capture_logs() as logs:
            await eventually(said_ready, timeout=30, what="the ready line after the reindex")
            await asyncio.sleep(0.1)  # the watch's end is logged just after its last line
        assert not [e for e in logs if e["event"] == "daemon.task_died"], logs
    finally:
        await daemon.stop()
