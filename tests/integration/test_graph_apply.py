"""What applying a document's graph contribution reads, counted on a Redis of the test's own
(the commands a script runs are counted by Redis, not timed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aredis

from daemon.launcher import free_port, start_redis
from graph.contribution import Contribution
from graph.store import GraphStore

pytestmark = pytest.mark.integration


@pytest.fixture
async def own_redis(tmp_path: Path) -> AsyncIterator[aredis.Redis]:
    url = f"redis://127.0.0.1:{free_port()}/0"
    server = start_redis(url, data_dir=tmp_path / "redis", appendonly=False)
    client = aredis.from_url(url)
    try:
        yield client
    finally:
        await client.aclose()
        server.stop()


async def _calls(client: aredis.Redis, command: str) -> int:
    stats = await client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_deleting_a_copy_reads_the_original_once_not_per_shared_entity(own_redis: aredis.Redis) -> None:
    """A doc and its copy state the same 300 entities. Deleting the copy takes each node's name
    from a doc that still states it: the original's contribution is read (and decoded) once,
    not once per entity, which held Redis for a minute on a large source file."""
    store = GraphStore(client=own_redis, name="copy")
    edges = {(f"fn_{i}", f"fn_{i + 1}"): 1 for i in range(299)}

    def stating(doc_id: str) -> Contribution:
        return Contribution({f"fn_{i}": (f"fn_{i}", "function", [f"{doc_id}_p{i}"]) for i in range(300)}, edges)

    assert (await store.apply("src/a.py", 1, stating("src/a.py"))).applied
    assert (await store.apply("src/a_copy.py", 1, stating("src/a_copy.py"))).applied
    await own_redis.config_resetstat()
    assert (await store.apply("src/a_copy.py", 2, None)).applied
    assert await _calls(own_redis, "get") <= 2  # the copy's own record, and the original's
    nodes, _ = await store.graph()
    assert len(nodes) == 300
    assert (await store.chunks_of_each(["fn_7"]))["fn_7"] == ["src/a.py_p7"]
