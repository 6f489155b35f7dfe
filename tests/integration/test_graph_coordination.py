"""Graph work shared by several daemons, on real Redis: claims, fencing, drops, the stale view.

Contributions go to the store directly (no NER): these tests are about coordination, not
extraction. Summaries are embedded by the real model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from structlog.testing import capture_logs

from graph import communities
from graph.communities import Community
from graph.config import GraphConfig
from graph.contribution import Contribution
from graph.errors import LeaseLost
from graph.recompute import COMMUNITY_TOMBSTONE_S
from graph.scripts import RENEW
from graph.service import GraphService
from graph.store import GraphStore
from graph.tenants import TenantGraphs
from memory.config import IndexConfig
from memory.errors import BackendUnavailable
from memory.index import ChunkIndex
from memory.keys import tenants_key
from memory.records import COMMUNITY_PREFIX
from tests.conftest import unique
from tests.integration.test_graph import GatedEmbedder

pytestmark = pytest.mark.integration


def contrib(chunk: str, *keys: str, names: dict[str, str] | None = None) -> Contribution:
    """One chunk in which every entity co-occurs with every other."""
    names = names or {}
    ks = sorted(keys)
    return Contribution(
        entities={k: (names.get(k, k), "concept", [chunk]) for k in ks},
        edges={(a, b): 1 for i, a in enumerate(ks) for b in ks[i + 1 :]},
    )


class Daemons:
    """Two daemons' graph services over one Redis and one index."""

    def __init__(self, client: aredis.Redis, index: ChunkIndex, name: str, embedder: Any, **cfg: Any) -> None:
        self.client, self.index, self.name, self.embedder = client, index, name, embedder
        conf = GraphConfig(summarizer_rate_per_min=60_000, summarizer_quiet_s=0, **cfg)
        self.store = GraphStore(client=client, name=name)
        self.a = GraphService(store=self.store, index=index, embedder=embedder, ner=None, cfg=conf)
        self.b = GraphService(
            store=GraphStore(client=client, name=name), index=index, embedder=embedder, ner=None, cfg=conf
        )

    async def summary_chunk(self, cid: str) -> str | None:
        return (await self.index.texts([COMMUNITY_PREFIX + cid])).get(COMMUNITY_PREFIX + cid)


async def make(redis_url: str, embedder: Any, name: str, **cfg: Any) -> Daemons:
    client = aredis.from_url(redis_url)
    index = ChunkIndex(client=client, cfg=IndexConfig(name=name), dims=embedder.dims)
    await index.drop()
    await index.ensure()
    return Daemons(client, index, name, GatedEmbedder(embedder), **cfg)


@pytest.fixture
async def two(redis_url: str, embedder: Any, request: pytest.FixtureRequest) -> Any:
    d = await make(redis_url, embedder, unique(request.node.nodeid))
    yield d
    await d.client.aclose()


async def one_community(d: Daemons) -> str:
    await d.store.apply("doc1", 1, contrib("doc1#0", "alpha-svc", "beta-svc", "gamma-svc"))
    await d.a.recompute(force=True)
    (comm,) = await d.store.communities()
    return comm.id


async def test_an_expired_claim_released_late_keeps_the_new_holder(two: Daemons) -> None:
    """A's claim expires, B claims; A's late release must not free B's claim for a third daemon."""
    cid = await one_community(two)
    token_a = await two.store.claim(cid, "daemon-a", ttl_s=0.05)
    assert token_a is not None
    await asyncio.sleep(0.1)
    token_b = await two.store.claim(cid, "daemon-b", ttl_s=30)
    assert token_b is not None and token_b > token_a
    await two.store.release(cid, "daemon-a", token_a)
    assert await two.store.claim(cid, "daemon-c", ttl_s=30) is None
    await two.store.release(cid, "daemon-b", token_b)
    assert await two.store.claim(cid, "daemon-c", ttl_s=30) is not None


async def test_a_claim_is_refused_once_the_community_is_not_due(two: Daemons) -> None:
    """A worker holding an old due list cannot redo a community another worker just finished."""
    cid = await one_community(two)
    due_before = await two.b.due(10)
    assert due_before == [cid]
    assert await two.a.work_once() == 1  # A summarizes and clears
    assert await two.store.claim(cid, "daemon-b", ttl_s=30) is None  # B's list is out of date
    # A failed community is not due before its backoff either.
    await two.store.apply("doc1", 2, contrib("doc1#0", "alpha-svc", "beta-svc", "gamma-svc", "delta-svc"))
    token = await two.store.claim(cid, "daemon-a", ttl_s=30)
    assert token is not None
    (held,) = (await two.store.stale())[1]
    assert held.claimed and held.attempts == 0  # an operator sees a worker holds it
    retry_at = time.time() + 60
    assert await two.store.record_failure(cid, retry_at, "daemon-a", token, "LlmFailed: no reply within 60 s") == 1
    await two.store.release(cid, "daemon-a", token)
    assert await two.store.claim(cid, "daemon-b", ttl_s=30) is None
    # What `stale` shows: how often it failed, why, and when it is tried again.
    (failing,) = (await two.store.stale())[1]
    assert (failing.attempts, failing.last_error, failing.claimed) == (1, "LlmFailed: no reply within 60 s", False)
    assert failing.retry_at == pytest.approx(retry_at)


async def test_two_workers_write_one_summary_per_stale_community(two: Daemons) -> None:
    """Both daemons' workers run at once over two stale communities: two summaries, not more."""
    await two.store.apply("doc1", 1, contrib("doc1#0", "alpha-svc", "beta-svc", "gamma-svc"))
    await two.store.apply("doc2", 1, contrib("doc2#0", "x-svc", "y-svc", "z-svc"))
    await two.a.recompute(force=True)
    assert len(await two.store.communities()) == 2
    done = await asyncio.gather(two.a.work_once(), two.b.work_once())
    assert sum(done) == 2 and await two.store.counter("summaries_written") == 2
    assert (await two.store.stale())[0] == 0


async def test_a_summary_from_an_earlier_lease_never_replaces_a_later_one(two: Daemons) -> None:
    """A stalls past its claim; B summarizes the newer state; A's late write is refused."""
    cid = await one_community(two)
    embedder: GatedEmbedder = two.embedder
    embedder.armed = True
    early = await two.store.fence()
    task = asyncio.create_task(two.a.summarize(cid, early))
    await asyncio.wait_for(embedder.entered.wait(), 30)  # A's text is built, not yet stored
    await two.store.apply(
        "doc1", 2, contrib("doc1#0", "alpha-svc", "beta-svc", "gamma-svc", "delta-svc"), now=time.time()
    )
    gen_b = await two.store.mark_count(cid)
    later = await two.b.summarize(cid)
    assert later is not None and later.cleared
    embedder.release.set()
    assert await task is None  # superseded
    summary = await two.store.summaries.get(cid)
    assert summary is not None and summary["gen"] == gen_b and summary["text"] == later.text
    assert await two.summary_chunk(cid) == later.text
    assert (await two.store.is_stale([cid]))[cid] is False


async def test_a_community_removed_mid_summary_does_not_come_back(two: Daemons) -> None:
    """The summary being written when a recompute removes its community never reaches the index."""
    cid = await one_community(two)
    embedder: GatedEmbedder = two.embedder
    embedder.armed = True
    task = asyncio.create_task(two.a.summarize(cid))
    await asyncio.wait_for(embedder.entered.wait(), 30)
    await two.store.apply("doc1", 2, None)
    await two.store.apply("doc2", 1, contrib("doc2#0", "x-svc", "y-svc", "z-svc"))
    report = await two.b.recompute(force=True)
    assert report is not None and cid in report.removed
    embedder.release.set()
    assert await task is None
    assert cid not in {c.id for c in await two.store.communities()}
    assert await two.summary_chunk(cid) is None
    assert await two.store.summaries.get(cid) is None
    assert await two.store.summaries.pending_drops() == []
    # its tombstone fences late writers for a day, then goes (churn would grow them for good)
    ver_key = two.index._ver_key(await two.index._generation(), "default", COMMUNITY_PREFIX + cid)
    assert 0 < await two.client.ttl(ver_key) <= COMMUNITY_TOMBSTONE_S


async def test_a_summary_begun_before_its_community_was_removed_and_recreated_leaves_it_stale(
    two: Daemons,
) -> None:
    """A worker reads a community's generation and claims it; an edit marks it again; a
    recompute removes it and a later one brings the same members back (the same id). The
    worker's late commit must not clear the new community's mark: its generation never
    repeats an earlier one."""
    cid = await one_community(two)
    gen = await two.store.mark_count(cid)
    token = await two.store.claim(cid, "worker-a", 120)
    assert token is not None
    await two.store.apply("doc1", 2, contrib("doc1#0", "alpha-svc", "beta-svc", "gamma-svc", "delta-svc"))
    assert await two.store.mark_count(cid) != gen
    (comm,) = await two.store.communities()
    await two.store.community_writes.replace([], changed=set(), removed={cid}, events=[], drift_seen=0, now=time.time())
    await two.store.community_writes.replace(
        [comm], changed={cid}, removed=set(), events=[], drift_seen=0, now=time.time()
    )
    _, cleared = await two.store.summaries.commit(cid, token, gen, {"text": "written for the old community"})
    assert not cleared
    assert (await two.store.is_stale([cid]))[cid]


async def test_a_failed_drop_of_a_removed_summary_is_retried(two: Daemons, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis fails while a recompute deletes a removed community's chunk: the next pass deletes it."""
    cid = await one_community(two)
    assert await two.a.work_once() == 1 and await two.summary_chunk(cid) is not None
    await two.store.apply("doc1", 2, None)
    await two.store.apply("doc2", 1, contrib("doc2#0", "x-svc", "y-svc", "z-svc"))
    real_apply = two.index.apply

    async def failing_apply(doc_id: str, *args: Any, **kwargs: Any) -> Any:
        if doc_id.startswith(COMMUNITY_PREFIX):
            raise BackendUnavailable("redis went away")
        return await real_apply(doc_id, *args, **kwargs)

    monkeypatch.setattr(two.index, "apply", failing_apply)
    with pytest.raises(BackendUnavailable):
        await two.a.recompute(force=True)
    assert cid not in {c.id for c in await two.store.communities()}
    assert await two.store.summaries.pending_drops() == [cid] and await two.summary_chunk(cid) is not None
    monkeypatch.setattr(two.index, "apply", real_apply)
    await two.b.work_once()
    assert await two.summary_chunk(cid) is None and await two.store.summaries.pending_drops() == []


async def test_a_re_summary_after_a_delete_names_only_live_entities(two: Daemons) -> None:
    """Membership changes only at a recompute; a summary in between leaves out deleted entities."""
    await two.store.apply("doc1", 1, contrib("doc1#0", "acme-gateway", "shared-db"))
    await two.store.apply("doc2", 1, contrib("doc2#0", "shared-db", "project-x-service"))
    await two.a.recompute(force=True)
    (comm,) = await two.store.communities()
    assert await two.a.work_once() == 1
    await two.store.apply("doc2", 2, None)  # project-x-service is in no document any more
    assert (await two.store.is_stale([comm.id]))[comm.id] is True
    assert await two.a.work_once() == 1
    summary = await two.store.summaries.get(comm.id)
    assert summary is not None and "project-x-service" not in summary["text"]
    assert "acme-gateway" in summary["text"]
    # Every member gone: the summary is dropped, not rewritten from the member list.
    await two.store.apply("doc1", 2, None)
    await two.a.work_once()
    assert await two.summary_chunk(comm.id) is None and await two.store.summaries.get(comm.id) is None
    assert (await two.store.stale())[0] == 0


async def test_an_unversioned_item_delivered_again_marks_nothing(two: Daemons) -> None:
    """At-least-once redelivery of an unchanged transcript turn is not a change."""
    await two.store.apply("turn-1", None, contrib("turn-1#0", "alpha-svc", "beta-svc"))
    await two.a.recompute(force=True)
    assert await two.a.work_once() == 1
    drift = await two.store.drift()
    again = await two.store.apply("turn-1", None, contrib("turn-1#0", "alpha-svc", "beta-svc"))
    assert not again.applied and again.marked == []
    assert (await two.store.stale())[0] == 0 and await two.store.drift() == drift
    changed = await two.store.apply("turn-1", None, contrib("turn-1#0", "alpha-svc", "beta-svc", "gamma-svc"))
    assert changed.applied and changed.marked


async def test_drift_is_read_again_under_the_recompute_lock(redis_url: str, embedder: Any) -> None:
    """Another daemon recomputing between A's check and A's lock must not make A subtract drift twice."""
    d = await make(redis_url, embedder, unique("drift-lock"), drift_threshold=2, recompute_min_interval_s=0)
    try:
        await d.store.apply("doc1", 1, contrib("doc1#0", "alpha-svc", "beta-svc", "gamma-svc"))
        real_lock = d.a.store.lock

        async def lock_after_b_recomputed(name: str, owner: str, ttl_s: float) -> str | None:
            assert await d.b.recompute() is not None
            return await real_lock(name, owner, ttl_s)

        d.a.store.lock = lock_after_b_recomputed  # type: ignore[method-assign]
        assert await d.a.recompute() is None
        assert await d.store.drift() == 0
    finally:
        await d.client.aclose()


async def test_a_recompute_that_lost_its_lease_stores_nothing(two: Daemons) -> None:
    """A's recompute lease expires and B takes it (a recompute that outlived its lease): A's
    result, computed from communities B may have replaced, is refused whole."""
    cid = await one_community(two)
    lease = await two.store.lock("recompute", "daemon-a", ttl_s=60)
    assert lease is not None
    await two.client.delete(two.store._k("lock:recompute"))  # expired
    assert await two.store.lock("recompute", "daemon-b", ttl_s=60) is not None
    stray = Community(id="c0-stray", level=0, members=frozenset({"alpha-svc", "beta-svc"}))
    with pytest.raises(LeaseLost):
        await two.store.community_writes.replace(
            [stray], changed={stray.id}, removed={cid}, events=[], drift_seen=0, now=time.time(), lease=lease
        )
    assert [c.id for c in await two.store.communities()] == [cid]
    assert await two.store.summaries.pending_drops() == []
    assert not await two.store.renew("recompute", lease, 60)  # nor can A extend B's lease


async def test_a_renewal_of_the_lease_while_its_result_is_stored_keeps_the_result(two: Daemons, redis_url: str) -> None:
    """The recompute's own lease renewed between the lease check and the write (its expiry set
    again, which aborts a transaction that watches the lock): the result is stored anyway, not
    thrown away as superseded."""
    cid = await one_community(two)
    lease = await two.store.lock("recompute", "daemon-a", ttl_s=60)
    assert lease is not None
    writes = two.store.community_writes
    real_queue = writes._queue
    renewed: list[bool] = []
    sync = redis.Redis.from_url(redis_url)

    def queue_then_renew(*args: Any) -> None:
        real_queue(*args)
        if not renewed:  # another connection, as the renewer's task: inside the WATCH, before EXEC
            renewed.append(bool(sync.eval(RENEW, 1, two.store._k("lock:recompute"), lease, 60_000)))

    writes._queue = queue_then_renew  # type: ignore[method-assign]
    new = Community(id="c0-new", level=0, members=frozenset({"alpha-svc", "beta-svc"}))
    await writes.replace([new], changed={new.id}, removed={cid}, events=[], drift_seen=0, now=time.time(), lease=lease)
    sync.close()
    assert renewed == [True]
    assert [c.id for c in await two.store.communities()] == ["c0-new"]


async def test_a_recompute_longer_than_its_lease_keeps_it(two: Daemons, monkeypatch: pytest.MonkeyPatch) -> None:
    """Leiden taking three times the lease's time: the lease is renewed while it runs, so
    another daemon's recompute is refused meanwhile, and A's result is stored."""
    await two.store.apply("doc1", 1, contrib("doc1#0", "alpha-svc", "beta-svc", "gamma-svc"))
    # A lease of 1 s, renewed every third: a loaded machine (CI, a second test run) may hold
    # a renewal back a few hundred ms, which a shorter lease would not survive.
    monkeypatch.setattr("graph.recompute.LEASE_S", 1.0)
    real_detect = communities.detect

    def slow_detect(*args: Any, **kwargs: Any) -> Any:
        time.sleep(3.0)
        return real_detect(*args, **kwargs)

    monkeypatch.setattr("graph.recompute.detect", slow_detect)
    a = asyncio.create_task(two.a.recompute(force=True))
    await asyncio.sleep(2.0)  # past A's first lease time
    assert await two.b.recompute(force=True) is None
    report = await a
    assert report is not None and report.communities == 1
    assert await two.store._r.get(two.store._k("lock:recompute")) is None  # released


async def test_the_stale_view_keeps_a_failing_community_oldest(two: Daemons) -> None:
    """A failed summary moves its retry time, not its place in the operators' oldest-first view."""
    await two.store.apply("doc1", 1, contrib("doc1#0", "alpha-svc", "beta-svc"))
    await two.store.apply("doc2", 1, contrib("doc2#0", "x-svc", "y-svc"))
    await two.a.recompute(force=True)
    while await two.a.work_once():
        pass
    await two.store.apply("doc1", 2, contrib("doc1#0", "alpha-svc", "beta-svc", "gamma-svc"), now=1000.0)
    await two.store.apply("doc2", 2, contrib("doc2#0", "x-svc", "y-svc", "z-svc"), now=2000.0)
    (first,) = [c.id for c in await two.store.communities() if "alpha-svc" in c.members]
    token = await two.store.claim(first, "daemon-a", ttl_s=30)
    assert token is not None
    await two.store.record_failure(first, time.time() + 3600, "daemon-a", token)
    depth, items = await two.store.stale(limit=1)
    assert depth == 2 and items[0].community_id == first and items[0].first_marked_at == 1000.0


async def test_a_stale_view_of_an_older_store_is_rebuilt(two: Daemons) -> None:
    """Stores written before the first-marked index existed are listed all the same."""
    cid = await one_community(two)
    await two.store._r.delete(two.store._k("stale_first"))
    depth, items = await two.store.stale()
    assert depth == 1 and [i.community_id for i in items] == [cid]


async def looping_graphs(redis_url: str, embedder: Any, name: str) -> tuple[Daemons, TenantGraphs]:
    """A daemon's per-tenant graphs whose recompute loop checks every 50 ms and recomputes on any drift."""
    d = await make(redis_url, embedder, name)
    reg = TenantGraphs(
        client=d.client,
        name=name,
        index=d.index,
        embedder=None,
        ner=None,
        cfg=GraphConfig(drift_threshold=1, recompute_min_interval_s=0, recompute_check_s=0.05),
    )
    return d, reg


async def test_a_background_loop_logs_an_unexpected_error_and_carries_on(
    redis_url: str, embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cdlib failing to import must be logged, and the recompute loop must live to try again."""
    name = unique("loop-error")
    d, reg = await looping_graphs(redis_url, embedder, name)
    await d.client.sadd(tenants_key(name), "default")  # as a daemon that saw the tenant would
    await reg.service("default").store.apply("doc1", 1, contrib("doc1#0", "alpha-svc", "beta-svc"))
    calls: list[int] = []

    def broken() -> Any:
        calls.append(1)
        raise ModuleNotFoundError("No module named 'leidenalg'")

    monkeypatch.setattr(communities, "_cdlib_algorithms", broken)
    monkeypatch.setattr("graph.tenants._ERROR_PAUSE_S", 0.05)
    with capture_logs() as logs:
        task = asyncio.create_task(reg.run_recompute())
        for _ in range(200):
            if len(calls) >= 2:
                break
            await asyncio.sleep(0.02)
    try:
        assert len(calls) >= 2 and not task.done()
        assert any(e["event"] == "graph.loop_failed" and "leidenalg" in e["error"] for e in logs)
    finally:
        reg.stop.set()
        await asyncio.wait_for(task, 10)
        await d.client.aclose()


async def test_a_tenant_whose_recompute_fails_does_not_stop_the_others(
    redis_url: str, embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tenant "a" (sorted first) crashes every recompute: tenant "b" is still recomputed."""
    name = unique("tenant-error")
    d, reg = await looping_graphs(redis_url, embedder, name)
    for tenant in ("a", "b"):
        await d.client.sadd(tenants_key(name), tenant)
        await reg.service(tenant).store.apply("doc1", 1, contrib("doc1#0", "alpha-svc", "beta-svc"))

    async def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("a bug tenant a's data triggers")

    monkeypatch.setattr(reg.service("a"), "recompute", broken)
    monkeypatch.setattr("graph.tenants._ERROR_PAUSE_S", 0.05)
    with capture_logs() as logs:
        task = asyncio.create_task(reg.run_recompute())
        try:
            for _ in range(500):
                if await reg.service("b").store.communities():
                    break
                await asyncio.sleep(0.02)
            assert await reg.service("b").store.communities()
            assert any(e["event"] == "graph.loop_failed" and e.get("tenant") == "a" for e in logs)
        finally:
            reg.stop.set()
            await asyncio.wait_for(task, 10)
            await d.client.aclose()


async def test_an_unusable_llm_extraction_reply_keeps_the_other_entities(redis_url: str, embedder: Any) -> None:
    """A reply that is not the JSON asked for fails the same way every time: it must not be retried forever."""
    d = await make(redis_url, embedder, unique("llm-bad-reply"))
    try:
        svc = GraphService(
            store=d.store,
            index=d.index,
            embedder=embedder,
            ner=None,
            cfg=GraphConfig(llm_model="gpt-4o-mini", llm_extraction=True),
            mock_llm_response="Sorry, I cannot help with that.",
        )
        docs: Sequence[Sequence[tuple[str, str]]] = [[("d#0", "billing-service hit ERR_LEDGER_LOCK_9C1 on db-01")]]
        (found,) = await svc.extract_chunks(docs)
        assert "err_ledger_lock_9c1" in found.entities
    finally:
        await d.client.aclose()


async def test_a_nodes_name_and_type_come_from_a_document_that_still_mentions_it(two: Daemons) -> None:
    """The doc that named an entity is deleted: its name and type go with it."""
    a = Contribution(entities={"billing-service": ("BILLING-SERVICE", "org", ["a#0"])}, edges={})
    b = Contribution(entities={"billing-service": ("billing-service", "service", ["b#0"])}, edges={})
    await two.store.apply("a", 1, a)
    await two.store.apply("b", 1, b)
    assert await two.store.nodes(["billing-service"]) == {"billing-service": ("BILLING-SERVICE", "org")}
    await two.store.apply("a", 2, None)
    assert await two.store.nodes(["billing-service"]) == {"billing-service": ("billing-service", "service")}
    await two.store.apply("b", 2, None)
    assert await two.store.nodes(["billing-service"]) == {}


async def test_a_failure_of_a_community_no_longer_queued_is_not_kept(two: Daemons) -> None:
    """A summary that fails after its community left the queue leaves no failure count behind."""
    cid = await one_community(two)
    token = await two.store.claim(cid, "daemon-a", ttl_s=30)
    assert token is not None
    assert await two.store.record_failure(cid, time.time() + 60, "daemon-a", token) == 1
    assert await two.store.failures(cid) == 1
    await two.store.clear_if_unchanged(cid, await two.store.mark_count(cid))
    assert await two.store.record_failure(cid, time.time() + 60, "daemon-a", token) == 0
    assert await two.store.failures(cid) == 0 and (await two.store.stale())[0] == 0


async def test_a_summary_written_while_marked_again_ends_the_failures_before_it(two: Daemons) -> None:
    """Failed twice, then written while a change marked it again: it stays queued for the
    change, due now (not at the last failure's retry time), with no failure left to show."""
    cid = await one_community(two)
    token = await two.store.claim(cid, "daemon-a", ttl_s=30)
    assert token is not None
    for _ in range(2):
        await two.store.record_failure(cid, time.time() + 3600, "daemon-a", token, "LlmFailed: rate limited")
    gen = await two.store.mark_count(cid)
    await two.store.apply("doc1", 2, contrib("doc1#0", "alpha-svc", "beta-svc", "gamma-svc", "delta-svc"))
    written = await two.store.summaries.commit(cid, token, gen, {"text": "alpha-svc calls beta-svc.", "model": "x"})
    assert written == (True, False)
    (item,) = (await two.store.stale())[1]
    assert (item.attempts, item.last_error, item.retry_at) == (0, "", None)
    assert await two.store.due(time.time(), 10) == [cid]


async def test_an_edit_of_a_summarized_community_goes_before_new_communities(two: Daemons) -> None:
    """A community whose summary an edit may have made wrong is summarized before those a
    recompute created, however many; one whose failure deferred it keeps its retry time."""
    await two.store.apply("doc1", 1, contrib("doc1#0", "alpha-svc", "beta-svc", "gamma-svc"))
    await two.a.recompute(force=True)
    assert await two.a.work_once() == 1
    (old,) = await two.store.communities()
    for n in range(5):  # a bulk load: new communities, never summarized
        await two.store.apply(f"bulk{n}", 1, contrib(f"bulk{n}#0", f"x{n}-svc", f"y{n}-svc", f"z{n}-svc"))
    await two.a.recompute(force=True)
    assert len(await two.store.due(time.time(), 100)) == 5
    await two.store.apply("doc1", 2, contrib("doc1#0", "alpha-svc", "beta-svc", "gamma-svc", "delta-svc"))
    due = await two.store.due(time.time(), 100)
    assert len(due) == 6 and due[0] == old.id, due
    (listed,) = [i for i in (await two.store.stale())[1] if i.community_id == old.id]
    assert listed.ahead and "ahead of unsummarized" in listed.state(time.time())
    # Marked first by an operator (queued by its first mark, kept to 14 digits in its record),
    # then by an edit: it moves ahead all the same.
    await two.a.work_once()  # summarizes the old community, which is due first
    assert old.id not in await two.store.due(time.time(), 100)
    await two.store.mark([old.id], now=int(time.time()) + 1.1234448)  # after the bulk's marks
    await two.store.apply("doc1", 3, contrib("doc1#0", "alpha-svc", "beta-svc", "delta-svc", "gamma-svc", "eps-svc"))
    assert (await two.store.due(time.time(), 100))[0] == old.id
    # Failed: deferred to its retry time, and another edit does not bring it back early.
    token = await two.store.claim(old.id, "daemon-a", ttl_s=30)
    assert token is not None
    await two.store.record_failure(old.id, time.time() + 3600, "daemon-a", token, "LlmFailed: timeout")
    await two.store.release(old.id, "daemon-a", token)
    await two.store.apply("doc1", 4, contrib("doc1#0", "alpha-svc", "beta-svc", "delta-svc"))
    assert old.id not in await two.store.due(time.time(), 100)


async def test_a_failure_after_the_claim_expired_leaves_the_next_claims_mark_alone(two: Daemons) -> None:
    """A worker whose claim expired mid-summary, and that another worker has claimed since,
    fails: the community stays due for the new claim, with no failure counted against it.
    Unclaimed since, the failure still backs the community off (a summary that always outran
    its claim would otherwise be retried at once, for ever)."""
    cid = await one_community(two)
    late = await two.store.claim(cid, "daemon-a", ttl_s=0.05)
    assert late is not None
    await asyncio.sleep(0.2)  # the claim expires, and nobody claims it
    assert await two.store.record_failure(cid, time.time() + 0.5, "daemon-a", late) == 1
    assert await two.store.due(time.time(), 10) == []
    await asyncio.sleep(0.6)
    late = await two.store.claim(cid, "daemon-a", ttl_s=0.05)
    assert late is not None
    await asyncio.sleep(0.2)  # the claim expires again, and another worker claims it
    now = await two.store.claim(cid, "daemon-b", ttl_s=30)
    assert now is not None
    assert await two.store.record_failure(cid, time.time() + 3600, "daemon-a", late) == 0
    assert await two.store.failures(cid) == 1 and await two.store.due(time.time(), 10) == [cid]
    assert await two.store.record_failure(cid, time.time() + 3600, "daemon-b", now) == 2
    assert await two.store.due(time.time(), 10) == []


async def test_a_dropped_summary_still_fences_off_earlier_leases(two: Daemons) -> None:
    """After a later lease drops a summary, an earlier lease's commit is refused (and the record
    carries no fencing internals)."""
    cid = await one_community(two)
    early, late = await two.store.fence(), await two.store.fence()
    gen = await two.store.mark_count(cid)
    assert await two.store.summaries.commit(cid, late, gen, None) == (True, True)
    assert await two.store.summaries.commit(cid, early, gen, {"text": "ghost", "gen": gen}) == (False, False)
    assert await two.store.summaries.get(cid) is None
    newer = await two.store.fence()
    assert (await two.store.summaries.commit(cid, newer, gen, {"text": "fresh", "gen": gen}))[0]
    assert await two.store.summaries.get(cid) == {"text": "fresh", "gen": gen}


async def test_a_renamed_entity_takes_the_new_name(two: Daemons) -> None:
    """The doc that named an entity still mentions it under another name: the node follows."""
    a1 = Contribution(entities={"billing-service": ("BILLING-SERVICE", "org", ["a#0"])}, edges={})
    a2 = Contribution(entities={"billing-service": ("Billing Service", "service", ["a#0"])}, edges={})
    b = Contribution(entities={"billing-service": ("billing-service", "service", ["b#0"])}, edges={})
    await two.store.apply("a", 1, a1)
    await two.store.apply("b", 1, b)
    await two.store.apply("a", 2, a2)
    assert await two.store.nodes(["billing-service"]) == {"billing-service": ("Billing Service", "service")}


async def test_every_tenants_extraction_shares_one_bounded_cache(redis_url: str, embedder: Any) -> None:
    """A text one tenant's graph extracted is not extracted again for another's, and the cache's
    bound is the process's: it was one cache of up to 20,000 chunks per tenant (~90 MB each)."""
    d, reg = await looping_graphs(redis_url, embedder, unique("shared-cache"))
    text = "ERR_LEDGER_LOCK_9C1 stalls the ledger-service until the lock manager restarts."
    a, b = reg.service("acme"), reg.service("globex")
    first = await a.extract_chunks([[("doc#0", text)]])
    again = await b.extract_chunks([[("other#0", text)]])
    assert (a.chunks_extracted, b.chunks_extracted) == (1, 0)
    assert set(first[0].entities) == set(again[0].entities) and first[0].entities
    await d.client.aclose()
