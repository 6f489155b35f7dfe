"""Redis server settings the memory depends on, read so that the daemon and ``doctor`` can
say when a server is set up to lose or cut data silently (I/O at the edge, nothing else)."""

from __future__ import annotations

import contextlib
import re
import uuid
from typing import Any

import redis.exceptions as rexc

from memory import keys
from memory.schema import as_str, info_field

#: The ``maxmemory-policy`` values that never evict our keys. Chunks, versions, the graph and
#: the generation registry have no TTL, so ``volatile-*`` leaves them alone, but it may evict
#: a summary claim or the recompute lock before its time (two workers on one community).
SAFE_EVICTION = frozenset({"noeviction"})

TIMEOUT_FIX = "load the search module with ON_TIMEOUT FAIL (Redis 8: CONFIG SET search-on-timeout fail)"

#: RediSearch's fork GC: run every few seconds, whenever any chunk was rewritten or deleted.
#: Until it runs, a rewritten chunk's old terms still count in each term's document frequency,
#: while the live document count does not: a word in most chunks then counts in more documents
#: than there are, its BM25 IDF overflows (41 where it should be 0) and it outranks every other
#: word. Each turn is rewritten as the next two arrive, so under RediSearch's default threshold
#: (100 rewritten chunks) a small memory ("I" in every turn) stays that way.
GC_CLEAN_THRESHOLD = 1
GC_RUN_INTERVAL_S = 5
GC_FIX = (
    f"load the search module with FORK_GC_CLEAN_THRESHOLD {GC_CLEAN_THRESHOLD} FORK_GC_RUN_INTERVAL "
    f"{GC_RUN_INTERVAL_S} (Redis 8: CONFIG SET search-fork-gc-clean-threshold {GC_CLEAN_THRESHOLD}, "
    f"search-fork-gc-run-interval {GC_RUN_INTERVAL_S})"
)
EVICTION_FIX = "CONFIG SET maxmemory-policy noeviction (then a full Redis refuses writes, which are retried)"


async def _config(client: Any, commands: list[tuple[tuple[str, ...], str]]) -> str | None:
    """The first readable value among ``(command, name)`` pairs, lowercased; None if none is."""
    for command, name in commands:
        try:
            reply = await client.execute_command(*command)
        except (rexc.RedisError, OSError):
            continue
        if isinstance(reply, dict):
            pairs = list(reply.items())
        else:  # [[name, value]] from FT.CONFIG, [name, value] from CONFIG (RESP2)
            flat = [x for p in reply or () for x in (p if isinstance(p, list | tuple) else [p])]
            pairs = list(zip(flat[::2], flat[1::2], strict=False))
        for key, value in pairs:
            if as_str(key).lower() == name.lower() and value is not None:
                return as_str(value).lower()
    return None


async def search_timeout_policy(client: Any) -> str | None:
    """RediSearch's ``ON_TIMEOUT`` policy (``fail`` or ``return``); None if unreadable.

    Under ``return`` (RediSearch's default) a query that outlives ``TIMEOUT`` answers with
    what it found so far, and over RESP2 nothing says so: a search leg short of hits, a
    version check missing docs, a reindex's summary listing cut short, all silently. Under
    ``fail`` it is an error (an outage to retry; ``unavailable`` to an asker).
    """
    # FT.CONFIG is deprecated from Redis 8, whose own CONFIG names it search-on-timeout.
    return await _config(
        client,
        [
            (("FT.CONFIG", "GET", "ON_TIMEOUT"), "ON_TIMEOUT"),
            (("CONFIG", "GET", "search-on-timeout"), "search-on-timeout"),
        ],
    )


async def eviction_policy(client: Any) -> str | None:
    """Redis's ``maxmemory-policy``; None if unreadable (managed Redis may refuse CONFIG).

    Under an ``allkeys-*`` policy a full Redis deletes keys to make room: chunks, doc
    versions, the graph, the generation registry, each gone without a trace or an error.
    """
    return await _config(client, [(("CONFIG", "GET", "maxmemory-policy"), "maxmemory-policy")])


async def gc_clean_threshold(client: Any) -> int | None:
    """RediSearch's ``FORK_GC_CLEAN_THRESHOLD`` (deleted documents before its GC runs); None if
    unreadable. See ``GC_CLEAN_THRESHOLD`` for what a high one does to BM25 scores."""
    value = await _config(
        client,
        [
            (("FT.CONFIG", "GET", "FORK_GC_CLEAN_THRESHOLD"), "FORK_GC_CLEAN_THRESHOLD"),
            (("CONFIG", "GET", "search-fork-gc-clean-threshold"), "search-fork-gc-clean-threshold"),
        ],
    )
    return int(value) if value is not None and value.isdigit() else None


async def unsafe_settings(client: Any) -> list[tuple[str, str, str]]:
    """``(setting, value, fix)`` for each readable setting that can lose or cut data silently."""
    out = []
    if (timeout := await search_timeout_policy(client)) not in (None, "fail"):
        out.append(("search ON_TIMEOUT", str(timeout), TIMEOUT_FIX))
    if (eviction := await eviction_policy(client)) is not None and eviction not in SAFE_EVICTION:
        out.append(("maxmemory-policy", eviction, EVICTION_FIX))
    return out


#: RediSearch 2.10 adds a document's length to its index's total at each write and never takes
#: it back (a rewrite, a delete), while its document count stays exact: the average length BM25
#: divides by grows with every rewrite (a turn is rewritten as the next two arrive, a
#: document's chunks at each upsert) until the index is built anew: a reindex, or a restart of
#: Redis as far as its AOF was rewritten since (the writes logged after are replayed). Measured,
#: it costs no recall (docs/decisions/0076); ``doctor`` and ``/metrics`` show it.
_AVERAGE_LENGTH = re.compile(r"Average Doc Len ([0-9.]+)")
_PROBE_WORDS = "length probe words"  # three terms, none a stopword


def writes_per_chunk(info: Any) -> float | None:
    """How many writes the index has counted per document it holds (FT.INFO's
    ``max_doc_id`` over ``num_docs``: each write takes a new document id); None if unreadable
    or empty."""
    try:
        ids, docs = int(info_field(info, "max_doc_id")), int(info_field(info, "num_docs"))
    except (TypeError, ValueError):
        return None
    return ids / docs if docs > 0 else None


async def keeps_rewritten_lengths(client: Any, name: str) -> bool | None:
    """Whether this RediSearch counts a rewritten document's length again in the average BM25
    divides by (True), or replaces it (False); None if the probe could not run (an ACL that
    refuses FT.CREATE, say).

    The probe is a scratch index of its own (``memory.keys.length_probe``, its name unique to
    this call), dropped with its key after: one document of three words, written twice, then
    the average length its score is explained with.
    """
    probe, prefix = keys.length_probe(name, uuid.uuid4().hex[:12])
    try:
        await client.execute_command(
            "FT.CREATE", probe, "ON", "HASH", "PREFIX", 1, prefix, "SKIPINITIALSCAN", "SCHEMA", "t", "TEXT"
        )
        for _ in range(2):
            await client.hset(f"{prefix}1", mapping={"t": _PROBE_WORDS})
        reply = await client.execute_command(
            "FT.SEARCH", probe, "probe", "WITHSCORES", "EXPLAINSCORE", "SCORER", "BM25STD", "LIMIT", 0, 1
        )
    except (rexc.RedisError, OSError):
        return None
    finally:
        await _drop_probe(client, probe, f"{prefix}1")
    found = _AVERAGE_LENGTH.search(str(reply))
    return None if found is None else float(found.group(1)) > len(_PROBE_WORDS.split()) + 0.5


async def _drop_probe(client: Any, probe: str, key: str) -> None:
    with contextlib.suppress(rexc.RedisError, OSError):
        await client.execute_command("FT.DROPINDEX", probe)
    with contextlib.suppress(rexc.RedisError, OSError):
        await client.delete(key)
