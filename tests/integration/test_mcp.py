"""`agentmemd mcp` through the MCP SDK's own client, against the real broker, daemon and Redis:
over stdio and over streamable HTTP (with its bearer token), every tool, read-your-writes
without sleeps, tool errors that leave the server serving, and an outage answered in time."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from consumers.client import MemoryClient
from consumers.config import ConsumerConfig
from daemon.about import package_version
from daemon.launcher import free_port, start_tansu
from daemon.mcp_views import CUT_SEARCH
from daemon.settings import Settings
from daemon.topics import ensure_topics
from tests.conftest import unique
from tests.helpers import daemon_and_client, isolated_settings, settings_env

pytestmark = pytest.mark.integration

AGENTMEMD = str(Path(sys.executable).parent / "agentmemd")
CHECKOUT = str(Path(__file__).resolve().parents[2])
TOOLS = {
    "search_memory",
    "remember",
    "upsert_document",
    "delete_document",
    "forget",
    "get_document",
    "recent_turns",
    "memory_status",
}


@pytest.fixture(scope="module")
async def settings(kafka_bootstrap: str, redis_url: str) -> AsyncIterator[Settings]:
    # The daemon serves HTTP, so memory_status can report its /readyz.
    s = isolated_settings(unique(__name__), kafka_bootstrap, redis_url, http_port=free_port())
    async with daemon_and_client(s):
        yield s


def server_env(settings: Settings, **extra: str) -> dict[str, str]:
    return {
        **settings_env(settings),
        "PYTHONPATH": os.pathsep.join([CHECKOUT, os.environ.get("PYTHONPATH", "")]),
        "AGENTMEM_LOG_LEVEL": "warning",
        **extra,
    }


def stdio(settings: Settings, **extra: str) -> Client:
    params = StdioServerParameters(command=AGENTMEMD, args=["mcp"], env=server_env(settings, **extra))
    return Client(params, read_timeout_seconds=30)


def data(result: CallToolResult) -> Any:
    """A successful call's JSON (a list tool's comes wrapped as ``{"result": [...]}``)."""
    assert not result.is_error, error_text(result)
    body = result.structured_content
    return body["result"] if isinstance(body, dict) and set(body) == {"result"} else body


def error_text(result: CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, which anyio's task groups raise."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in leaves(e)]
    return [exc]


async def failed(client: Client, tool: str, **args: Any) -> str:
    result = await client.call_tool(tool, args)
    assert result.is_error, result
    return error_text(result)


async def ok(client: Client, tool: str, **args: Any) -> Any:
    return data(await client.call_tool(tool, args))


async def test_every_tool_over_stdio(settings: Settings) -> None:
    agent, doc = f"agent-{uuid.uuid4().hex[:6]}", f"mcp/{uuid.uuid4().hex[:8]}.md"
    mine = {"agent_id": agent}
    async with stdio(settings) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert set(tools) == TOOLS
        # a host model reads the bounds from the schema, not from a failed call
        top_k = tools["search_memory"].input_schema["properties"]["top_k"]
        assert (top_k["minimum"], top_k["maximum"]) == (1, 100), top_k
        # and the filter keys this deployment indexes from the description, not from a failed call
        said = tools["search_memory"].description or ""
        assert "here environment, service, agent_id, session_id, kind, doc_id, source" in said, said
        assert c.server_info is not None and c.server_info.version == package_version()

        # remember: turns allocated 0, 1, ... and found by the very next search (no sleep).
        first = await ok(c, "remember", text="The beta ships on Friday.", agent_id=agent, session_id="s1")
        assert (first["status"], first["turn"]) == ("indexed", 0)
        said = "Alice owns the ERR_QUOTA_7F2 quota alerts."
        second = await ok(c, "remember", text=said, agent_id=agent, session_id="s1", role="user")
        assert (second["status"], second["turn"]) == ("indexed", 1)
        # The retry of a call that timed out: the same turn again is stored once; another's is refused.
        again = await ok(c, "remember", text=said, agent_id=agent, session_id="s1", role="user", turn=1, if_absent=True)
        assert (again["status"], again["turn"]) == ("indexed", 1), again
        taken = await failed(
            c, "remember", text="Another text.", agent_id=agent, session_id="s1", turn=1, if_absent=True
        )
        assert taken.startswith("conflict: turn 1 holds another turn: nothing was written"), taken
        hits = await ok(c, "search_memory", query="who owns ERR_QUOTA_7F2", filters=mine)
        assert hits[0]["doc_id"] == second["doc_id"] and hits[0]["kind"] == "transcript"
        assert {"text", "score", "source", "doc_id", "kind", "metadata", "timestamp"} <= set(hits[0])
        assert hits[0]["ranks"]["identifier"] == 1 and hits[0]["ranks"]["sparse"] == 1, hits[0]
        assert "context" not in hits[0]
        # context_turns: the turn comes with the exchange around it.
        around = await ok(c, "search_memory", query="who owns ERR_QUOTA_7F2", filters=mine, context_turns=1)
        assert around[0]["doc_id"] == second["doc_id"]
        assert [(t["turn"], t["role"], t["text"]) for t in around[0]["context"]] == [
            (0, "assistant", "The beta ships on Friday.")
        ]
        # an exclusion: the agent's memories outside its session s1 (none yet)
        others = await ok(
            c, "search_memory", query="who owns ERR_QUOTA_7F2", filters={**mine, "session_id": {"not": "s1"}}
        )
        assert others == []
        turn = await ok(c, "get_document", doc_id=first["doc_id"])
        assert (turn["status"], turn["content"]) == ("found", "The beta ships on Friday.")
        # recent_turns: the session's latest turns, oldest first, as an agent picks up again.
        latest = await ok(c, "recent_turns", agent_id=agent, session_id="s1", limit=1)
        assert [(t["doc_id"], t["content"], t["metadata"]["role"]) for t in latest] == [
            (second["doc_id"], said, "user")
        ]
        both = await ok(c, "recent_turns", agent_id=agent)
        assert [t["doc_id"] for t in both] == [first["doc_id"], second["doc_id"]]
        assert "recent_turns: limit" in await failed(c, "recent_turns", agent_id=agent, limit=0)

        # upsert_document -> get_document finds it at once; delete_document -> not_found.
        runbook = "Runbook: raise lock_timeout for ERR_LEDGER_LOCK_9C1."
        put = await ok(c, "upsert_document", doc_id=doc, content=runbook, metadata={"team": "ledger"})
        assert (put["status"], put["doc_id"]) == ("indexed", doc)
        got = await ok(c, "get_document", doc_id=doc)
        assert (got["status"], got["version"], got["metadata"]["team"]) == ("found", put["version"], "ledger")
        # An edit: history=true reads what the runbook said before, and until when.
        edited = "Runbook: drain the queue, then raise lock_timeout for ERR_LEDGER_LOCK_9C1."
        await ok(c, "upsert_document", doc_id=doc, content=edited, metadata={"team": "ledger"})
        both = await ok(c, "get_document", doc_id=doc, history=True)
        assert both["content"] == edited and "history_truncated" not in both
        assert [(v["content"], v["version"]) for v in both["history"]] == [(runbook, put["version"])]
        assert both["history"][0]["until"] is not None
        # version reads the one before by its number; content_offset reads on from a character.
        before = await ok(c, "get_document", doc_id=doc, version=put["version"])
        assert (before["content"], before["version"]) == (runbook, put["version"]) and before["until"]
        rest = await ok(c, "get_document", doc_id=doc, content_offset=len("Runbook: "))
        assert rest["content"] == edited.removeprefix("Runbook: ") and "content_truncated" not in rest
        assert "ask for history without it" in await failed(c, "get_document", doc_id=doc, version=1, history=True)
        # A content longer than max_chars comes in parts, each saying where the next starts.
        parts, at = [], {}
        while True:
            part = await ok(c, "get_document", doc_id=doc, max_chars=10, **at)
            parts.append(part["content"])
            if "read_on" not in part:
                break
            assert part["content_truncated"] and part["read_on"]["version"] == part["version"]
            at = part["read_on"]
        assert "".join(parts) == edited and len(parts) == -(-len(edited) // 10)
        assert "history" not in await ok(c, "get_document", doc_id=doc)
        assert "history" in await failed(c, "get_document", doc_id=doc, history="yes")  # a flag is a boolean
        newest = await ok(c, "search_memory", query="ERR_LEDGER_LOCK_9C1", top_k=3, recency_weight=1.0)
        assert newest[0]["doc_id"] == doc and newest[0]["text"] == edited
        dated = await ok(c, "upsert_document", doc_id=doc, content=edited + " Dated.", timestamp="2026-02-03T04:05:06Z")
        assert (await ok(c, "get_document", doc_id=doc))["timestamp"].startswith("2026-02-03T04:05:06")
        assert dated["status"] == "indexed"
        assert doc in [h["doc_id"] for h in await ok(c, "search_memory", query="ERR_LEDGER_LOCK_9C1", top_k=3)]
        assert await ok(c, "search_memory", query="ERR_LEDGER_LOCK_9C1", until="2000-01-01T00:00:00Z") == []
        await ok(c, "upsert_document", doc_id=doc + ".bak", content="A copy of the runbook.")
        deleted = await ok(c, "delete_document", doc_id=doc)
        assert (deleted["status"], deleted["removed"]) == ("indexed", 1) and "note" not in deleted, deleted
        assert (await ok(c, "get_document", doc_id=doc))["status"] == "not_found"
        # A misspelt id deletes nothing: said, with the id it nearly spells.
        typo = await ok(c, "delete_document", doc_id=doc + ".bax")
        assert typo["removed"] == 0 and "nothing was stored under this doc_id" in typo["note"], typo
        assert typo["did_you_mean"] == doc + ".bak", typo

        # Bad arguments: tool errors with the contract's code, and the server goes on serving.
        assert (await failed(c, "search_memory", query="x", top_k=0)).startswith(
            "invalid_request: search_memory: top_k"
        )
        # A count is a whole number: "3" would have been read as 3, and true as 1.
        assert "top_k" in await failed(c, "search_memory", query="x", top_k="3")
        assert "top_k" in await failed(c, "search_memory", query="x", top_k=True)
        assert "turn" in await failed(c, "remember", text="x", agent_id="a", session_id="s", turn="3")
        unknown = await failed(c, "search_memory", query="x", filters={"no_such_key": "1"})
        assert unknown.startswith("invalid_request:") and "no_such_key" in unknown
        assert "ISO 8601" in await failed(c, "search_memory", query="x", since="last tuesday")
        assert "context_turns" in await failed(c, "search_memory", query="x", context_turns=11)
        # an object of another key than "not": the daemon's one sentence, not the SDK's union dump
        wrong = await failed(c, "search_memory", query="x", filters={"session_id": {"nope": "a"}})
        assert wrong.startswith("invalid_request:") and "one key is 'not'" in wrong and "list[" not in wrong
        # a past conversation imported with its time
        old = await ok(
            c,
            "remember",
            text="We met in May.",
            agent_id=f"{agent}-import",
            session_id="s0",
            timestamp="2026-05-02T10:00:00Z",
        )
        said = await ok(c, "get_document", doc_id=old["doc_id"])
        assert said["timestamp"].startswith("2026-05-02T10:00:00")
        assert "ISO 8601" in await failed(
            c, "remember", text="x", agent_id=f"{agent}-import", session_id="s0", timestamp="soon"
        )
        assert (await failed(c, "forget", agent_id=agent)).startswith("invalid_request:")
        # Arguments the tool's schema refuses read as the other failures do: the code, the
        # tool, the field and the problem, not pydantic's dump with its links.
        for tool, args, want in (
            ("search_memory", {}, "invalid_request: search_memory: query: Field required"),
            ("remember", {"text": "x", "agent_id": agent}, "invalid_request: remember: session_id: Field required"),
            ("search_memory", {"query": "x", "context_turns": 11}, "invalid_request: search_memory: context_turns: "),
            ("search_memory", {"query": "  "}, "invalid_request: query is empty"),
            # a write the daemon would dead-letter is invalid_event, in the tool's own words
            ("remember", {"text": "x", "agent_id": "", "session_id": "s"}, "invalid_event: agent_id: "),
            ("remember", {"text": "", "agent_id": "a", "session_id": "s"}, "invalid_event: text: text is empty"),
            ("get_document", {"doc_id": ""}, "invalid_request: doc_id: "),
            ("search_memory", {"query": "x" * 20_000}, "invalid_request: query is longer than"),
            # an argument the tool does not take is refused, not read past: unfiltered otherwise
            ("search_memory", {"query": "x", "filter": mine}, "invalid_request: search_memory: unknown argument "),
            ("memory_status", {"verbose": True}, "invalid_request: memory_status: unknown argument 'verbose'"),
        ):
            text = await failed(c, tool, **args)
            assert text.startswith(want) and "pydantic.dev" not in text, text
        assert (await failed(c, "upsert_document", doc_id=doc, content="   ")).startswith("invalid_event:")
        assert "did you mean 'filters'?" in await failed(c, "search_memory", query="x", filter=mine)

        # A session that held nothing (a misspelt id) is acked with the sessions there are.
        missed = await ok(c, "forget", agent_id=agent, session_id="s11")
        assert missed["forgotten"] == 0 and missed["did_you_mean"] == "s1" and "s1" in missed["latest_sessions"], missed
        forgot = await ok(c, "forget", agent_id=agent, session_id="s1")
        assert forgot["status"] == "indexed" and "did_you_mean" not in forgot, forgot
        assert await ok(c, "search_memory", query="beta Friday", filters=mine) == []
        assert await ok(c, "recent_turns", agent_id=agent) == []
        # The forgotten session starts over at turn 0.
        assert (await ok(c, "remember", text="Fresh start.", agent_id=agent, session_id="s1"))["turn"] == 0
        await ok(c, "remember", text="Elsewhere.", agent_id=agent, session_id="s2")
        assert [t["content"] for t in await ok(c, "recent_turns", agent_id=agent, session_id="s1")] == ["Fresh start."]

        status = await ok(c, "memory_status")
        assert status["daemon"]["answering"] is True
        assert status["http"]["ready"] is True, status


async def test_turns_continue_across_server_processes(settings: Settings) -> None:
    """A second server process (or a restarted one) finds the session's next free turn itself."""
    who = {"agent_id": f"agent-{uuid.uuid4().hex[:6]}", "session_id": "s"}
    async with stdio(settings) as a, stdio(settings) as b:
        assert (await ok(a, "remember", text="one", **who))["turn"] == 0
        assert (await ok(b, "remember", text="two", **who))["turn"] == 1
        assert (await ok(a, "remember", text="three", **who))["turn"] == 2
        assert (await ok(a, "remember", text="seven", turn=7, **who))["turn"] == 7
        assert (await ok(b, "remember", text="eight", **who))["turn"] == 8


@contextmanager
def http_server(settings: Settings, port: int, token: str) -> Iterator[None]:
    import subprocess

    proc = subprocess.Popen(
        [AGENTMEMD, "mcp", "--http", "--port", str(port)],
        env={**os.environ, **server_env(settings, AGENTMEM_MCP__TOKEN=token)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None, proc.communicate()[1].decode()
                assert time.monotonic() < deadline, "agentmemd mcp --http never listened"
                time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_streamable_http_needs_the_bearer_token(settings: Settings) -> None:
    port, token = free_port(), uuid.uuid4().hex
    url = f"http://127.0.0.1:{port}/mcp"
    doc = f"mcp/{uuid.uuid4().hex[:8]}.md"
    with http_server(settings, port, token):
        async with httpx2.AsyncClient(timeout=10) as raw:
            ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}):
                refused = await raw.post(url, json=ping, headers=headers)
                assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
        authed = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
        async with authed, Client(streamable_http_client(url, http_client=authed), read_timeout_seconds=30) as client:
            assert {t.name for t in (await client.list_tools()).tools} == TOOLS
            put = await ok(client, "upsert_document", doc_id=doc, content="The HTTP door opens with a token.")
            assert put["status"] == "indexed"
            assert (await ok(client, "get_document", doc_id=doc))["status"] == "found"
            assert (await failed(client, "search_memory", query="x", top_k=1000)).startswith("invalid_request:")
            assert doc in [h["doc_id"] for h in await ok(client, "search_memory", query="HTTP door token", top_k=3)]
        # The SDK's client with a wrong token does not get in either.
        wrong = httpx2.AsyncClient(headers={"Authorization": "Bearer not-it"}, timeout=10)
        with pytest.raises(BaseException) as refused_by_sdk:
            async with wrong, Client(streamable_http_client(url, http_client=wrong), read_timeout_seconds=10) as c:
                await c.list_tools()
        # The SDK reports the 401 only as a generic error response (the raw POSTs above show the 401).
        assert all(isinstance(e, MCPError) for e in leaves(refused_by_sdk.value)), refused_by_sdk.value


async def test_an_outage_is_a_tool_error_in_bounded_time(settings: Settings) -> None:
    """A broker that is not there: each call fails within the deadline, and the server stays up."""
    dead = f"127.0.0.1:{free_port()}"
    async with stdio(settings, AGENTMEM_KAFKA_BOOTSTRAP=dead, AGENTMEM_MCP__TIMEOUT_S="3") as client:
        for tool, args in (
            ("search_memory", {"query": "anything"}),
            ("remember", {"text": "lost?", "agent_id": "a", "session_id": "s"}),
        ):
            started = time.monotonic()
            text = await failed(client, tool, **args)
            assert time.monotonic() - started < 10, text
            assert text.split(":")[0] in ("unavailable", "timeout"), text
        status = await asyncio.wait_for(ok(client, "memory_status"), 15)
        assert status["daemon"]["answering"] is False
        assert json.dumps(status)  # plain JSON for the model


async def test_a_broker_that_stops_is_a_tool_error_in_bounded_time(settings: Settings, tmp_path: Path) -> None:
    """A private broker that no daemon reads (the call times out), then stops under the running
    server (the calls fail within the deadline), and the server answers throughout."""
    broker = start_tansu(f"127.0.0.1:{free_port()}", log_dir=tmp_path)
    try:
        topics = [settings.topics.requests, settings.topics.replies, settings.topics.transcripts]
        await ensure_topics(broker.address, topics, partitions=1, replication=1)
        async with stdio(settings, AGENTMEM_KAFKA_BOOTSTRAP=broker.address, AGENTMEM_MCP__TIMEOUT_S="2") as c:
            started = time.monotonic()
            text = await failed(c, "search_memory", query="is anyone there")
            assert text.startswith("timeout: search_memory: no answer") and time.monotonic() - started < 5, text
            # remember looks the session's next turn up first: timed out there, it sent nothing.
            text = await failed(c, "remember", text="unsent", agent_id="a", session_id="s")
            assert text.startswith("timeout: remember") and "Nothing was written" in text, text
            text = await failed(c, "remember", text="sent", agent_id="a", session_id="s", turn=3)
            assert "turn 3 of session 's' may still be written" in text and "turn=3 and if_absent=true" in text, text
            # The daemon's /readyz says ready while nobody reads this broker: the status says
            # what most often causes that (a server without the daemon's tenancy).
            status = await ok(c, "memory_status")
            assert status["daemon"]["answering"] is False and status["http"]["ready"] is True, status
            assert "--tenant" in status["hint"] and "check memory_status" not in status["daemon"]["error"]
            broker.stop()
            for tool, args in (
                ("search_memory", {"query": "anything"}),
                ("remember", {"text": "lost?", "agent_id": "a", "session_id": "s"}),
            ):
                started = time.monotonic()
                text = await failed(c, tool, **args)
                assert time.monotonic() - started < 5, text
                assert text.split(":")[0] in ("unavailable", "timeout"), text
            assert (await ok(c, "memory_status"))["daemon"]["answering"] is False
    finally:
        broker.stop()


def test_http_on_a_public_address_without_a_token_is_refused() -> None:
    """`--host 0.0.0.0` with no token only logged a warning and served
    every memory, reads and writes, to whoever reached the port (the explorer refuses)."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "AGENTMEM_MCP__TOKEN"}
    res = subprocess.run(
        [AGENTMEMD, "mcp", "--http", "--host", "0.0.0.0", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    said = " ".join(res.stderr.split())  # (the console wraps it)
    assert res.returncode == 1 and "no token is set" in said and "AGENTMEM_MCP__TOKEN" in said, res
    # The same address given by the setting, as an operator's .env gives it, is read and refused alike.
    res = subprocess.run(
        [AGENTMEMD, "mcp", "--http"],
        env={**env, "AGENTMEM_MCP__HOST": "0.0.0.0", "AGENTMEM_MCP__PORT": str(free_port())},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 1 and "address 0.0.0.0 (--host or AGENTMEM_MCP__HOST)" in " ".join(res.stderr.split()), res


async def test_a_search_cut_to_fit_one_record_says_so(kafka_bootstrap: str, redis_url: str) -> None:
    """The daemon cuts a reply to fit one Kafka record: the tool's result says so in a note
    beside its JSON (the structured result keeps its shape), and says nothing when whole."""
    name = unique("mcp-cut")
    consumer = ConsumerConfig(group_id=name, reply_max_bytes=6_000)
    s = isolated_settings(name, kafka_bootstrap, redis_url, consumer=consumer)
    async with daemon_and_client(s), MemoryClient(bootstrap=s.kafka_bootstrap, topics=s.topics) as memory:
        for i in range(6):
            await memory.publish_document(f"mcp/cut-{i}.md", f"The harbor ledger holds entry {i}. " * 40, wait=True)
        async with stdio(s) as c:
            cut = await c.call_tool("search_memory", {"query": "harbor ledger entry", "top_k": 10})
            texts = [t.text for t in cut.content if isinstance(t, TextContent)]
            assert len(texts) == 2 and texts[1] == CUT_SEARCH, texts[1:]
            assert json.loads(texts[0]) == data(cut) and 0 < len(data(cut)) < 6
            whole = await c.call_tool("search_memory", {"query": "harbor ledger entry", "top_k": 1})
            assert len(whole.content) == 1 and len(data(whole)) == 1
