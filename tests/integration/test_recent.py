"""``"op": "recent"``: an agent's latest turns, whole and oldest first, over Kafka request/reply
with the typed client, as an agent restarted mid-task reads them."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from consumers.client import MemoryClient
from consumers.config import ConsumerConfig
from consumers.errors import QueryFailed
from daemon.settings import Settings
from memory.errors import InvalidRequest
from tests.conftest import unique
from tests.helpers import daemon_and_client, isolated_settings, topic_tenancy_daemon

pytestmark = pytest.mark.integration

DAY = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
REPLY_MAX_BYTES = 32_000  # small, so that one long turn or document alone does not fit a reply


@pytest.fixture(scope="module")
async def client(kafka_bootstrap: str, redis_url: str) -> AsyncIterator[MemoryClient]:
    name = unique("recent")
    consumer = ConsumerConfig(group_id=name, reply_max_bytes=REPLY_MAX_BYTES)
    settings = isolated_settings(name, kafka_bootstrap, redis_url, consumer=consumer)
    async with daemon_and_client(settings) as (_daemon, _plain), _client(settings) as memory:
        yield memory


def _client(settings: Settings) -> MemoryClient:
    return MemoryClient(bootstrap=settings.kafka_bootstrap, topics=settings.topics, timeout_s=30)


async def _say(
    memory: MemoryClient, agent: str, session: str, turn: int, text: str, at: datetime, **kw: object
) -> None:
    receipt = await memory.publish_observation(
        agent_id=agent, session_id=session, turn=turn, content=text, timestamp=at, wait=True, **kw
    )
    assert receipt.ack is not None and receipt.ack.status == "indexed", receipt


def _said(items: list[object]) -> list[tuple[str, int, str]]:
    return [(i.metadata["session_id"], i.metadata["turn"], i.content) for i in items]  # type: ignore[attr-defined]


async def test_the_latest_turns_of_a_session_and_of_an_agent_oldest_first(client: MemoryClient) -> None:
    """Published out of order over two days and two sessions: a session's latest turns by time,
    the agent's across its sessions, the limit keeping the newest, a long turn whole, and
    nothing of another agent."""
    agent, other = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    long_turn = " ".join(f"Step {i}: drained pool {i} and checked its replicas before the next." for i in range(80))
    await _say(client, agent, "day2", 1, "Raised the ledger pool to 40.", DAY + timedelta(days=1, minutes=1))
    await _say(client, agent, "day1", 0, "The ledger pool ran dry at 02:00.", DAY)
    await _say(client, agent, "day1", 1, long_turn, DAY + timedelta(minutes=5), role="user")
    await _say(client, agent, "day2", 0, "Pool exhausted again overnight.", DAY + timedelta(days=1))
    await _say(client, agent, "day2", 2, "Nightly batch finished cleanly.", DAY + timedelta(days=1, minutes=2))
    await _say(client, other, "day2", 0, "Another agent's turn.", DAY + timedelta(days=2))

    day1 = (await client.recent(agent, "day1")).items
    assert _said(day1) == [("day1", 0, "The ledger pool ran dry at 02:00."), ("day1", 1, long_turn)]
    assert day1[1].metadata["role"] == "user" and day1[1].status == "found" and day1[1].version is None
    everything = await client.recent(agent)
    assert [(s, t) for s, t, _ in _said(everything.items)] == [
        ("day1", 0),
        ("day1", 1),
        ("day2", 0),
        ("day2", 1),
        ("day2", 2),
    ]
    latest = await client.recent(agent, limit=2)
    assert [(s, t) for s, t, _ in _said(latest.items)] == [("day2", 1), ("day2", 2)]
    assert latest.items[-1].timestamp == "2026-11-21T09:02:00Z"

    # A filter applies before the limit: the latest two turns within it, not the two latest.
    filtered = await client.recent(agent, limit=2, metadata_filter={"session_id": "day1"})
    assert [(s, t) for s, t, _ in _said(filtered.items)] == [("day1", 0), ("day1", 1)]

    # A forgotten session's turns are gone from it; an unknown agent has none.
    await client.forget(agent_id=agent, session_id="day1", wait=True)
    assert [(s, t) for s, t, _ in _said((await client.recent(agent)).items)] == [("day2", 0), ("day2", 1), ("day2", 2)]
    assert (await client.recent(f"nobody-{uuid.uuid4().hex[:6]}")).items == []


async def test_one_forgotten_turn_leaves_the_session_around_it(client: MemoryClient) -> None:
    """``forget(turn=)`` over Kafka: acked for that turn, which is gone; the others stay."""
    agent = f"f-{uuid.uuid4().hex[:6]}"
    for n, text in enumerate(["Opened the ticket.", "My card number is 4111 1111.", "Closed the ticket."]):
        await _say(client, agent, "s", n, text, DAY + timedelta(minutes=n))
    receipt = await client.forget(agent_id=agent, session_id="s", turn=1, wait=True)
    assert receipt.ack is not None and receipt.ack.status == "indexed" and receipt.doc_id.endswith("/s/1"), receipt
    assert [t for _, t, _ in _said((await client.recent(agent)).items)] == [0, 2]
    with pytest.raises(InvalidRequest, match="names its session_id"):
        await client.forget(agent_id=agent, all_sessions=True, turn=1)


async def test_a_bad_recent_request_is_an_error_reply(client: MemoryClient) -> None:
    with pytest.raises(QueryFailed, match=r"invalid_request.*limit"):
        await client.recent("a", limit=0)
    with pytest.raises(QueryFailed, match="unknown metadata_filter key 'nope'"):
        await client.recent("a", metadata_filter={"nope": "x"})
    with pytest.raises(QueryFailed, match=r"invalid_request.*agent_id"):
        await client.recent("")


async def test_turns_of_one_time_come_in_turn_order_and_a_filter_reaches_past_newer_turns(
    client: MemoryClient,
) -> None:
    """A session imported with one time for all its turns: the latest are its highest turn
    numbers, whatever order they were written in. A filter applies inside the search, so the
    one turn it lets through is found behind many newer ones."""
    agent = f"t-{uuid.uuid4().hex[:6]}"
    for n in reversed(range(10)):
        await _say(client, agent, "tie", n, f"Imported line {n}.", DAY)
    latest = await client.recent(agent, "tie", limit=2)
    assert [t for _, t, _ in _said(latest.items)] == [8, 9]
    await _say(client, agent, "old", 0, "The oldest note.", DAY - timedelta(days=30))
    for n in range(45):
        await _say(client, agent, "new", n, f"Newer note {n}.", DAY + timedelta(hours=n))
    only = await client.recent(agent, limit=1, metadata_filter={"session_id": "old"})
    assert _said(only.items) == [("old", 0, "The oldest note.")]
    assert (await client.recent(agent, "tie", metadata_filter={"session_id": "new"})).items == []


async def test_a_turn_or_document_too_large_for_one_reply_comes_back_cut(client: MemoryClient) -> None:
    """A turn or a document that alone does not fit one reply keeps the start of its content,
    and says so; a recent read keeps the newest turn over the older ones."""
    agent = f"l-{uuid.uuid4().hex[:6]}"
    huge = " ".join(f"Line {i}: the replica at rack {i % 7} lagged by {i} ms." for i in range(900))
    assert len(huge) > REPLY_MAX_BYTES
    await _say(client, agent, "s", 0, "A short first turn.", DAY)
    await _say(client, agent, "s", 1, huge, DAY + timedelta(minutes=1))
    reply = await client.recent(agent)
    assert reply.truncated and [i.metadata["turn"] for i in reply.items] == [1]  # type: ignore[index]
    item = reply.items[0]
    assert item.content_truncated and item.content and huge.startswith(item.content)
    assert len(item.content) > REPLY_MAX_BYTES // 2
    doc_id = f"runbooks/{agent}.md"
    receipt = await client.publish_document(doc_id, huge, wait=True)
    assert receipt.ack is not None and receipt.ack.status == "indexed"
    got = await client.get([doc_id, "runbooks/another.md"])
    assert not got.truncated and [(i.doc_id, i.status) for i in got.items] == [
        (doc_id, "found"),
        ("runbooks/another.md", "not_found"),
    ]
    assert got.items[0].content_truncated and huge.startswith(got.items[0].content or "-")
    short = await client.get(turns=[(agent, "s", 0)])
    assert not short.truncated and short.items[0].content == "A short first turn."
    assert not short.items[0].content_truncated


async def test_recent_turns_stay_within_their_tenant(kafka_bootstrap: str, redis_url: str) -> None:
    """In topic tenancy, the same agent id in two tenants: each reads only its own turns."""
    async with topic_tenancy_daemon(unique("recent-tenants"), kafka_bootstrap, redis_url, ("t1", "t2")) as env:
        _daemon, _plain, settings = env
        async with MemoryClient(bootstrap=settings.kafka_bootstrap, topics=settings.topics, timeout_s=30) as memory:
            for tenant in ("t1", "t2"):
                receipt = await memory.publish_observation(
                    agent_id="shared", session_id="s", turn=0, content=f"{tenant}'s own turn.", tenant=tenant, wait=True
                )
                assert receipt.ack is not None and receipt.ack.status == "indexed"
            for tenant in ("t1", "t2"):
                reply = await memory.recent("shared", tenant=tenant)
                assert [i.content for i in reply.items] == [f"{tenant}'s own turn."]
