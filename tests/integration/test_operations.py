"""Operators' endpoints with dependencies up and down, and the status page in a real browser."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aredis
from structlog.testing import capture_logs

from daemon.instance import Daemon
from daemon.launcher import (
    LauncherError,
    ServerProcess,
    data_dir_lock,
    embedded_servers,
    free_port,
    start_redis,
    start_tansu,
)
from graph.config import GraphConfig
from memory.index import GenerationRegistry
from memory.keys import chunk_prefix, dir_docs_key, directory_flag, physical_name, registry_key
from tests.conftest import unique
from tests.helpers import (
    PlainClient,
    chromium,
    chromium_flags,
    daemon_and_client,
    eventually,
    isolated_settings,
    settings_env,
    start_daemon,
)

pytestmark = pytest.mark.integration


def http_get(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def get(url: str, timeout: float = 10) -> tuple[int, str]:
    return await asyncio.to_thread(http_get, url, timeout)


class Env:
    def __init__(
        self,
        daemon: Daemon,
        client: PlainClient,
        redis: ServerProcess,
        broker: ServerProcess,
        base: str,
        redis_url: str,
        data: Path,
        bootstrap: str,
        tmp: Path,
    ) -> None:
        self.daemon, self.client, self.redis, self.broker = daemon, client, redis, broker
        self.base, self.redis_url, self.data, self.bootstrap, self.tmp = base, redis_url, data, bootstrap, tmp


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[Env]:
    tmp = Path(tempfile.mkdtemp(prefix="agentmemd-ops-"))
    redis_url = f"redis://127.0.0.1:{free_port()}/0"
    redis = start_redis(redis_url, data_dir=tmp / "redis")
    bootstrap = f"127.0.0.1:{free_port()}"
    broker = start_tansu(bootstrap, log_dir=tmp)
    port = free_port()
    name = unique(__name__)
    settings = isolated_settings(
        name,
        bootstrap,
        redis_url,
        topic_partitions=1,
        http_port=port,
        status_sample_s=0.5,
        topic_check_s=1.0,
        # no summarizer here, so the stale queue holds still for the page test
        graph=GraphConfig(summarizer_concurrency=0),
    )
    daemon = await start_daemon(settings)
    client = PlainClient(bootstrap, settings.topics, settings.topics.replies)
    await client.start()
    env = Env(daemon, client, redis, broker, f"http://127.0.0.1:{port}", redis_url, tmp / "redis", bootstrap, tmp)
    yield env
    await env.client.stop()
    await env.daemon.stop()
    env.broker.stop()
    env.redis.stop()
    shutil.rmtree(tmp, ignore_errors=True)


async def ready_is(env: Env, code: int) -> bool:
    status, _ = await get(env.base + "/readyz")
    return status == code


async def test_health_ready_and_metrics(env: Env) -> None:
    """/healthz is alive, /readyz passes with every check ok, /metrics counts events and queries."""
    status, body = await get(env.base + "/healthz")
    assert status == 200 and json.loads(body)["status"] == "alive"
    await eventually(lambda: ready_is(env, 200), what="ready")
    _, body = await get(env.base + "/readyz")
    assert json.loads(body) == {"ready": True, "checks": {"redis": "ok", "index": "ok", "kafka": "ok"}}
    t = env.client.topics
    await env.client.send(
        t.documents,
        {
            "event_id": "m",
            "op": "upsert",
            "doc_id": "ops/m.md",
            "version": 1,
            "content": "metrics are counted for ERR_OPS_1",
        },
    )
    await env.client.send(t.documents, b"{broken")

    async def indexed() -> bool:
        return bool(await env.daemon.index.chunk_ids("ops/m.md"))

    await eventually(indexed, what="doc indexed")
    _, reply = await env.client.ask({"query_id": "m", "search_text": "ERR_OPS_1", "top_k": 1})
    assert reply["results"]
    _, metrics = await get(env.base + "/metrics")
    assert re.search(rf'agentmemd_events_consumed_total\{{topic="{re.escape(t.documents)}"\}} 2\.0', metrics)
    assert re.search(r'agentmemd_events_dead_lettered_total\{code="invalid_event",topic="[^"]+"\} 1\.0', metrics)
    assert 'agentmemd_query_seconds_count{outcome="ok",scope="chunks"}' in metrics
    assert 'agentmemd_query_leg_seconds_count{leg="sparse"}' in metrics
    assert 'agentmemd_tenant_queries_total{outcome="ok",tenant="default"}' in metrics
    assert "agentmemd_consumer_lag{" in metrics and "agentmemd_index_chunks" in metrics

    async def writes_sampled() -> bool:
        # Sampled with the chunk count, every status_sample_s: each chunk was written at least once.
        _, metrics = await get(env.base + "/metrics")
        return float(re.findall(r"^agentmemd_index_writes_per_chunk (\S+)$", metrics, re.M)[0]) >= 1.0

    await eventually(writes_sampled, timeout=30, what="writes per chunk sampled")


async def test_a_kind_filter_outside_the_scope_is_an_invalid_request(env: Env) -> None:
    """kind=community under the default scope (chunks) could only answer an empty list: the
    asker is told which scope to ask with instead."""
    _, reply = await env.client.ask(
        {"query_id": "k1", "search_text": "ERR_OPS_1", "metadata_filter": {"kind": "community"}}
    )
    assert reply["error"]["code"] == "invalid_request", reply
    assert "outside scope 'chunks'" in reply["error"]["message"] and "'communities'" in reply["error"]["message"]
    _, reply = await env.client.ask(
        {"query_id": "k2", "search_text": "ERR_OPS_1", "scope": "all", "metadata_filter": {"kind": "community"}}
    )
    assert "results" in reply, reply


async def test_readyz_fails_with_the_reason_when_redis_is_down(env: Env) -> None:
    """Redis down: /readyz is 503 and names Redis; /healthz stays 200; Redis back: ready again."""
    env.redis.stop()
    try:
        status, body = await get(env.base + "/readyz")
        assert status == 503
        checks = json.loads(body)["checks"]
        assert "unavailable" in checks["redis"] and checks["kafka"] == "ok"
        assert (await get(env.base + "/healthz"))[0] == 200
    finally:
        env.redis = start_redis(env.redis_url, data_dir=env.data)
    await eventually(lambda: ready_is(env, 200), timeout=30, what="ready after Redis returned")


async def test_readyz_answers_in_time_when_redis_hangs(env: Env) -> None:
    """With Redis paused (SIGSTOP), /readyz answers 503 within its Redis budget, saying Redis does
    not answer, not after the Redis client's 10 s socket timeout, past any probe's deadline (an
    urlopen timeout of 5 s would fail)."""
    await eventually(lambda: ready_is(env, 200), what="ready")
    env.redis.proc.send_signal(signal.SIGSTOP)
    try:
        status, body = await get(env.base + "/readyz", timeout=5)
        assert status == 503
        checks = json.loads(body)["checks"]
        assert "no answer from Redis within" in checks["redis"] and checks["kafka"] == "ok", checks
        # A question is answered `unavailable` once its own time is up (5 s by default), well
        # within an asker's timeout: the Redis client's 10 s socket timeout comes per command.
        _, reply = await env.client.ask({"query_id": "hung", "search_text": "walrus", "top_k": 3}, timeout=9)
        assert reply["error"]["code"] == "unavailable" and "no answer within 5 s" in reply["error"]["message"], reply
        # Doctor says it hangs, not to start a Redis that runs.
        res = await asyncio.to_thread(run_cli, settings_env(env.daemon.settings), "doctor")
        said = " ".join(res.stdout.split())
        assert res.returncode == 1 and "is hung or blocked" in said and "start Redis at" not in said, said
    finally:
        env.redis.proc.send_signal(signal.SIGCONT)
    await eventually(lambda: ready_is(env, 200), timeout=30, what="ready after Redis resumed")


async def test_readyz_fails_when_the_broker_is_down(env: Env) -> None:
    """Broker down: /readyz is 503 naming Kafka; broker back: ready again by itself."""
    env.broker.stop()
    seen: list[tuple[int, str]] = []

    async def names_the_broker() -> bool:
        # Wait for the condition itself: a 503 for another reason (seen once in CI, right after
        # the Redis test restarted Redis) must not pass for this one; the responses seen are
        # kept for the failure message.
        status, body = await get(env.base + "/readyz")
        seen.append((status, body))
        return status == 503 and "broker" in json.loads(body)["checks"]["kafka"]

    try:
        try:
            await eventually(names_the_broker, timeout=30, what="not ready without the broker, naming it")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last responses: {seen[-3:]}") from exc
        # The status page reads the same checks: it must not say ready where the probe does not.
        status, page = await get(env.base + "/")
        assert status == 200 and 'class="bad">not ready: ' in page and "broker" in page, page[:2000]
    finally:
        env.broker = start_tansu(env.bootstrap, log_dir=env.tmp)
    await eventually(lambda: ready_is(env, 200), timeout=60, what="ready after the broker returned")


async def test_status_page_in_a_real_browser(env: Env) -> None:
    """Headless Chromium renders the page; the stale-queue depth, DLQ and lag shown are the real ones."""
    browser = chromium()
    if browser is None:
        pytest.skip("no Chromium on this machine (.ci/run installs Debian's chromium where it can)")
    assert env.daemon.graph is not None
    await env.client.send(
        env.client.topics.documents,
        {
            "event_id": "p",
            "op": "upsert",
            "doc_id": "ops/page.md",
            "version": 1,
            "content": "The billing-service returns HTTP 504 when pgbouncer hits max_connections on db-01.prod",
        },
    )

    async def indexed() -> bool:
        return bool(await env.daemon.index.chunk_ids("ops/page.md"))

    # the broker was restarted by the previous test: the consumers may still be rejoining
    await eventually(indexed, timeout=120, what="page doc indexed")
    svc = env.daemon.graph.service()

    async def recomputed() -> bool:
        # The doc's chunks are written before its graph contribution (spaCy runs after the
        # write), so a recompute right away may see no entities yet; and the daemon's own
        # recompute loop may hold the lock. Retry until communities exist, all marked stale.
        return await svc.recompute(force=True) is not None and (await svc.store.stale())[0] > 0

    await eventually(recomputed, what="a forced recompute that marks communities stale")

    async def sampled() -> bool:
        depth, _ = await svc.store.stale()
        return depth > 0 and env.daemon.status.stale.get("default", {}).get("depth") == depth

    await eventually(sampled, what="the sampler saw the stale queue")
    depth, _ = await svc.store.stale()
    user_dir = tempfile.mkdtemp(prefix="chromium-")
    flags = chromium_flags(user_dir)
    try:
        dom = await asyncio.to_thread(
            subprocess.run,
            [browser, *flags, "--dump-dom", env.base + "/"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        shot = Path(env.tmp) / "status.png"
        await asyncio.to_thread(
            subprocess.run,
            [browser, *flags, f"--screenshot={shot}", "--window-size=1000,900", env.base + "/"],
            capture_output=True,
            timeout=60,
            check=False,
        )
    finally:
        shutil.rmtree(user_dir, ignore_errors=True)

    def num(element_id: str) -> str:
        m = re.search(rf'id="{element_id}">([^<]*)<', dom.stdout)
        assert m, (element_id, dom.stdout[:500], dom.stderr[-500:])
        return m.group(1)

    assert int(num("stale-depth")) == depth
    assert int(num("dlq-count")) == env.daemon.status.dlq_records
    assert int(num("consumer-lag")) >= 0 and int(num("chunks")) >= 1
    assert "stale-table" in dom.stdout and 'id="depth-chart"' in dom.stdout
    assert shot.exists() and shot.stat().st_size > 1000


def _has_docker_compose() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0


@pytest.mark.skipif(not _has_docker_compose(), reason="no docker compose client on this machine")
def test_compose_file_is_valid() -> None:
    """`docker compose config` accepts compose/docker-compose.yml (no engine needed)."""
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run(
        ["docker", "compose", "-f", str(root / "compose" / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr


def run_cli(env_vars: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    import os
    import sys

    agentmemd = str(Path(sys.executable).parent / "agentmemd")
    return subprocess.run(
        [agentmemd, *args],
        env={**os.environ, "COLUMNS": "200", **env_vars},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_doctor_exit_codes(env: Env) -> None:
    """doctor: exit 0 when all is well; 1 naming the problem for a schema mismatch or a dead Redis."""

    settings = env.daemon.settings
    good = settings_env(settings)
    res = await asyncio.to_thread(run_cli, good, "doctor")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "✓ index schema" in res.stdout and "✓ topics" in res.stdout and "✓ consumer groups" in res.stdout
    assert "✓ daemons" in res.stdout and ".documents: 1 member(s)" in res.stdout, res.stdout
    assert "✓ search timeout policy" in res.stdout and "✓ eviction policy" in res.stdout, res.stdout

    # a Redis set up to cut answers short (partial results on timeout) and to delete memory
    # when full: both named, with the fix
    client = env.daemon.redis
    await client.config_set("maxmemory-policy", "allkeys-lru")
    await client.execute_command("FT.CONFIG", "SET", "ON_TIMEOUT", "RETURN")
    try:
        res = await asyncio.to_thread(run_cli, good, "doctor")
        assert res.returncode == 1, res.stdout + res.stderr
        assert "✗ search timeout policy" in res.stdout and "ON_TIMEOUT return" in res.stdout, res.stdout
        assert "✗ eviction policy" in res.stdout and "maxmemory-policy noeviction" in res.stdout, res.stdout
    finally:
        await client.config_set("maxmemory-policy", "noeviction")
        await client.execute_command("FT.CONFIG", "SET", "ON_TIMEOUT", "FAIL")

    # an index of the same name with an older schema (no identifier field)
    await client.execute_command(
        "FT.CREATE", "old-index", "ON", "HASH", "PREFIX", "1", "old-index:chunk:", "SCHEMA", "text", "TEXT"
    )
    res = await asyncio.to_thread(run_cli, {**good, "AGENTMEM_INDEX__NAME": "old-index"}, "doctor")
    assert res.returncode == 1 and "✗ index schema" in res.stdout and "'idents'" in res.stdout and "fix:" in res.stdout

    res = await asyncio.to_thread(
        run_cli, {**good, "AGENTMEM_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}, "doctor"
    )
    assert res.returncode == 1 and "✗ redis" in res.stdout and "agentmemd servers" in res.stdout

    # a generation left beside the active one, and a build whose heartbeat stopped: reported,
    # with the way out, but not failures
    name = settings.index.name
    left, prefix = physical_name(name, 7), chunk_prefix(name, 7)
    await client.execute_command("FT.CREATE", left, "ON", "HASH", "PREFIX", "1", prefix, "SCHEMA", "text", "TEXT")
    registry = registry_key(name)
    await client.hset(registry, mapping={"building": 9, "building_owner": "reindex-gone", "building_heartbeat": 1.0})
    try:
        res = await asyncio.to_thread(run_cli, good, "doctor")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "generation 7 kept" in res.stdout and f"FT.DROPINDEX {name}-g7 DD" in res.stdout, res.stdout
        assert "generation 9 is being built by reindex-gone (abandoned" in res.stdout, res.stdout
    finally:
        await client.hdel(registry, "building", "building_owner", "building_heartbeat")
        await client.execute_command("FT.DROPINDEX", f"{name}-g7")

    # a generation created before the explorer's directory: said, with the way out, not a failure
    flag = directory_flag(name, (await GenerationRegistry(client, name).state()).active)
    assert await client.delete(flag) == 1
    try:
        res = await asyncio.to_thread(run_cli, good, "doctor")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "explorer directory" in res.stdout and "agentmemd reindex" in res.stdout, res.stdout
    finally:
        await client.set(flag, 1)
    assert "✓ explorer directory" in (await asyncio.to_thread(run_cli, good, "doctor")).stdout
    # a directory an older release's writes left short (here: one entry too many): a failure
    ghost = dir_docs_key(name, (await GenerationRegistry(client, name).state()).active, "default")
    await client.zadd(ghost, {"ghost.md": 0})
    try:
        res = await asyncio.to_thread(run_cli, good, "doctor")
        assert res.returncode == 1 and "✗ explorer directory" in res.stdout, res.stdout + res.stderr
        assert "documents listed" in res.stdout and "older release" in res.stdout, res.stdout
    finally:
        await client.zrem(ghost, "ghost.md")


def test_asyncapi_matches_the_contract_models(tmp_path: Path) -> None:
    """`agentmemd docs asyncapi` describes every topic with the contract models' own JSON schemas."""
    from consumers.events import DlqRecord, DocumentEvent, ForgetEvent, TranscriptEvent
    from consumers.requests import ErrorReply, QueryReply, QueryRequest

    out = tmp_path / "asyncapi.json"
    res = run_cli({}, "docs", "asyncapi", "--out", str(out))
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert doc["asyncapi"] == "3.0.0"
    addresses = {c["address"] for c in doc["channels"].values()}
    assert addresses == {"memory.documents", "memory.transcripts", "memory.requests", "memory.replies", "memory.dlq"}
    schemas = doc["components"]["schemas"]
    for model in (DocumentEvent, TranscriptEvent, ForgetEvent, QueryRequest, QueryReply, ErrorReply, DlqRecord):
        assert set(schemas[model.__name__]["properties"]) == set(model.model_json_schema()["properties"]), model
    payloads = {m["payload"]["$ref"].rsplit("/", 1)[1] for m in doc["components"]["messages"].values()}
    # the transcripts topic carries turns or forgets: a union of the two models
    union = "transcripts:Message:Payload"
    assert payloads == {"DocumentEvent", union, "QueryRequest", "QueryReply", "ErrorReply", "DlqRecord"}
    assert {r["$ref"].rsplit("/", 1)[1] for r in schemas[union]["anyOf"]} == {"TranscriptEvent", "ForgetEvent"}


def test_embedded_servers_refuse_a_port_already_in_use(tmp_path: Path) -> None:
    """Something already listens on the port: starting Redis or tansu there fails saying so,
    instead of returning as if started while the daemon talks to the other process."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LauncherError, match="already in use"):
            start_redis(f"redis://127.0.0.1:{port}/0", data_dir=tmp_path / "redis")
        with pytest.raises(LauncherError, match="already in use"):
            start_tansu(f"127.0.0.1:{port}", log_dir=tmp_path)
        with socket.socket() as also:  # both taken: one message names both settings
            also.bind(("127.0.0.1", 0))
            also.listen()
            other = also.getsockname()[1]
            with (
                pytest.raises(LauncherError) as both,
                embedded_servers(f"127.0.0.1:{other}", f"redis://127.0.0.1:{port}/0", tmp_path),
            ):
                pass
            assert "AGENTMEM_REDIS_URL" in str(both.value) and "AGENTMEM_KAFKA_BOOTSTRAP" in str(both.value)


def test_one_data_dir_serves_one_set_of_embedded_servers(tmp_path: Path) -> None:
    """A second `agentmemd up` on the data dir of a running one (moved to free ports) is
    refused before it starts a Redis that would append to the first one's AOF; the embedded
    Redis takes AGENTMEM_REDIS_PASSWORD."""
    import redis as sync_redis

    bootstrap = f"127.0.0.1:{free_port()}"
    url = f"redis://127.0.0.1:{free_port()}/0"
    with embedded_servers(bootstrap, url, tmp_path, redis_password="s3cret"):
        with pytest.raises(sync_redis.AuthenticationError):
            sync_redis.from_url(url).ping()
        assert sync_redis.from_url(url, password="s3cret").ping()
        other_url = f"redis://127.0.0.1:{free_port()}/0"
        with (
            pytest.raises(LauncherError, match=f"in use by pid {os.getpid()}"),
            embedded_servers(f"127.0.0.1:{free_port()}", other_url, tmp_path),
        ):
            pass
        with pytest.raises(sync_redis.ConnectionError):
            sync_redis.from_url(other_url).ping()  # no second Redis was started
    with data_dir_lock(tmp_path):  # released with the servers
        pass


def test_a_start_after_a_run_that_was_killed_waits_for_its_ports_and_says_what_was_lost(tmp_path: Path) -> None:
    """The lock file of a run killed with SIGKILL still names it: the next start says what such
    a stop loses, and waits for that run's servers, still exiting, to free their ports instead
    of failing on "already in use"; a clean stop leaves nothing to say."""
    import redis as sync_redis

    bootstrap_port = free_port()
    (tmp_path / ".agentmemd.lock").write_text("pid 4242\n")
    lingering = socket.socket()
    lingering.bind(("127.0.0.1", bootstrap_port))
    lingering.listen()
    closer = threading.Timer(1.0, lingering.close)  # the old broker, exiting on its SIGTERM
    closer.start()
    url = f"redis://127.0.0.1:{free_port()}/0"
    try:
        with capture_logs() as logs, embedded_servers(f"127.0.0.1:{bootstrap_port}", url, tmp_path):
            assert sync_redis.from_url(url).ping()
    finally:
        closer.cancel()
        lingering.close()
    found = [e for e in logs if e["event"] == "launcher.unclean_stop_found"]
    assert len(found) == 1 and found[0]["previous"] == "pid 4242" and "in memory" in found[0]["lost"]
    with capture_logs() as logs, embedded_servers(f"127.0.0.1:{free_port()}", url, tmp_path):
        pass
    assert not [e for e in logs if e["event"] == "launcher.unclean_stop_found"]


def test_the_embedded_redis_is_started_again_when_it_dies_and_keeps_its_data(tmp_path: Path) -> None:
    """`up` and `servers` look after their Redis: killed (as a crash or the OOM killer would),
    it is started again on its AOF, with what it held, and the exit is logged; the broker's
    exit is logged with what to do (it keeps its log in memory: not started again)."""
    import redis as sync_redis

    from daemon import launcher

    url = f"redis://127.0.0.1:{free_port()}/0"
    with capture_logs() as logs, embedded_servers(f"127.0.0.1:{free_port()}", url, tmp_path) as (broker, redis):
        client = sync_redis.from_url(url)
        client.set("kept", "yes")
        client.execute_command("BGREWRITEAOF")
        time.sleep(1.5)  # everysec: the write is on disk
        redis.proc.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 30 + launcher.KEEP_EVERY_S
        while True:
            try:
                if client.get("kept") == b"yes":
                    break
            except sync_redis.ConnectionError:
                pass
            assert time.monotonic() < deadline, logs
            time.sleep(0.2)
        broker.proc.send_signal(signal.SIGKILL)
        time.sleep(2 * launcher.KEEP_EVERY_S + 0.5)
    exited = [(e["server"], e["code"]) for e in logs if e["event"] == "launcher.server_exited"]
    assert exited == [("redis", -signal.SIGKILL), ("tansu", -signal.SIGKILL)], logs
    assert any("empty log" in e.get("fix", "") for e in logs if e.get("server") == "tansu"), logs
    assert [e["event"] for e in logs].count("launcher.server_restarted") == 1, logs


async def test_readyz_fails_when_consumers_leave_their_groups_and_when_draining(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer whose partitions were revoked (a rebalance, a lost group, a stop) takes
    nothing: /readyz says which, until it is assigned again; a daemon that starts its drain
    is not ready at once, and its drain ends even when background loops lose their
    cancellation. (Last in the module: it stops the daemon.)"""
    await eventually(lambda: ready_is(env, 200), timeout=60, what="ready")
    (requests,) = [s for s in env.daemon.broker.subscribers if "requests" in str(getattr(s, "topics", ""))]
    await requests.stop()

    async def names_requests() -> bool:
        status, body = await get(env.base + "/readyz")
        return status == 503 and "requests" in json.loads(body)["checks"]["kafka"]

    await eventually(names_requests, timeout=30, what="not ready, naming the requests consumer")
    # Two background loops that lose a cancellation (as a loop inside redis-py's command
    # send can on Python 3.11): one the first time only, one every time. The drain ends
    # anyway: the first is cancelled again, the second is named and left behind.
    released = asyncio.Event()

    async def loses_one_cancel() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
        await asyncio.sleep(3600)

    async def loses_every_cancel() -> None:
        while not released.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)

    env.daemon.spawn(loses_one_cancel(), "loses-one-cancel")
    env.daemon.spawn(loses_every_cancel(), "loses-every-cancel")
    # And a broker whose close never returns once its consumers are stopped (a final
    # commit or leave-group to a broker gone silent): bounded by the drain's time plus one
    # close's (1 s each here).
    real_stop = env.daemon.broker.stop

    async def stop_then_hang() -> None:
        await real_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
        await asyncio.sleep(3600)

    env.daemon.broker.stop = stop_then_hang  # type: ignore[method-assign]
    env.daemon.settings = env.daemon.settings.model_copy(update={"shutdown_timeout_s": 1.0})
    monkeypatch.setattr("daemon.instance.CLOSE_TIMEOUT_S", 1.0)
    # The drain's first step, before anything is awaited (the HTTP server itself goes
    # within milliseconds, so the flag /readyz reads is what is checked).
    assert env.daemon.status.ready
    with capture_logs() as logs:
        stopping = asyncio.create_task(env.daemon.stop())
        await asyncio.sleep(0)
        assert not env.daemon.status.ready
        await stopping
    stuck = [e["task"] for e in logs if e["event"] == "daemon.task_stuck"]
    assert stuck == ["loses-every-cancel"], logs
    assert [e["what"] for e in logs if e["event"] == "teardown.step_timed_out"] == ["kafka broker"], logs
    assert any(e["event"] == "daemon.shutdown_finished" for e in logs)
    released.set()


async def test_lag_and_dead_letters_are_measured_on_every_topic(kafka_bootstrap: str, redis_url: str) -> None:
    """Doctor, the status page and the gauges see lag on every consumer group's topics and the
    DLQ's records, not only the documents topic's (a probe's own metadata narrows to what it
    assigned)."""
    from aiokafka import AIOKafkaProducer

    from daemon.status import measure_lag
    from daemon.topics import ensure_topics

    # Fresh topics on every run: counts would pile up on a broker kept between runs.
    settings = isolated_settings(unique(f"lag-every-{uuid.uuid4()}"), kafka_bootstrap, redis_url, topic_partitions=1)
    t = settings.topics
    await ensure_topics(kafka_bootstrap, t.all(), partitions=1, replication=1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for topic, n in ((t.documents, 1), (t.transcripts, 3), (t.requests, 2), (t.dlq, 2)):
            for i in range(n):
                await producer.send_and_wait(topic, f"{topic}-{i}".encode(), key=b"k")
    finally:
        await producer.stop()
    report = await measure_lag(settings)
    group = settings.consumer.group_id
    assert report.lag == {
        f"{group}.documents": {f"{t.documents}/0": 1},
        f"{group}.transcripts": {f"{t.transcripts}/0": 3},
        f"{group}.requests": {f"{t.requests}/0": 2},
    }, report.lag
    assert report.dlq == 2 and report.past_end == {}


async def test_doctor_names_summaries_that_keep_failing(env: Env) -> None:
    """A community whose summary failed (an unreachable or refusing LLM) fails doctor's
    summaries check with the reason; with none failing the check passes."""
    import time

    from graph.contribution import Contribution
    from graph.summary_records import record_summarizer
    from memory.tenants import TenantRegistry

    good = settings_env(env.daemon.settings)
    # As a daemon records a tenant once it reads an event of its (this test publishes none).
    await TenantRegistry(client=env.daemon.redis, name=env.daemon.settings.index.name).saw("default")
    res = await asyncio.to_thread(run_cli, good, "doctor")
    assert "✓ summaries: none failing" in res.stdout, res.stdout
    assert env.daemon.graph is not None
    service = env.daemon.graph.service("default")
    # Ten separate triangles: ten stale communities (this daemon runs no summarizer).
    for i in range(10):
        keys = [f"doctor{i}-svc-{c}" for c in "abc"]
        ents = {k: (k, "service", [f"doctor/{i}.md_p0"]) for k in keys}
        edges = {(a, b): 1 for j, a in enumerate(keys) for b in keys[j + 1 :]}
        await service.store.apply(f"doctor/{i}.md", 1, Contribution(entities=ents, edges=edges))
    await service.recompute(force=True)
    failed = None
    for item in (await service.store.stale(limit=100))[1]:
        token = await service.store.claim(item.community_id, "doctor-test", ttl_s=30)
        if token is not None:
            why = "LlmFailed: LLM openai/x unreachable"
            await service.store.record_failure(item.community_id, time.time() + 3600, "doctor-test", token, why)
            await service.store.release(item.community_id, "doctor-test", token)
            failed = item.community_id
            break
    assert failed is not None
    # The fix is for what the daemons write the summaries with (as they recorded it), whatever
    # the shell's settings say: an LLM's settings where an LLM writes them, else none of them.
    name = env.daemon.settings.index.name
    with_llm = {**good, "AGENTMEM_GRAPH__LLM_MODEL": "openai/x"}
    for recorded, shell in (("openai/x", good), ("extractive", with_llm)):
        await record_summarizer(env.daemon.redis, name, recorded)
        res = await asyncio.to_thread(run_cli, shell, "doctor")
        said = " ".join(res.stdout.split())
        assert res.returncode == 1 and "✗ summaries" in said and "LLM openai/x unreachable" in said, said
        if recorded == "openai/x":
            assert "the daemons write summaries with openai/x" in said and "llm_api_base" in said, said
        else:
            assert "llm_api_base" not in said and "extractive summarizer failed" in said, said


@pytest.mark.parametrize("offset_fetch", ["admin", "refused", "group error"])
async def test_doctor_flags_a_group_committed_past_the_end_of_its_log(
    kafka_bootstrap: str, redis_url: str, offset_fetch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the broker lost its log, a group's committed offsets stand past the end of the new
    one: doctor says so, not "lag 0" (lag is clamped at 0). Committed offsets are read with the
    admin API's OffsetFetch, one request per group, or, on a broker that refuses it or answers
    with a group-level error (no partitions), partition by partition with a consumer."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import UnsupportedVersionError

    if offset_fetch == "refused":

        async def refused(self: Any, *_a: Any, **_k: Any) -> Any:
            raise UnsupportedVersionError("injected: this broker has no OffsetFetch for admins")

        monkeypatch.setattr(AIOKafkaAdminClient, "list_consumer_group_offsets", refused)
    elif offset_fetch == "group error":  # aiokafka does not raise a group-level error: it answers nothing

        async def nothing(self: Any, *_a: Any, **_k: Any) -> Any:
            return {}

        monkeypatch.setattr(AIOKafkaAdminClient, "list_consumer_group_offsets", nothing)

    from daemon.doctor import diagnose
    from daemon.status import measure_lag
    from daemon.topics import ensure_topics

    settings = isolated_settings(unique(f"past-end-{offset_fetch}"), kafka_bootstrap, redis_url, topic_partitions=1)
    await ensure_topics(kafka_bootstrap, settings.topics.all(), partitions=1, replication=1)
    group = settings.consumer.group("documents")
    tp = TopicPartition(settings.topics.documents, 0)
    committer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False)
    await committer.start()
    try:
        committer.assign([tp])
        await committer.commit({tp: 50})
    finally:
        await committer.stop()
    with capture_logs() as logs:
        report = await measure_lag(settings)
    assert report.past_end == {group: [f"{tp.topic}/0 (50 > 0)"]} and report.lag[group] == {f"{tp.topic}/0": 0}
    # This test's groups only: a daemon of another test in this process samples its own lag
    # meanwhile, with the same injected broker answers.
    fell_back = sorted(
        e["group"] for e in logs if e["event"] == "status.offset_fetch_fell_back" and e["group"] in report.lag
    )
    assert fell_back == ([] if offset_fetch == "admin" else sorted(report.lag)), logs
    groups = [f for f in await diagnose(settings) if f.check == "consumer groups"]
    assert len(groups) == 1 and not groups[0].ok and "committed past the end" in groups[0].detail, groups


async def test_doctor_checks_the_topics_of_every_tenant_seen(kafka_bootstrap: str, redis_url: str) -> None:
    """In topic tenancy, doctor checks each seen tenant's topics (a broker that lost them, as
    tansu does on a restart, leaves its clients without a reply topic) and names the fix."""
    from consumers.config import ConsumerConfig
    from daemon.doctor import diagnose
    from daemon.topics import ensure_contract_topics, ensure_tenant_topics
    from memory.tenants import TenantRegistry

    name = unique("doctor-tenants")
    consumer = ConsumerConfig(group_id=name, tenancy="topic")
    settings = isolated_settings(name, kafka_bootstrap, redis_url, topic_partitions=1, consumer=consumer)
    await ensure_contract_topics(settings, timeout_s=30)
    (none_yet,) = [f for f in await diagnose(settings) if f.check == "topics"]
    assert none_yet.ok and "no tenant yet" in none_yet.detail and "topics --tenant" in none_yet.detail, none_yet
    # Topics made for a tenant whose events no daemon has read yet: named, not "no tenant yet".
    await ensure_tenant_topics(settings, "onboarded", timeout_s=30)
    (made,) = [f for f in await diagnose(settings) if f.check == "topics"]
    assert made.ok and "none of whose events a daemon has read yet: onboarded" in made.detail, made
    client = aredis.from_url(redis_url)
    try:
        registry = TenantRegistry(client=client, name=settings.index.name)
        await registry.saw("ghost")
        # From single tenancy, before the move: its memory is read through memory.*.default,
        # which a broker that forgot its topics (tansu, restarted) no longer has.
        await registry.saw("default")
    finally:
        await client.aclose()
    topics = [f for f in await diagnose(settings) if f.check == "topics"]
    assert len(topics) == 1 and not topics[0].ok, topics

    listed = await asyncio.to_thread(run_cli, settings_env(settings), "tenants", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == ["default", "ghost"], listed
    assert f"{settings.topics.replies}.ghost" in topics[0].detail and "--tenant ghost" in topics[0].fix
    assert f"{settings.topics.replies}.default" in topics[0].detail, topics
    await ensure_tenant_topics(settings, "ghost", timeout_s=30)
    await ensure_tenant_topics(settings, "default", timeout_s=30)
    # A producer that still writes to the bare topic: the daemons' groups read it in topic
    # tenancy too (and refuse what names no tenant), so it waits as their lag.
    from aiokafka import AIOKafkaProducer

    from daemon.topics import ensure_topics

    await ensure_topics(kafka_bootstrap, [settings.topics.documents], partitions=1, replication=1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for n in range(2):
            await producer.send_and_wait(settings.topics.documents, b"{}", key=f"d{n}".encode())
    finally:
        await producer.stop()
    found = {f.check: f for f in await diagnose(settings)}
    assert found["topics"].ok and "2 tenants'" in found["topics"].detail, found
    assert f"{name}.documents: lag 2" in found["consumer groups"].detail, found
    # No daemon of this group runs: lag says little of that, the groups' members do.
    idle = found["daemons"]
    assert not idle.ok and idle.detail.startswith("no daemon is consuming: no member in "), idle
    assert f"{name}.documents" in idle.detail and "agentmemd run" in idle.fix


async def test_a_taken_http_port_leaves_memory_serving(kafka_bootstrap: str, redis_url: str) -> None:
    """A daemon whose HTTP port is taken logs ``daemon.http_failed`` and still answers queries."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = isolated_settings(unique("http-taken"), kafka_bootstrap, redis_url, http_port=port)
        with capture_logs() as logs:
            async with daemon_and_client(settings) as (daemon, client):
                assert daemon.http is None
                _, reply = await client.ask({"query_id": "still-here", "search_text": "anything", "top_k": 1})
                assert reply["query_id"] == "still-here" and "results" in reply
        failed = [e for e in logs if e["event"] == "daemon.http_failed"]
        assert len(failed) == 1 and failed[0]["port"] == port
