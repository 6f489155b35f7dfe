"""Tenant isolation: in topic tenancy the tenant comes from the topic, never from the payload,
so tenant A never retrieves tenant B's chunks or communities, whatever A's request claims.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from consumers.client import MemoryClient
from daemon.instance import Daemon
from daemon.topics import ensure_topics
from tests.conftest import unique
from tests.helpers import PlainClient, eventually, in_graph, read_dlq, settings_env, topic_tenancy_daemon

pytestmark = pytest.mark.integration

SECRETS = {
    "acme": "ACME runbook: the acme-billing service fails with ERR_ACME_7731 when vault_token expires.",
    "globex": "GLOBEX runbook: the globex-ledger service fails with ERR_GLOBEX_9902 when vault_token expires.",
}


@pytest.fixture(scope="module")
async def env(kafka_bootstrap: str, redis_url: str) -> AsyncIterator[tuple[Daemon, PlainClient, str]]:
    name = unique(__name__)
    async with topic_tenancy_daemon(
        name,
        kafka_bootstrap,
        redis_url,
        SECRETS,
        kinds=("documents", "transcripts", "requests"),
        extra_topics=[f"{name}.documents.a.b"],
        reply_topic=f"{name}.my-replies",
    ) as (daemon, client, settings):
        assert settings.topics.documents == f"{name}.documents"  # the extra topic's base
        yield daemon, client, name


AGENTMEMD = str(Path(sys.executable).parent / "agentmemd")


async def ask(client: PlainClient, tenant: str, payload: dict[str, Any]) -> dict[str, Any]:
    cid = uuid.uuid4().hex
    await client.send(
        f"{client.topics.requests}.{tenant}",
        payload,
        headers=[("correlation_id", cid.encode()), ("reply_to", client.reply_topic.encode())],
    )
    _, reply = await client.reply(cid)
    return reply


async def test_tenants_never_see_each_other(env) -> None:
    """Same doc_id in two tenants; each tenant's queries, filters and scopes see only its own."""
    daemon, client, _ = env
    for tenant, text in SECRETS.items():
        event = {
            "event_id": tenant,
            "op": "upsert",
            "doc_id": "shared/runbook.md",
            "version": 1,
            "content": text,
            "metadata": {"tenant": "globex", "service": f"{tenant}-svc"},
        }  # a payload claiming a tenant changes nothing
        await client.send(f"{client.topics.documents}.{tenant}", event, key="shared/runbook.md")
        await client.send(
            f"{client.topics.transcripts}.{tenant}",
            {
                "event_id": f"t-{tenant}",
                "agent_id": "agent-1",
                "session_id": "s-1",
                "turn": 1,
                "content": text,
            },
            key="agent-1/s-1",
        )

    async def both_in() -> bool:
        return all(
            [
                await daemon.index.chunk_ids("shared/runbook.md", tenant)
                and await daemon.index.chunk_ids("transcript:agent-1/s-1/1", tenant)
                for tenant in SECRETS
            ]
        )

    await eventually(both_in, timeout=60, what="both tenants' docs indexed")
    for tenant in SECRETS:
        docs = ["shared/runbook.md", "transcript:agent-1/s-1/1"]
        await eventually(lambda t=tenant, d=docs: in_graph(daemon, d, t), timeout=60, what="both in the graph")
    assert daemon.graph is not None
    for tenant in SECRETS:
        await daemon.graph.service(tenant).recompute(force=True)
        while await daemon.graph.service(tenant).work_once():
            pass

    for me, other in (("acme", "globex"), ("globex", "acme")):
        other_id = "ERR_ACME_7731" if other == "acme" else "ERR_GLOBEX_9902"
        for scope in ("chunks", "communities", "all"):
            reply = await ask(
                client,
                me,
                {
                    "query_id": f"{me}-{scope}",
                    "search_text": f"{other} {other_id} vault_token",
                    "top_k": 20,
                    "scope": scope,
                },
            )
            texts = " ".join(r["text"] for r in reply["results"])
            assert reply["results"], (me, scope, reply)
            assert other_id not in texts and other.upper() not in texts, (me, scope)
        for attempt in (
            {"query_id": "x", "search_text": other_id, "metadata_filter": {"tenant": other}},
            {"query_id": "x", "search_text": other_id, "tenant": other},
        ):
            reply = await ask(client, me, attempt)
            assert reply["error"]["code"] == "invalid_request", reply
        # The other's id alone: only chunks that hold it answer, and none of mine does.
        alone = {"query_id": "x", "search_text": other_id, "top_k": 20}
        assert (await ask(client, me, alone))["results"] == []
        reply = await ask(
            client,
            me,
            {
                "query_id": "x",
                "search_text": f"what does {other_id} mean",
                "top_k": 20,
                "metadata_filter": {"doc_id": "shared/runbook.md", "kind": ["document", "community"]},
            },
        )
        assert all(other_id not in r["text"] for r in reply["results"]) and reply["results"]


async def test_stale_without_a_tenant_lists_every_tenants_queue(env) -> None:
    """`agentmemd stale` in topic tenancy without --tenant: each tenant's queue depth, as that
    tenant's own `stale` reads it (an operator watching every tenant at once)."""
    daemon, client, _ = env
    assert daemon.graph is not None
    for tenant, text in SECRETS.items():  # a tenant is seen once a daemon has read an event of its
        event = {"event_id": f"s-{tenant}", "op": "upsert", "doc_id": "stale/runbook.md", "version": 1, "content": text}
        await client.send(f"{client.topics.documents}.{tenant}", event, key="stale/runbook.md")
    for tenant in SECRETS:
        await eventually(
            lambda t=tenant: daemon.index.chunk_ids("stale/runbook.md", t), what=f"{tenant}'s runbook indexed"
        )
    cli_env = {**os.environ, **settings_env(daemon.settings), "AGENTMEM_CONSUMER__TENANCY": "topic"}

    def run(*args: str) -> dict[str, Any]:
        res = subprocess.run([AGENTMEMD, "stale", "--json", *args], env=cli_env, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)  # type: ignore[no-any-return]

    rows = (await asyncio.to_thread(run))["tenants"]
    assert {"acme", "globex"} <= {r["tenant"] for r in rows}, rows
    # Each tenant's line says what its own `stale` says (its queue is quiet: too few changes
    # for a recompute yet, so nothing is queued or summarized between the two reads).
    for tenant in SECRETS:
        line = next(r for r in rows if r["tenant"] == tenant)
        own = await asyncio.to_thread(run, "--tenant", tenant)
        assert (line["depth"], line["depth"] > 0) == (own["depth"], bool(own["items"])), (line, own)
    # A misspelt tenant is said to be unknown, not shown an empty queue.
    typo = await asyncio.to_thread(
        subprocess.run, [AGENTMEMD, "stale", "--tenant", "acmee"], env=cli_env, capture_output=True, text=True
    )
    said = " ".join(typo.stderr.split())  # (the console wraps it)
    assert typo.returncode == 1 and "no tenant 'acmee'" in said and "did you mean 'acme'" in said, typo
    # So are its dead letters; a known tenant's are listed (none here).
    letters = await asyncio.to_thread(
        subprocess.run, [AGENTMEMD, "dlq", "list", "--tenant", "acmee"], env=cli_env, capture_output=True, text=True
    )
    assert letters.returncode == 1 and "did you mean 'acme'" in " ".join(letters.stderr.split()), letters
    letters = await asyncio.to_thread(
        subprocess.run, [AGENTMEMD, "dlq", "list", "--tenant", "acme"], env=cli_env, capture_output=True, text=True
    )
    assert letters.returncode == 0 and "no dead letters of tenant acme" in letters.stdout, letters


async def test_query_times_are_counted_per_tenant(env) -> None:
    """An operator reads each tenant's query load and errors apart: the histogram's tenant label
    is the request topic's tenant."""
    from memory.metrics import REGISTRY

    _daemon, client, _ = env

    def count(tenant: str, outcome: str) -> float:
        labels = {"tenant": tenant, "outcome": outcome}
        return REGISTRY.get_sample_value("agentmemd_tenant_queries_total", labels) or 0.0

    def took(tenant: str) -> float:
        return REGISTRY.get_sample_value("agentmemd_tenant_query_seconds_total", {"tenant": tenant}) or 0.0

    before = {(t, o): count(t, o) for t in SECRETS for o in ("ok", "invalid")}
    acme_took = took("acme")
    for _ in range(2):
        assert "results" in await ask(client, "acme", {"query_id": "m1", "search_text": "vault_token", "top_k": 1})
    bad = await ask(client, "globex", {"query_id": "m2", "search_text": "vault_token", "top_k": 0})
    assert bad["error"]["code"] == "invalid_request"
    after = {(t, o): count(t, o) for t in SECRETS for o in ("ok", "invalid")}
    assert {k: after[k] - before[k] for k in after} == {
        ("acme", "ok"): 2,
        ("acme", "invalid"): 0,
        ("globex", "ok"): 0,
        ("globex", "invalid"): 1,
    }
    assert took("acme") > acme_took


async def test_topics_without_a_valid_tenant_are_refused(env) -> None:
    """An event on a topic that names no valid tenant, the bare topic included, is
    dead-lettered with the reason, never stored for anyone; a question on the bare request
    topic is answered with an error (both used to wait unread)."""
    daemon, client, _ = env
    t = client.topics
    nowhere = {f"{t.documents}.a.b": "nowhere.md", t.documents: "bare.md"}
    for topic, doc_id in nowhere.items():
        event = {"event_id": doc_id, "op": "upsert", "doc_id": doc_id, "version": 1, "content": "should not be stored"}
        await client.send(topic, event)
    deadline = time.monotonic() + 30
    dead: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline and len(dead) < len(nowhere):
        dead |= {d["topic"]: d for d in await read_dlq(client, 5, timeout=2) if "names no tenant" in d["reason"]}
    assert set(dead) == set(nowhere), dead
    assert "dlq replay --tenant" in dead[t.documents]["reason"]
    for doc_id in nowhere.values():
        for tenant in ("a.b", "a", "b", "default", *SECRETS):
            if ":" not in tenant:
                assert await daemon.index.chunk_ids(doc_id, tenant) == set()
    json.dumps(dead)  # the records are plain JSON
    cid = uuid.uuid4().hex
    await client.send(
        t.requests,
        {"query_id": "bare", "search_text": "vault_token", "top_k": 3},
        headers=[("correlation_id", cid.encode()), ("reply_to", client.reply_topic.encode())],
    )
    _, reply = await client.reply(cid)
    assert reply["query_id"] == "bare" and reply["error"]["code"] == "invalid_request", reply
    assert "names no tenant" in reply["error"]["message"], reply
    # Its reply_to may not be a tenant's reply topic: the bare topic reaches no tenant's answers.
    shared = PlainClient(client.bootstrap, t, t.replies)
    await shared.start()
    try:
        cid = uuid.uuid4().hex
        await client.send(
            t.requests,
            {"query_id": "bare-to-acme", "search_text": "vault_token", "top_k": 3},
            headers=[("correlation_id", cid.encode()), ("reply_to", f"{t.replies}.acme".encode())],
        )
        _, reply = await shared.reply(cid)
        assert reply["error"]["code"] == "invalid_request" and "a tenant's reply topic" in reply["error"]["message"]
    finally:
        await shared.stop()


async def test_a_reply_without_reply_to_goes_to_the_tenants_own_topic(env, kafka_bootstrap: str) -> None:
    """In topic tenancy the default reply topic is <replies>.<tenant>, never a topic all tenants share."""
    _, client, _ = env
    t = client.topics
    await ensure_topics(kafka_bootstrap, [f"{t.replies}.acme"], partitions=1, replication=1)
    acme = PlainClient(client.bootstrap, t, f"{t.replies}.acme")
    await acme.start()
    try:
        cid = uuid.uuid4().hex
        await acme.send(
            f"{t.requests}.acme",
            {"query_id": "acme-default", "search_text": "vault_token", "top_k": 3},
            headers=[("correlation_id", cid.encode())],
        )
        _, reply = await acme.reply(cid)
        assert reply["query_id"] == "acme-default" and "results" in reply
    finally:
        await acme.stop()


async def test_the_first_requests_on_a_new_tenant_topic_are_answered(env, kafka_bootstrap: str) -> None:
    """A tenant's request topic created while the daemon runs: the requests sent before the
    pattern subscription finds it are answered too (the group has no offset there), while a
    request older than query_max_age_ms is answered with an ``expired`` error, not searched
    (it used to get no reply: an asker whose clock is behind the daemon's timed out on every
    request, untold why)."""
    _, client, _ = env
    tenant = f"new{uuid.uuid4().hex[:6]}"
    await ensure_topics(kafka_bootstrap, [f"{client.topics.requests}.{tenant}"], partitions=1, replication=1)
    stale_cid, cid = uuid.uuid4().hex, uuid.uuid4().hex
    await client.producer.send_and_wait(
        f"{client.topics.requests}.{tenant}",
        json.dumps({"query_id": "stale", "search_text": "vault_token"}).encode(),
        headers=[("correlation_id", stale_cid.encode()), ("reply_to", client.reply_topic.encode())],
        timestamp_ms=int(time.time() * 1000) - 10 * 60 * 1000,  # sent ten minutes ago
    )
    await client.send(
        f"{client.topics.requests}.{tenant}",
        {"query_id": "first", "search_text": "vault_token", "top_k": 1},
        headers=[("correlation_id", cid.encode()), ("reply_to", client.reply_topic.encode())],
    )
    _, reply = await client.reply(cid, timeout=30)
    assert reply["query_id"] == "first" and reply["results"] == []  # a tenant of its own: empty
    _, stale = await client.reply(stale_cid, timeout=30)
    assert stale["query_id"] == "stale" and stale["error"]["code"] == "expired", stale
    assert re.search(r"is 6\d\d s old", stale["error"]["message"]) and "time sync" in stale["error"]["message"]


async def test_agentmemd_topics_creates_what_a_new_tenant_needs(env, kafka_bootstrap: str) -> None:
    """`agentmemd topics --tenant` creates a new tenant's topics: that tenant's client then
    writes, has its write acknowledged and asks, its replies on its own reply topic; a second
    run finds every topic there."""
    _, client, _ = env
    t = client.topics
    tenant = f"cli{uuid.uuid4().hex[:6]}"
    cli_env = {
        **os.environ,
        "AGENTMEM_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "AGENTMEM_CONSUMER__TENANCY": "topic",
        **{f"AGENTMEM_TOPICS__{kind.upper()}": name for kind, name in t.model_dump().items()},
    }

    def run() -> list[list[str]]:
        res = subprocess.run(
            [AGENTMEMD, "topics", "--tenant", tenant], env=cli_env, capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 0, res.stderr
        return [line.split() for line in res.stdout.splitlines()]

    wanted = [f"{base}.{tenant}" for base in (t.documents, t.transcripts, t.requests, t.replies)]
    assert await asyncio.to_thread(run) == [["created", topic] for topic in wanted]
    async with MemoryClient(bootstrap=kafka_bootstrap, topics=t, tenant=tenant, timeout_s=60) as mine:
        await mine.publish_document("cli/runbook.md", "The cli-tenant pager fires on ERR_CLI_4242.", wait=True)
        reply = await mine.query("ERR_CLI_4242", top_k=3)
    assert [r.doc_id for r in reply.results] == ["cli/runbook.md"]
    assert await asyncio.to_thread(run) == [["exists", topic] for topic in wanted]


async def test_a_tenant_cannot_send_its_replies_or_acks_into_another_tenants_reply_topic(
    env, kafka_bootstrap: str
) -> None:
    """Globex named acme's reply topic as its reply_to, and the daemon,
    writing with its own credentials, put globex's results and acks there. Now the query's
    error goes to globex's own reply topic, the ack nowhere, and acme's topic gets nothing."""
    daemon, client, _ = env
    t = client.topics
    acme_topic, globex_topic = f"{t.replies}.acme", f"{t.replies}.globex"
    await ensure_topics(kafka_bootstrap, [acme_topic, globex_topic], partitions=1, replication=1)
    acme, globex = PlainClient(client.bootstrap, t, acme_topic), PlainClient(client.bootstrap, t, globex_topic)
    await acme.start()
    await globex.start()
    try:
        cid = uuid.uuid4().hex
        await globex.send(
            f"{t.requests}.globex",
            {"query_id": "into-acme", "search_text": "vault_token", "top_k": 3},
            headers=[("correlation_id", cid.encode()), ("reply_to", acme_topic.encode())],
        )
        _, reply = await globex.reply(cid)
        assert reply["error"]["code"] == "invalid_request" and "another tenant's" in reply["error"]["message"], reply
        ack_cid = uuid.uuid4().hex
        event = {"event_id": "g-x", "op": "upsert", "doc_id": "globex/x.md", "version": 1, "content": "globex writes"}
        await globex.send(
            f"{t.documents}.globex",
            event,
            key="globex/x.md",
            headers=[("correlation_id", ack_cid.encode()), ("reply_to", acme_topic.encode())],
        )

        async def written() -> bool:
            return await daemon.index.versions(["globex/x.md"], "globex") == {"globex/x.md": 1}

        await eventually(written, timeout=60, what="globex's write applied")  # its ack was due
        with pytest.raises(AssertionError, match="no reply"):
            await acme.reply(ack_cid, timeout=3)
        with pytest.raises(AssertionError, match="no reply"):
            await acme.reply(cid, timeout=1)
    finally:
        await acme.stop()
        await globex.stop()


async def test_a_forget_touches_only_its_own_tenants_turns(env) -> None:
    """The same agent and session ids in two tenants: a forget on one tenant's topic removes
    that tenant's turns only, and the other's stay, found by its queries."""
    daemon, client, _ = env
    turns = [f"transcript:agent-f/s-9/{n}" for n in (1, 2)]
    for tenant in SECRETS:
        for n in (1, 2):
            turn = {
                "event_id": f"f-{tenant}-{n}",
                "agent_id": "agent-f",
                "session_id": "s-9",
                "turn": n,
                "content": f"{tenant} forgetme-marker turn {n} about the quarterly ledger close",
            }
            await client.send(f"{client.topics.transcripts}.{tenant}", turn, key="agent-f/s-9")

    async def stored(tenant: str) -> bool:
        return all([await daemon.index.chunk_ids(t, tenant) for t in turns])

    await eventually(lambda: stored("acme"), timeout=60, what="acme's turns")
    await eventually(lambda: stored("globex"), timeout=60, what="globex's turns")
    forget = {"event_id": "forget-f", "op": "forget", "agent_id": "agent-f", "all_sessions": True}
    await client.send(f"{client.topics.transcripts}.acme", forget, key="agent-f/s-9")

    async def acme_forgot() -> bool:
        return not any([await daemon.index.chunk_ids(t, "acme") for t in turns])

    await eventually(acme_forgot, timeout=60, what="acme's turns forgotten")
    assert await stored("globex")
    reply = await ask(client, "globex", {"query_id": "f", "search_text": "forgetme-marker ledger", "top_k": 5})
    assert {r["doc_id"] for r in reply["results"]} >= set(turns)
