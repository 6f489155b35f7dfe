"""Shared test helpers: a plain aiokafka client of the contract, polling, names, settings."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumers.config import ConsumerConfig, Topics
from daemon.settings import Settings, namespaced
from memory.keys import chunk_prefix, registry_key

if TYPE_CHECKING:
    from daemon.app import Daemon
    from daemon.reindex import ReindexReport
    from graph.compute import CommunityComputer
    from memory.embedder import SentenceTransformerEmbedder


# tansu holds a group's first join for half the session timeout: 2 s instead of 5 s for every
# daemon the suite starts, and a killed daemon's partitions move in 4 s instead of 10 (the
# heartbeat follows: a third of it).
TEST_SESSION_MS = 4000


def isolated_settings(name: str, kafka_bootstrap: str, redis_url: str, **over: Any) -> Settings:
    """``daemon.settings.namespaced`` with test defaults: 2 partitions, no HTTP server, the
    short consumer session of ``TEST_SESSION_MS`` unless the given ``consumer`` sets its own."""
    consumer = over.pop("consumer", ConsumerConfig(group_id=name)).with_default_session(TEST_SESSION_MS)
    return namespaced(
        name,
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        topic_partitions=over.pop("topic_partitions", 2),
        http_port=over.pop("http_port", 0),
        consumer=consumer,
        **over,
    )


def settings_env(settings: Settings) -> dict[str, str]:
    """The same settings as AGENTMEM_ environment variables, for a daemon subprocess."""
    env = {
        "AGENTMEM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "AGENTMEM_REDIS_URL": settings.redis_url,
        "AGENTMEM_TOPIC_PARTITIONS": str(settings.topic_partitions),
        "AGENTMEM_CONSUMER__GROUP_ID": settings.consumer.group_id,
        "AGENTMEM_INDEX__NAME": settings.index.name,
        "AGENTMEM_LOG_FORMAT": "json",
        "AGENTMEM_HTTP_PORT": str(settings.http_port),
        "AGENTMEM_CONSUMER__SESSION_TIMEOUT_MS": str(settings.consumer.session_timeout_ms),
    }
    if settings.consumer.heartbeat_interval_ms is not None:
        env["AGENTMEM_CONSUMER__HEARTBEAT_INTERVAL_MS"] = str(settings.consumer.heartbeat_interval_ms)
    for field, value in settings.topics.model_dump().items():
        env[f"AGENTMEM_TOPICS__{field.upper()}"] = value
    return env


_CHECKOUT = str(Path(__file__).resolve().parents[1])


async def run_python(tmp_path: Path, name: str, source: str, *, timeout: float) -> tuple[int | None, bytes, bytes]:
    """Run ``source`` as a script of its own with this checkout importable (as a daemon runs
    it, outside pytest's process); its exit code, stdout and stderr."""
    script = tmp_path / name
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([_CHECKOUT, os.environ.get("PYTHONPATH", "")])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout)
    return proc.returncode, out, err


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 20.0, what: str = "") -> None:
    """Poll ``check`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not reached within {timeout}s: {what}")


_shared: dict[str, Any] = {}
_shared_lock = asyncio.Lock()


def _no_crash_marker() -> None:
    from memory.embed_worker import CRASH_MARKER_ENV

    # The worker reads the marker when it is spawned, and again at every restart: a test's
    # fault injection must never reach the session's worker.
    assert CRASH_MARKER_ENV not in os.environ, "start a daemon with own_workers=True under a crash marker"


async def shared_workers() -> tuple[SentenceTransformerEmbedder, CommunityComputer]:
    """One embedding worker and one community-detection worker for the whole session, lent to
    the in-process daemons (each would otherwise start its own: ~6 s of model loading)."""
    from graph.compute import CommunityComputer
    from memory.config import EmbeddingConfig
    from memory.embedder import SentenceTransformerEmbedder

    _no_crash_marker()
    async with _shared_lock:
        if not _shared:
            compute = CommunityComputer()
            try:
                embedder, _ = await asyncio.gather(SentenceTransformerEmbedder.load(EmbeddingConfig()), compute.start())
            except BaseException:
                compute.close()
                raise
            _shared.update(embedder=embedder, compute=compute)
    return _shared["embedder"], _shared["compute"]


def close_shared_workers() -> None:
    workers = list(_shared.values())
    _shared.clear()
    for worker in workers:
        try:
            worker.close()
        except Exception as exc:  # the others are still closed
            print(f"closing a shared worker failed: {exc!r}", file=sys.stderr)


async def _lendable(
    settings: Settings, own_workers: bool
) -> tuple[SentenceTransformerEmbedder, CommunityComputer] | None:
    """The session's workers, unless the test kills or poisons its own (``own_workers``) or
    its embedding settings differ from the defaults."""
    from memory.config import EmbeddingConfig

    if own_workers or settings.embedding != EmbeddingConfig():
        return None
    return await shared_workers()


async def start_daemon(settings: Settings, *, own_workers: bool = False, **kw: Any) -> Daemon:
    """``daemon.app.start_daemon`` with the session's shared workers lent to it (see ``_lendable``)."""
    from daemon.app import start_daemon as start

    if (workers := await _lendable(settings, own_workers)) is None:
        return await start(settings, **kw)
    embedder, compute = workers
    return await start(settings, embedder=embedder, compute=compute, **kw)


async def reindex(settings: Settings, **kw: Any) -> ReindexReport:
    """``daemon.reindex.reindex`` with the session's embedder lent to the build (see ``_lendable``;
    a build whose worker must crash is given its own embedder directly)."""
    from daemon.reindex import reindex as build

    if (workers := await _lendable(settings, False)) is None:
        return await build(settings, **kw)
    return await build(settings, embedder=workers[0], **kw)


@asynccontextmanager
async def daemon_and_client(
    settings: Settings, reply_topic: str | None = None, *, own_workers: bool = False
) -> AsyncIterator[tuple[Daemon, PlainClient]]:
    """An in-process daemon and a ``PlainClient`` reading ``reply_topic`` (default: the daemon's
    reply topic; any other is created first); both are stopped on the way out."""
    from daemon.topics import ensure_topics

    reply_topic = reply_topic or settings.topics.replies
    if reply_topic != settings.topics.replies:
        await ensure_topics(settings.kafka_bootstrap, [reply_topic], partitions=1, replication=1)
    async with AsyncExitStack() as stack:  # the daemon is stopped even if the client's stop fails
        daemon = await start_daemon(settings, own_workers=own_workers)
        stack.push_async_callback(daemon.stop)
        client = PlainClient(settings.kafka_bootstrap, settings.topics, reply_topic)
        stack.push_async_callback(client.stop)
        await client.start()
        yield daemon, client


@asynccontextmanager
async def topic_tenancy_daemon(
    name: str,
    kafka_bootstrap: str,
    redis_url: str,
    tenants: Sequence[str],
    kinds: Sequence[str] = ("documents", "transcripts", "requests", "replies"),
    extra_topics: Sequence[str] = (),
    reply_topic: str | None = None,
) -> AsyncIterator[tuple[Daemon, PlainClient, Settings]]:
    """``daemon_and_client`` for a daemon in topic tenancy: one-partition topics, every
    ``<kind topic>.<tenant>`` (and ``extra_topics``) created first, and topic metadata refreshed
    every 500 ms so the pattern subscriptions find them at once."""
    from consumers.config import ConsumerConfig
    from daemon.topics import ensure_topics

    settings = isolated_settings(
        name,
        kafka_bootstrap,
        redis_url,
        topic_partitions=1,
        consumer=ConsumerConfig(group_id=name, tenancy="topic", metadata_max_age_ms=500),
    )
    bases = settings.topics.model_dump()
    topics = [f"{bases[kind]}.{tenant}" for tenant in tenants for kind in kinds]
    await ensure_topics(kafka_bootstrap, [*topics, *extra_topics], partitions=1, replication=1)
    async with daemon_and_client(settings, reply_topic) as (daemon, client):
        yield daemon, client, settings


class PlainClient:
    """What any Kafka client does: JSON in, reply_to + correlation_id headers, read replies."""

    def __init__(self, bootstrap: str, topics: Topics, reply_topic: str) -> None:
        self.bootstrap, self.topics, self.reply_topic = bootstrap, topics, reply_topic
        self.producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        self.replies = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=5)
        self.seen: dict[str, tuple[dict[str, bytes], dict[str, Any]]] = {}

    async def start(self) -> None:
        await self.producer.start()
        await self.replies.start()
        tps = [TopicPartition(self.reply_topic, p) for p in self.replies.partitions_for_topic(self.reply_topic) or []]
        self.replies.assign(tps)
        await self.replies.seek_to_beginning(*tps)

    async def stop(self) -> None:
        await self.producer.stop()
        await self.replies.stop()

    async def send(
        self, topic: str, payload: Any, key: str = "k", headers: list[tuple[str, bytes]] | None = None
    ) -> None:
        value = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        await self.producer.send_and_wait(topic, value, key=key.encode(), headers=headers or [])

    async def ask(
        self, payload: Any, *, reply_to: str | None = None, timeout: float = 20.0
    ) -> tuple[dict[str, bytes], dict[str, Any]]:
        cid = uuid.uuid4().hex
        headers = [("correlation_id", cid.encode())]
        headers.append(("reply_to", (reply_to or self.reply_topic).encode()))
        await self.send(self.topics.requests, payload, headers=headers)
        return await self.reply(cid, timeout)

    async def reply(self, cid: str, timeout: float = 20.0) -> tuple[dict[str, bytes], dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while cid not in self.seen:
            if time.monotonic() > deadline:
                raise AssertionError(f"no reply for correlation_id {cid}")
            batch = await self.replies.getmany(timeout_ms=100)
            for records in batch.values():
                for r in records:
                    h = dict(r.headers)
                    self.seen[h.get("correlation_id", b"").decode()] = (h, json.loads(r.value))
        return self.seen.pop(cid)


class DaemonProcess:
    """`agentmemd run` as a child process, as an operator runs it; killable like a crash."""

    def __init__(self, env: dict[str, str], log_path: str) -> None:
        import os

        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.proc: Any = None

    def start(self, timeout: float = 120.0) -> DaemonProcess:
        import subprocess
        import sys
        import threading
        from pathlib import Path

        agentmemd = str(Path(sys.executable).parent / "agentmemd")
        log = open(self.log_path, "a")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen([agentmemd, "run"], env=self.env, stdout=subprocess.PIPE, stderr=log, text=True)
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:
                if "ready" in line:
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout):
            self.kill()
            raise AssertionError(f"daemon not ready in {timeout}s; see {self.log_path}")
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, exactly like a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self) -> int:
        """SIGTERM and wait: the clean shutdown path."""
        import signal

        if self.proc is None or self.proc.poll() is not None:
            return 0 if self.proc is None else int(self.proc.returncode)
        self.proc.send_signal(signal.SIGTERM)
        return int(self.proc.wait(timeout=60))


async def in_graph(daemon: Any, doc_ids: Iterable[str], tenant: str = "default") -> bool:
    """Whether every doc has its contribution in the tenant's graph. A doc's chunks are
    written before its graph contribution (extraction finishes after the write), so a
    forced recompute right after the chunks show may find no entities yet."""
    assert daemon.graph is not None
    return set(doc_ids) <= set(await daemon.graph.store(tenant).doc_ids())


async def wait_for_chunks(client: Any, name: str, want: dict[str, str], timeout: float = 120) -> dict[str, str]:
    """Poll Redis until the stored chunk texts of index ``name`` equal ``want``; returns what was seen."""
    deadline = time.monotonic() + timeout
    got: dict[str, str] = {}
    while time.monotonic() < deadline:
        got = await stored_chunks(client, name)
        if got == want:
            break
        await asyncio.sleep(0.5)
    return got


async def stored_chunks(client: Any, name: str) -> dict[str, str]:
    out: dict[str, str] = {}
    active = await client.hget(registry_key(name), "active")
    if active is None:
        return out
    async for key in client.scan_iter(match=chunk_prefix(name, int(active)) + "*", count=1000):
        cid, text, kind = await client.hmget(key, ["chunk_id", "text", "kind"])
        if cid is not None and text is not None and kind != b"community":  # a key may vanish mid-scan
            out[cid.decode()] = text.decode()
    return out


async def read_dlq(client: PlainClient, want: int, timeout: float = 30) -> list[dict[str, Any]]:
    """Dead letters from the start of the DLQ topic, until ``want`` are read or ``timeout``."""
    consumer = AIOKafkaConsumer(
        client.topics.dlq,
        bootstrap_servers=client.bootstrap,
        auto_offset_reset="earliest",
        group_id=f"dlq-reader-{uuid.uuid4().hex}",
        fetch_max_wait_ms=5,
    )
    await consumer.start()
    out: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout
        while len(out) < want and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                out += [json.loads(r.value) for r in records]
    finally:
        await consumer.stop()
    return out


async def agentmemd(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The CLI of this virtualenv with ``env`` added, run to the end off the event loop."""
    exe = str(Path(sys.executable).parent / "agentmemd")
    return await asyncio.to_thread(
        subprocess.run,
        [exe, *args],
        env={**os.environ, "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def chromium() -> str | None:
    """The headless browser of the page tests, or None where none is installed."""
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def chromium_flags(user_dir: str) -> list[str]:
    """Headless Chromium's flags for a page test: no sandbox (root), no network of its own, a fresh profile."""
    return [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={user_dir}",
    ]
