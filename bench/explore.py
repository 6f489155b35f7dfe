"""Explorer pages at 100k chunks: how long the daemon takes to serve a page of 100 results.

Run from the project root:

    .venv/bin/python bench/explore.py                      # 100,000 chunks
    .venv/bin/python bench/explore.py --chunks 5000 --rounds 5   # smoke

Path: an embedded Redis (AOF on, as the daemon runs it) and one index, filled straight through
the index API (``ChunkIndex.apply``, 16 writes at a time, one transaction per doc) with
synthetic text and precomputed random unit vectors, to keep the setup to minutes: 60% document
chunks (docs of 4 chunks), 40% transcript turns (100 agents, 20 sessions each, one session of
500 turns). Then the explorer's own routes (``daemon.explore.Explorer`` on the daemon's
aiohttp server, loopback, no token) are asked over HTTP, one request at a time, each page
``--rounds`` times after a warm-up:

* the tenant's chunks, newest first: the first page and a deep page (keyset at the middle);
* a session's turns (the first 100 of 500);
* "ask" with top_k 100 (the real retrieval: each question embedded by the packaged model);
* the documents listing and the agents listing (read from the directory kept with the chunks:
  what the page holds, not what the tenant holds; ``memory.index.directory``).

Each is a page of 100 rows. Also timed alone: rendering the 100-row HTML from what was read
(the pure view functions). Target (issue 26): a page of 100 results served in <= 100 ms at
100k chunks (p50, request to last byte); one target per page. Nothing is asserted: a miss is
reported as MISSED.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import numpy as np
import redis.asyncio as aredis
from _result import Result, png_path
from _run import add_common_args, run_benchmark
from _servers import wait_redis_ready
from _stats import summary_ms
from _synthetic_text import SyntheticText

BENCH = "explore"
DIMS = 384


def _turn(synth: SyntheticText, agent: int, session: int, turn: int, ts: float) -> Any:
    from memory.records import ChunkRecord

    agent_id, session_id = f"agent-{agent:03d}", f"s-{session:03d}"
    doc_id = f"transcript:{agent_id}/{session_id}/{turn}"
    return ChunkRecord(
        chunk_id=f"{doc_id}_p0",
        doc_id=doc_id,
        position=0,
        text=synth.paragraph(40),
        kind="transcript",
        source="",
        tags={"agent_id": agent_id, "session_id": session_id, "kind": "transcript", "doc_id": doc_id, "source": ""},
        metadata={"role": "assistant", "turn": turn},
        version=0,
        timestamp=ts,
    )


def _doc(synth: SyntheticText, n: int, chunks: int, ts: float) -> list[Any]:
    from memory.records import ChunkRecord

    doc_id = f"docs/runbook-{n:06d}.md"
    return [
        ChunkRecord(
            chunk_id=f"{doc_id}_p{i}",
            doc_id=doc_id,
            position=i,
            text=synth.paragraph(90),
            kind="document",
            source=doc_id,
            tags={"kind": "document", "doc_id": doc_id, "source": doc_id},
            metadata={},
            version=1,
            timestamp=ts,
        )
        for i in range(chunks)
    ]


async def fill(index: Any, synth: SyntheticText, total: int, rng: np.random.Generator) -> tuple[float, int]:
    """Write ``total`` chunks; returns the write time and the number of docs."""
    turns_total = int(total * 0.4)
    writes: list[tuple[str, int | None, list[Any]]] = []
    ts = 1_700_000_000.0
    # One long session (what a page of 100 turns reads), then 100 agents x 20 sessions.
    for turn in range(min(500, turns_total)):
        ts += 1
        writes.append(("", None, [_turn(synth, 0, 0, turn, ts)]))
    left = turns_total - min(500, turns_total)
    i = 0
    while left > 0:
        agent, session, turn = 1 + i % 99, (i // 99) % 20, i // (99 * 20)
        ts += 1
        writes.append(("", None, [_turn(synth, agent, session, turn, ts)]))
        left -= 1
        i += 1
    n = 0
    docs_left = total - turns_total
    while docs_left > 0:
        ts += 1
        recs = _doc(synth, n, min(4, docs_left), ts)
        writes.append(("", 1, recs))
        docs_left -= len(recs)
        n += 1
    order = rng.permutation(len(writes))  # documents and turns arrive interleaved, as in life
    t0 = time.perf_counter()
    sem = asyncio.Semaphore(16)

    async def one(k: int) -> None:
        _, version, recs = writes[k]
        vecs = rng.standard_normal((len(recs), DIMS)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        async with sem:
            await index.apply(recs[0].doc_id, version, recs, vecs)

    done = 0
    step = 2000
    for lo in range(0, len(order), step):
        await asyncio.gather(*(one(int(k)) for k in order[lo : lo + step]))
        done += min(step, len(order) - lo)
        print(f"  {done}/{len(order)} docs written", flush=True)
    return time.perf_counter() - t0, len(writes)


async def main_async(args: argparse.Namespace, redis_url: str) -> Result:
    import aiohttp

    from daemon.explore import Explorer, MemoryReads
    from daemon.explore.views_memory import timeline_body
    from daemon.http import build_app, start_http
    from daemon.launcher import free_port
    from daemon.settings import Settings
    from daemon.status import StatusState
    from graph.search import ScopedSearch
    from memory.config import EmbeddingConfig, IndexConfig, RetrievalConfig
    from memory.embedder import SentenceTransformerEmbedder
    from memory.index import ChunkIndex, PageKey
    from memory.retrieval import Retriever

    result = Result(
        BENCH,
        "Explorer: a page of 100 results at 100k chunks",
        {"chunks": args.chunks, "rounds": args.rounds, "page_size": 100, "vectors": "random unit vectors"},
        smoke=args.chunks < 100_000 or args.rounds < 20,
    )
    synth = SyntheticText(seed=11)
    rng = np.random.default_rng(11)
    client = aredis.from_url(redis_url, socket_timeout=120)
    embedder: SentenceTransformerEmbedder | None = None
    runner = None
    timings: dict[str, list[float]] = {}
    try:
        await wait_redis_ready(client)
        settings = Settings(redis_url=redis_url, index=IndexConfig(name="bench_explore"), http_port=0)
        index = ChunkIndex(client=client, cfg=settings.index, dims=DIMS)
        await index.drop()
        await index.ensure()
        print(f"writing {args.chunks} chunks ...", flush=True)
        write_s, docs = await fill(index, synth, args.chunks, rng)
        count = await index.count()
        print(f"  {count} chunks in {write_s:.0f} s; loading the model ...", flush=True)
        embedder = await SentenceTransformerEmbedder.load(EmbeddingConfig())  # type: ignore[call-arg]
        retriever = Retriever(index=index, embedder=embedder, cfg=RetrievalConfig())
        reads = MemoryReads(
            index=index,
            retriever=retriever,
            search=ScopedSearch(retriever=retriever, stores=None),
            graph=None,
            status=StatusState(),
            settings=settings,
        )

        async def no_checks() -> dict[str, str | None]:
            return {}

        app = build_app(
            state=StatusState(), ready_check=no_checks, explorer=Explorer(reads=reads, access=settings.http_access())
        )
        port = free_port()
        runner = await start_http(app, "127.0.0.1", port)
        base = f"http://127.0.0.1:{port}"
        page = await index.chunk_page({"tenant": "default"}, limit=100)
        stamps = sorted([c.timestamp or 0.0 for c in page.chunks])
        newest = stamps[-1] if stamps else 0.0
        middle = PageKey(newest - args.chunks * 0.3, 0)  # stamps step by 1 per doc: well inside
        queries = [synth.query(synth.rng.randint(3, 7)) for _ in range(args.rounds + 3)]
        pages = {
            "timeline, first page": lambda n: "/explore/chunks?tenant=default",
            "timeline, deep page": lambda n: f"/explore/chunks?tenant=default&at={middle.timestamp!r}&skip=0",
            "session turns": lambda n: "/explore/turns?tenant=default&agent=agent-000&session=s-000",
            "ask, top_k 100": lambda n: f"/explore/ask?tenant=default&k=100&q={queries[n].replace(' ', '+')}",
            "documents listing": lambda n: "/explore/documents?tenant=default",
            "agents listing": lambda n: "/explore/agents?tenant=default",
        }
        rows: dict[str, int] = {}
        async with aiohttp.ClientSession() as http:
            for name, path_of in pages.items():
                samples: list[float] = []
                for n in range(args.rounds + 3):
                    t = time.perf_counter()
                    async with http.get(base + path_of(n)) as resp:
                        body = await resp.text()
                        status = resp.status
                    if n >= 3:  # the first three warm the path
                        samples.append(time.perf_counter() - t)
                    if status != 200:
                        raise RuntimeError(f"{name}: HTTP {status}: {body[:300]}")
                rows[name] = _rows(body)
                timings[name] = samples
                s = summary_ms(samples)
                print(f"  {name}: p50 {s['p50_ms']:.1f} ms, p95 {s['p95_ms']:.1f} ms, {rows[name]} rows", flush=True)
        # The pure render alone, of the first timeline page read once.
        render: list[float] = []
        for _ in range(max(args.rounds, 20)):
            t = time.perf_counter()
            timeline_body(page, {"tenant": "default"}, deep=False)
            render.append(time.perf_counter() - t)
    finally:
        if runner is not None:
            await runner.cleanup()
        if embedder is not None:
            embedder.close()
        await client.aclose()

    result.figure("chunks indexed", count)
    result.figure("docs written", docs)
    result.figure("write time", write_s, "s")
    for name, samples in timings.items():
        s = summary_ms(samples)
        result.figure(f"{name}: p50 / p95", f"{s['p50_ms']:.1f} / {s['p95_ms']:.1f}", "ms")
        result.figure(f"{name}: rows on the page", rows[name])
    r = summary_ms(render)
    result.figure("rendering 100 rows alone (pure HTML), p50", r["p50_ms"], "ms")
    for name, samples in timings.items():
        p50 = summary_ms(samples)["p50_ms"]
        result.target(f"{name}, p50 at {args.chunks:,} chunks", p50, "<=", 100.0, "ms", "request to last byte")
    result.note(
        "chunks are written through ChunkIndex.apply with random unit vectors (no model), to keep the setup short; "
        "the ask page embeds each question with the packaged model, as a query does"
    )
    result.note(
        "the listings of documents and agents read the directory written with the chunks (a page of ids, then one "
        "pipelined read of the page's counts, times and versions): their cost follows the page, not the tenant; "
        "the chunk and turn pages are keyset-paged on the sortable timestamp"
    )
    result.doc["data"] = {"ms": {k: summary_ms(v) for k, v in timings.items()}, "render_ms": r}
    plot(png_path(args.out, BENCH), timings, args.chunks)
    return result


def _rows(body: str) -> int:
    """Rows of the page's main table (the ask page's results, not its legs' lists), header aside."""
    if 'id="results"' in body:
        body = body.split('id="results"', 1)[1].split("</table>", 1)[0]
    return body.count("<tr>") - 1


def plot(path: Any, timings: dict[str, list[float]], chunks: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(timings)
    ax.boxplot([[x * 1000 for x in timings[n]] for n in names], orientation="horizontal")
    ax.set_yticks(range(1, len(names) + 1), names)
    ax.axvline(100, color="#c0392b", linestyle="--", label="target 100 ms")
    ax.set_xlabel("ms, request to last byte")
    ax.set_title(f"Explorer pages of 100 rows at {chunks:,} chunks")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=30, help="requests per page, after 3 warm-ups (default 30)")
    add_common_args(parser)
    run_benchmark(BENCH, parser.parse_args(), main_async, kafka=False)


if __name__ == "__main__":
    main()
