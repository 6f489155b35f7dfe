"""The packaged model in its worker process: precisions, bad input, a worker that dies."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil
import pytest
import redis.asyncio as aredis

from memory.config import EmbeddingConfig
from memory.conversation import vector_text
from memory.embed_worker import CRASH_MARKER_ENV
from memory.embedder import (
    CONTROL_TEXT,
    POISON_MAX,
    EmbedderError,
    EmbedderUnavailable,
    QueryRefused,
    SentenceTransformerEmbedder,
    WorkerCrashed,
    _digest,
    native_bf16,
    use_bf16,
)
from memory.keys import poison_key, poison_version_key
from memory.poison import SharedPoison
from tests.conftest import unique
from tests.helpers import eventually, run_python

# Most tests here restart the worker (a model load each): with the suite in 3 processes on 2
# cores, and other load, that can take minutes, so the hang guard is 360 s, not 180.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(360)]

TEXTS = [
    "ERR_CONN_RESET_4F2A: the billing-service lost its connection to db-01.prod during the deploy.",
    "How do I rotate the TLS certificate of the ingress controller?",
    "Runbook: when pgbouncer reports max_connections, raise pool_size and restart the workers. " * 8,
]


async def test_bfloat16_vectors_match_float32() -> None:
    """Same model, same texts: cosine >= 0.9999 between the two precisions, queries and docs alike."""
    f32 = await SentenceTransformerEmbedder.load(EmbeddingConfig(precision="float32"))
    b16 = await SentenceTransformerEmbedder.load(EmbeddingConfig(precision="bfloat16"))
    try:
        assert not f32.bf16 and b16.bf16
        a, b = await f32.embed_documents(TEXTS), await b16.embed_documents(TEXTS)
        assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
        assert np.allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-3)
        assert (a * b).sum(axis=1).min() >= 0.9999
        qa, qb = await f32.embed_query(TEXTS[1]), await b16.embed_query(TEXTS[1])
        assert float(qa @ qb) >= 0.9999
        # and they are not the same computation (the setting is not ignored)
        assert not np.array_equal(a, b)
        # Queries go through the traced transformer, documents through the eager one: in bf16
        # too, the two give the same vector for the same text.
        assert b16.query_traced
        assert np.abs(qb - (await b16.embed_documents([TEXTS[1]]))[0]).max() < 1e-6
    finally:
        f32.close()
        b16.close()


def test_auto_precision_follows_the_cpu() -> None:
    assert use_bf16(EmbeddingConfig(precision="auto")) == native_bf16()
    assert use_bf16(EmbeddingConfig(precision="auto", device="cuda")) is False
    assert use_bf16(EmbeddingConfig(precision="float32")) is False


async def test_direct_path_gives_the_pipelines_vectors() -> None:
    """The worker skips sentence-transformers' encode() glue on the packaged model (and runs
    queries through a traced transformer), and its vectors are still the library's own,
    computed here in this process."""
    from sentence_transformers import SentenceTransformer

    from memory.embed_fast_paths import is_mean_pooled_text_model
    from memory.embedder import resolve_model_path

    path = resolve_model_path(EmbeddingConfig().model)
    emb = await SentenceTransformerEmbedder.load(EmbeddingConfig(precision="float32"))
    try:
        assert emb.direct and emb.query_traced
        texts = [*TEXTS, "why", "SQLSTATE 40P01"]
        queries = ["deadlock SQLSTATE 40P01", "why", TEXTS[0]]  # one batch of three, padded
        ours = np.vstack(
            [await emb.embed_documents(texts), *await asyncio.gather(*(emb.embed_query(q) for q in queries))]
        )
    finally:
        emb.close()
    model = SentenceTransformer(path, device="cpu", local_files_only=True)
    theirs = model.encode([*texts, *queries], normalize_embeddings=True, convert_to_numpy=True)
    assert np.abs(ours - theirs).max() < 1e-5
    # A pipeline it does not reproduce (CLS pooling) keeps the library's encode().
    from sentence_transformers.models import Pooling

    cls = SentenceTransformer(modules=[model[0], Pooling(emb.dims, pooling_mode="cls")], device="cpu")
    assert is_mean_pooled_text_model(model) and not is_mean_pooled_text_model(cls)


async def test_worker_survives_bad_input_and_restarts_after_a_kill() -> None:
    """A failing input is an error for that caller only; a killed worker comes back."""
    embedder = await SentenceTransformerEmbedder.load(EmbeddingConfig())  # killed here: not the shared one
    try:
        before = await embedder.embed_documents(TEXTS[:1])
        with pytest.raises(EmbedderError):
            await embedder.embed_documents([None])  # not a string: the model raises in the worker
        assert np.array_equal(await embedder.embed_documents(TEXTS[:1]), before)

        worker = embedder._worker
        old_pid = worker._proc.pid
        # Killed under a request: that request fails as an outage (retried by ingestion, never
        # dead-lettered; `unavailable` to an asker), and the next call gets a new worker.
        in_flight = asyncio.ensure_future(embedder.embed_documents([TEXTS[2]] * 256))
        await asyncio.sleep(0.5)
        os.kill(old_pid, signal.SIGKILL)
        with pytest.raises(EmbedderUnavailable) as caught:
            await in_flight
        assert caught.value.retryable and caught.value.code == "unavailable"
        assert not caught.value.attributable  # SIGKILL is the OOM killer or an operator, never the input
        again = await embedder.embed_documents(TEXTS[:1])
        assert worker._proc.pid != old_pid and worker.restarts >= 1
        assert float((again @ before.T).min()) >= 0.9999
    finally:
        embedder.close()


async def test_worker_exits_with_its_parent_pipes() -> None:
    """Closing the embedder ends the worker process (no orphan)."""
    emb = await SentenceTransformerEmbedder.load(EmbeddingConfig())
    proc = emb._worker._proc
    assert proc.is_alive()
    emb.close()
    proc.join(10)
    assert not proc.is_alive()


@pytest.mark.parametrize(("docs_threads", "query_threads"), [(1, 2), (2, 1)])
async def test_each_channel_computes_on_its_own_thread_count(
    docs_threads: int, query_threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queries run on query_torch_threads and documents on torch_threads, in one worker process.

    A thread that computes on n threads gets an OpenMP team of n - 1 more threads in the
    process, so each channel's first batch shows its own setting in the thread count.
    """
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # no tokenizer pool threads in the count
    emb = await SentenceTransformerEmbedder.load(
        EmbeddingConfig(torch_threads=docs_threads, query_torch_threads=query_threads)
    )
    try:
        proc = psutil.Process(emb.worker_pid)
        await asyncio.sleep(0.5)  # the channel threads start right after the model is loaded
        base = proc.num_threads()
        await emb.embed_documents(TEXTS * 4)
        after_docs = proc.num_threads()
        await asyncio.gather(*(emb.embed_query(f"{t} {i}") for i, t in enumerate(TEXTS * 4)))
        after_queries = proc.num_threads()
        await emb.embed_documents(TEXTS[::-1] * 4)
        # The worker's load-time check (_direct_matches) has already started torch's own thread.
        assert after_docs - base == docs_threads - 1
        assert after_queries - after_docs == query_threads - 1
        assert proc.num_threads() == after_queries
    finally:
        emb.close()


async def test_batched_rows_stay_in_input_order(embedder: Any) -> None:
    """Texts of mixed length are batched by length inside the worker; row i is still text i."""
    texts = [TEXTS[2], "short", TEXTS[0], TEXTS[2][:120], "a query about pgbouncer", TEXTS[1]]
    together = await embedder.embed_documents(texts)
    for i, text in enumerate(texts):
        alone = await embedder.embed_documents([text])
        assert float(together[i] @ alone[0]) >= 0.9999, i


async def test_a_text_in_context_is_pooled_over_its_own_tokens(embedder: Any) -> None:
    """A turn read after its context answers a question that needs the context better than the
    turn alone, stays nearer its own words than the whole exchange does, and mixes freely in a
    batch with plain texts; a text of no tokens of its own still gets a unit vector."""
    own, ctx = "Melanie: Yes, yesterday! It was great.", "Caroline: Did you go to the pottery class?"
    marked = vector_text(own, ctx)
    rows = await embedder.embed_documents([own, marked, TEXTS[0], ctx + "\n" + own, vector_text("  ", ctx)])
    alone, in_context, plain, whole, spaces = rows
    [question] = [await embedder.embed_query("Did Melanie go to the pottery class?")]
    assert float(in_context @ question) > float(alone @ question) + 0.05
    assert float(in_context @ alone) > float(whole @ alone)  # pooled over the turn, not the exchange
    assert float(plain @ (await embedder.embed_documents([TEXTS[0]]))[0]) >= 0.9999
    assert float((await embedder.embed_documents([marked]))[0] @ in_context) >= 0.9999
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-4) and np.isfinite(spaces).all()
    assert not embedder.identity.endswith("|whole")  # the packaged model pools in context
    # A query is read whole: a mark in it is a space, never a context split.
    assert (
        float((await embedder.embed_query("pottery\x1eclass")) @ (await embedder.embed_query("pottery class"))) > 0.9999
    )


async def test_a_large_document_does_not_hold_the_worker_from_other_ingest_calls(embedder: Any) -> None:
    """Both ingest subscribers share the docs channel: a document of many chunks is sent in
    requests of ``docs_request_max``, so a turn's chunk gets in between, and every row of
    the document is still its own text's vector, in input order."""
    words = "pgbouncer reports max_connections while the billing service retries its deploy".split()
    big = [f"note {i}: " + " ".join(words[(i + j) % len(words)] for j in range(i % 40)) for i in range(640)]
    whole = asyncio.create_task(embedder.embed_documents(big))
    await asyncio.sleep(0)  # the document's first request is in the worker
    turn = await embedder.embed_documents(["the agent asked about ERR_CONN_RESET_4F2A"])
    assert turn.shape == (1, embedder.dims)
    assert not whole.done(), "the turn waited for the whole document"
    vectors = await whole
    for i in (0, 1, 39, 77, 400, 639):
        alone = await embedder.embed_documents([big[i]])
        assert float(vectors[i] @ alone[0]) >= 0.9999, i


async def test_a_hung_worker_is_killed_and_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker alive but silent (here SIGSTOPped; a deadlock or swap storm alike) fails its
    request as an outage once the deadline passes, is killed, and the next query gets a new
    worker: before, every query and ingestion waited on it forever."""
    import memory.embed_worker as embed_worker

    monkeypatch.setattr(embed_worker, "QUERY_DEADLINE_S", 3.0)
    emb = await SentenceTransformerEmbedder.load(EmbeddingConfig())  # type: ignore[call-arg]
    try:
        before = await emb.embed_query("the connection pool is exhausted")
        pid = emb.worker_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(EmbedderUnavailable, match="did not answer"):
            await asyncio.wait_for(emb.embed_query("asked while the worker hangs"), timeout=60)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        again = await emb.embed_query("the connection pool is exhausted, again")
        assert emb.worker_pid not in (None, pid) and float(again @ before) > 0.8
    finally:
        emb.close()


async def test_cached_query_vectors_are_read_only_rows_of_their_own(embedder: Any) -> None:
    """The cache hands one array to every asker of a text: nobody may change it, and it is
    not a view that keeps its whole micro-batch alive."""
    texts = [f"read-only cache row {i}" for i in range(4)]
    vecs = await asyncio.gather(*(embedder.embed_query(t) for t in texts))
    for t, v in zip(texts, vecs, strict=True):
        assert v.base is None and not v.flags.writeable
        with pytest.raises(ValueError):
            v[0] = 9.0
        assert await embedder.embed_query(t) is v


async def _at_least(count: Callable[[], int], n: int) -> bool:
    return count() >= n


async def test_a_crash_shared_with_queries_is_pinned_on_its_input_at_the_next_try(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under steady query traffic a crash is rarely alone in the worker, and a crash shared
    with a query says nothing of the doc: retried as an outage forever, it would block its
    partition. The try after a shared crash runs alone, so its crash is the input's: all of
    it, not only its first request when a large document is sent in several."""
    marker = f"crash-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(CRASH_MARKER_ENV, marker)  # read by the worker process it spawns
    emb = await SentenceTransformerEmbedder.load(EmbeddingConfig(docs_request_max=4))  # type: ignore[call-arg]
    # Three requests of 4, shortest first: the marker's text, the longest, goes in the last.
    doc = [f"walrus {i}" for i in range(11)] + [f"walrus ledger of the harbour master {marker}"]
    stop = asyncio.Event()
    answered = 0

    async def asker(n: int) -> None:
        # Two askers keep the query channel's queue full: a query is in the worker nearly
        # all the time. Every text is new, so none is answered from the cache.
        nonlocal answered
        for i in itertools.count():
            if stop.is_set():
                return
            try:
                await emb.embed_query(f"{TEXTS[2]} asker {n} query {i}")
                answered += 1
            except EmbedderUnavailable:
                await asyncio.sleep(0)  # the worker died under it: ask again

    askers = [asyncio.create_task(asker(n)) for n in range(2)]
    try:
        await eventually(lambda: _at_least(lambda: answered, 5), timeout=60, what="the queries flowing")
        verdicts: list[bool] = []
        for _ in range(3):
            with pytest.raises(WorkerCrashed) as caught:
                await emb.embed_documents(doc)
            verdicts.append(caught.value.attributable)
            if caught.value.attributable:
                break
        # Shared (or, by chance, alone) the first time; alone, hence the input's, by the second.
        assert verdicts[-1] and len(verdicts) <= 2, verdicts
        before = answered
        await eventually(lambda: _at_least(lambda: answered, before + 5), timeout=60, what="queries after the restart")
    finally:
        stop.set()
        await asyncio.gather(*askers, return_exceptions=True)
        emb.close()


async def test_a_query_that_crashes_the_worker_is_refused_and_its_batch_still_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A query text that crashes native code, micro-batched with two others: after the crash
    each is embedded again alone, the two get their vectors, and the culprit an error. Asked
    again, it is refused without reaching the worker, so an asker repeating it cannot keep
    every query and ingestion down."""
    marker = f"crash-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(CRASH_MARKER_ENV, marker)  # read by the worker process it spawns
    emb = await SentenceTransformerEmbedder.load(EmbeddingConfig())
    try:
        good = [f"{TEXTS[1]} first", f"{TEXTS[1]} second"]
        poison = f"what does {marker} mean"
        first_pid = emb.worker_pid
        answers = await asyncio.gather(
            emb.embed_query(good[0]), emb.embed_query(poison), emb.embed_query(good[1]), return_exceptions=True
        )
        assert isinstance(answers[1], QueryRefused) and "crashed the embedding worker" in str(answers[1]), answers
        assert not answers[1].retryable and answers[1].code == "invalid_request"
        for text, vec in ((good[0], answers[0]), (good[1], answers[2])):
            assert isinstance(vec, np.ndarray), vec
            (doc,) = await emb.embed_documents([text])
            assert float(vec @ doc) >= 0.99  # its own text's vector, not a neighbour's
        pid = emb.worker_pid
        assert pid != first_pid  # it did crash the worker
        with pytest.raises(QueryRefused, match="refused"):
            await emb.embed_query(poison)
        assert emb.worker_pid == pid  # refused without being sent again: no crash this time
    finally:
        emb.close()


async def test_the_retries_after_a_crash_have_one_budget_for_the_whole_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a crash the batch's texts are retried one by one, each possibly waiting for the
    other channel's isolated requests: past one budget (QUERY_DEADLINE_S, spent at once
    here) the texts not yet retried are answered 'try again', instead of every asker
    waiting for all the retries; the next query is embedded by the restarted worker."""
    marker = f"crash-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(CRASH_MARKER_ENV, marker)
    monkeypatch.setattr("memory.embedder.QUERY_DEADLINE_S", -1.0)
    emb = await SentenceTransformerEmbedder.load(EmbeddingConfig())
    try:
        texts = [f"{TEXTS[1]} first", f"what does {marker} mean", f"{TEXTS[1]} second"]
        answers = await asyncio.gather(*(emb.embed_query(t) for t in texts), return_exceptions=True)
        assert all(isinstance(a, EmbedderUnavailable) and "recovering from a crash" in str(a) for a in answers), answers
        assert not emb._poison  # nothing judged without its retry
        assert isinstance(await emb.embed_query(texts[0]), np.ndarray)
    finally:
        emb.close()


async def test_a_request_blocked_in_its_send_is_ended_by_the_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    """A docs request bigger than the socket buffer, sent to a worker that stopped reading
    (SIGSTOP, a freezer), blocks in the write, before any deadline check: the watchdog kills
    the worker past the deadline, the blocked write fails, the request is an outage, and the
    restarted worker embeds the next one. (The write is simulated: this kernel takes 30 MB
    into a socket nobody reads, so it blocks until the reader is gone, as a full buffer does.)"""
    import time
    from multiprocessing.connection import Connection

    import memory.embed_worker as embed_worker

    monkeypatch.setattr(embed_worker, "DOCS_DEADLINE_S", 1.0)
    monkeypatch.setattr(embed_worker, "DOCS_DEADLINE_PER_TEXT_S", 0.0)
    monkeypatch.setattr(embed_worker, "WATCHDOG_GRACE_S", 0.5)
    emb = await SentenceTransformerEmbedder.load(EmbeddingConfig())
    try:
        pid = emb.worker_pid
        marker = f"blocked-send-{uuid.uuid4().hex[:8]}"
        real_send = Connection.send

        def blocked_send(self: Connection, obj: Any) -> None:
            if isinstance(obj, list) and any(marker in str(t) for t in obj):
                while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    time.sleep(0.05)
                raise BrokenPipeError("the reader went away")
            real_send(self, obj)

        monkeypatch.setattr(Connection, "send", blocked_send)
        with pytest.raises(EmbedderUnavailable):
            await asyncio.wait_for(emb.embed_documents([f"walrus ledger {marker}"]), 30)
        (vec,) = await emb.embed_documents(["walrus ledger"])
        assert isinstance(vec, np.ndarray) and emb.worker_pid != pid
    finally:
        emb.close()


async def test_a_query_waits_for_a_restart_no_longer_than_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread holds the worker while it restarts it (a model load may take minutes
    on a loaded machine): a query gives up after QUERY_DEADLINE_S (0.5 s here) with
    'try again', and is embedded once the worker is free."""
    monkeypatch.setattr("memory.embed_worker.QUERY_DEADLINE_S", 0.5)
    emb = await SentenceTransformerEmbedder.load(EmbeddingConfig())
    try:
        emb._worker._lock.acquire()  # as a thread restarting the worker holds it
        try:
            with pytest.raises(EmbedderUnavailable, match="restarting"):
                await asyncio.wait_for(emb.embed_query("walrus ledger while it restarts"), 30)
        finally:
            emb._worker._lock.release()
        assert isinstance(await emb.embed_query("walrus ledger once it is back"), np.ndarray)
    finally:
        emb.close()


async def test_a_worker_that_crashes_on_anything_gets_no_query_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A query that crashes the worker alone is refused only if a harmless text alone then
    does not: a worker that dies on anything (here: on the control text too) is broken, and
    the query that happened to be alone in it is answered as an outage, not blamed."""
    monkeypatch.setenv(CRASH_MARKER_ENV, CONTROL_TEXT)  # the control text crashes it too
    emb = await SentenceTransformerEmbedder.load(EmbeddingConfig())
    try:
        with pytest.raises(EmbedderUnavailable):
            await emb.embed_query(f"is the ledger {CONTROL_TEXT}")
        assert not emb._poison  # nothing refused
    finally:
        emb.close()


_LOAD_AND_CLOSE = """
import asyncio
from memory.config import EmbeddingConfig
from memory.embedder import SentenceTransformerEmbedder

async def main() -> None:
    embedder = await SentenceTransformerEmbedder.load(EmbeddingConfig())
    await embedder.embed_query("hello")
    embedder.close()

if __name__ == "__main__":
    asyncio.run(main())
"""


async def test_a_process_that_ran_the_worker_exits_without_leaked_semaphores(tmp_path: Any) -> None:
    """The worker's model loader used to leave a multiprocessing semaphore (tqdm's lock)
    registered, and every daemon's exit printed "leaked semaphore objects" from the
    resource tracker."""
    code, out, err = await run_python(tmp_path, "load_and_close.py", _LOAD_AND_CLOSE, timeout=300)
    assert code == 0, err.decode(errors="replace")[-2000:]
    assert b"embed.model_loaded" in out + err  # it really loaded the model
    assert b"leaked semaphore" not in err, err.decode(errors="replace")[-2000:]


async def test_a_lent_embedder_must_match_the_settings_and_is_never_closed_by_its_borrower(
    embedder: Any, kafka_bootstrap: str, redis_url: str
) -> None:
    """A daemon or a build refuses an embedder loaded with other embedding settings (its
    vectors would not be the index's); one that matches serves the daemon and outlives it, as
    does a lent detection worker."""
    from daemon.app import start_daemon
    from daemon.reindex import reindex
    from graph import communities
    from tests.conftest import unique
    from tests.helpers import isolated_settings, shared_workers

    name = unique("lent")
    other = isolated_settings(name, kafka_bootstrap, redis_url, embedding=EmbeddingConfig(precision="float32"))
    with pytest.raises(ValueError, match="other embedding settings"):
        await start_daemon(other, embedder=embedder)
    with pytest.raises(ValueError, match="other embedding settings"):
        await reindex(other, embedder=embedder)
    _, compute = await shared_workers()
    settings = isolated_settings(name, kafka_bootstrap, redis_url)
    daemon = await start_daemon(settings, embedder=embedder, compute=compute)
    await daemon.stop()
    assert embedder.worker_pid is not None
    assert (await embedder.embed_query("still served")).shape == (embedder.dims,)
    await compute(communities.preload)  # the detection worker too


async def test_poison_queries_are_shared_by_the_daemons_through_redis(redis_url: str, embedder: Any) -> None:
    """A query another daemon's worker crashed on is refused here after one sync, and never
    reaches this worker; one this daemon refuses reaches the group's list."""
    client = aredis.from_url(redis_url)
    name = unique("poison")
    here = SharedPoison(client=client, name=name, limit=POISON_MAX)
    other = SharedPoison(client=client, name=name, limit=POISON_MAX)  # another daemon's view
    theirs = f"the query that crashed another daemon's worker {uuid.uuid4().hex}"
    mine = f"the query that crashed this daemon's worker {uuid.uuid4().hex}"
    try:
        await other.add({_digest(theirs)})
        assert await here.sync(embedder) == (0, 1)
        with pytest.raises(QueryRefused):
            await embedder.embed_query(theirs)
        assert await here.sync(embedder) == (0, 0)  # nothing new: one GET, no list read
        embedder.learn_poison({_digest(mine)})  # as _alone does when a query crashes it alone
        assert await here.sync(embedder) == (1, 0)
        assert await other.changed_digests() == {_digest(theirs), _digest(mine)}
    finally:
        await client.delete(poison_key(name), poison_version_key(name))
        await client.aclose()


async def test_chunks_longer_than_the_model_reads_are_refused_at_start(
    embedder: Any, kafka_bootstrap: str, redis_url: str
) -> None:
    """MiniLM reads 256 tokens, 2 of them special: a chunk of more would be searched by its
    words and never by its tail's meaning. A daemon and a reindex with such chunking refuse to
    start, naming the setting and its largest value (up to 4096 passed before)."""
    from memory.config import ChunkingConfig
    from memory.errors import EmbedderError
    from tests.helpers import isolated_settings, reindex, start_daemon

    embedder.check_chunks_fit(254)
    with pytest.raises(EmbedderError, match="AGENTMEM_CHUNKING__MAX_TOKENS to at most 254"):
        embedder.check_chunks_fit(255)
    settings = isolated_settings(unique("chunks-fit"), kafka_bootstrap, redis_url).model_copy(
        update={"chunking": ChunkingConfig(max_tokens=1000)}
    )
    with pytest.raises(EmbedderError, match=r"chunking\.max_tokens is 1000"):
        await start_daemon(settings)
    with pytest.raises(EmbedderError, match=r"chunking\.max_tokens is 1000"):
        await reindex(settings)
    assert (await embedder.embed_query("still serving")).shape == (embedder.dims,)  # the lent one was not closed


def test_without_the_direct_path_a_context_is_cut_from_its_start_to_fit() -> None:
    """For a model whose own encode() reads a marked text whole (it cuts at the window's end),
    the context is cut from its start so the text's own tokens all fit: whole where both fit,
    its end where some room is left, none where the text fills the window."""
    from types import SimpleNamespace

    from memory.conversation import CONTEXT_MARK
    from memory.embed_fast_paths import context_cut_to_fit
    from memory.embed_model import load_tokenizer
    from memory.embedder import resolve_model_path

    tok = load_tokenizer(resolve_model_path(EmbeddingConfig().model))
    w: Any = SimpleNamespace(model=SimpleNamespace(max_seq_length=64))
    path = "Guide > Installation > Linux packages"
    short, full = "Run the installer.", " ".join(["word"] * 61)
    middle = " ".join(["word"] * 56)
    got = context_cut_to_fit(
        w, tok, [f"{path}{CONTEXT_MARK}{short}", f"{path}{CONTEXT_MARK}{full}", f"{path}{CONTEXT_MARK}{middle}"]
    )
    assert got[0] == f"{path}\n{short}" and got[1] == full
    kept, own = got[2].split("\n")
    assert own == middle and path.endswith(kept) and kept and kept != path  # the innermost end kept
    assert all(len(tok(t)["input_ids"]) <= 64 for t in got)
