"""What one 50-chunk document's edit costs Redis, written three ways against a real index.

Run from the project root (a measurement behind decision 0029, not a target):

    .venv/bin/python bench/edits_write_cost.py

An index with 2,000 background chunks and one 50-chunk document; 30 rounds of each way, timed
around the MULTI/EXEC (RediSearch indexes inside EXEC): ``full`` (every chunk deleted and
written again: what ``ChunkIndex.apply`` does), ``bump`` (one chunk written, the other 49 given
only a new ``version``, ``timestamp`` and ``ts``), ``one`` (one chunk written, the rest left
alone) and ``apply`` (``ChunkIndex.apply`` itself, hashes built beforehand).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import uuid
from typing import Any

import numpy as np
from _run import quiet_logs
from _servers import embedded_servers

WORDS = ["pool", "drain", "replica", "ledger", "timeout", "billing"]


async def main_async(url: str) -> None:
    import redis.asyncio as aredis

    from memory import keys
    from memory.config import IndexConfig
    from memory.index import ChunkIndex, codec
    from memory.records import ChunkRecord

    r: Any = aredis.from_url(url)
    index = ChunkIndex(client=r, cfg=IndexConfig(name="w" + uuid.uuid4().hex[:6]), dims=384)
    await index.ensure()
    rng = np.random.default_rng(1)

    def records(doc: str, version: int, n: int) -> list[ChunkRecord]:
        return [
            ChunkRecord(
                chunk_id=f"{doc}_p{i}",
                doc_id=doc,
                position=i,
                text=" ".join(random.Random(i).choice(WORDS) for _ in range(120)),
                kind="document",
                source=doc,
                tags={},
                metadata={},
                version=version,
                timestamp=1.7e9 + version,
                vector_key=uuid.uuid4().hex,
            )
            for i in range(n)
        ]

    def vectors(n: int) -> np.ndarray:
        v = rng.standard_normal((n, 384)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    for d in range(100):
        await index.apply(f"bg{d}", 1, records(f"bg{d}", 1, 20), vectors(20))
    doc = "target"
    await index.apply(doc, 1, records(doc, 1, 50), vectors(50))
    gen = (await index.state()).active
    vecs = vectors(50)
    took: dict[str, list[float]] = {"full": [], "bump": [], "one": [], "apply": []}
    version = 1
    for _ in range(30):
        for way in took:
            version += 1
            recs = records(doc, version, 50)
            analyses = codec.analyze_records(recs)
            maps = [codec._record_mapping(c, vecs[i], analyses[i]) for i, c in enumerate(recs)]
            t0 = time.perf_counter()
            if way == "apply":
                await index.apply(doc, version, recs, vecs, analyses=analyses)
            else:
                async with r.pipeline(transaction=True) as pipe:
                    for i, c in enumerate(recs):
                        key = keys.chunk_key(index.cfg.name, gen, "default", c.chunk_id)
                        if way == "full" or i == 7:
                            pipe.delete(key)
                            pipe.hset(key, mapping=maps[i])
                        elif way == "bump":
                            bump = {"version": version, "timestamp": c.timestamp, "ts": repr(c.timestamp)}
                            pipe.hset(key, mapping=bump)
                    pipe.set(keys.ver_key(index.cfg.name, gen, "default", doc), version)
                    await pipe.execute()
            took[way].append(time.perf_counter() - t0)
    for way, xs in took.items():
        p90 = sorted(xs)[int(0.9 * len(xs))]
        print(f"{way:6s} median {1000 * statistics.median(xs):6.2f} ms  p90 {1000 * p90:6.2f} ms")
    await index.drop()
    await r.aclose()


def main() -> None:
    quiet_logs()
    with embedded_servers(kafka=False, appendonly=True) as servers:
        asyncio.run(main_async(servers.redis_url))


if __name__ == "__main__":
    main()
