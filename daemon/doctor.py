"""`agentmemd doctor`: check settings, connections, the index schema, topics and consumer groups,
and say in words what is wrong and how to fix it.
"""

from __future__ import annotations

import asyncio

import redis.exceptions

from daemon.connections import redis_client
from daemon.doctor_finding import Finding
from daemon.doctor_index import (
    check_directory,
    check_generation,
    check_lengths,
    check_standings,
    check_summaries,
    check_unfinished_writes,
)
from daemon.doctor_kafka import check_kafka
from daemon.settings import Settings
from memory.config import PACKAGED_DIMS
from memory.errors import MemdError
from memory.index import translate_errors
from memory.schema import compare_schema, index_schema, info_attributes
from memory.server_policies import (
    EVICTION_FIX,
    GC_CLEAN_THRESHOLD,
    GC_FIX,
    SAFE_EVICTION,
    TIMEOUT_FIX,
    eviction_policy,
    gc_clean_threshold,
    search_timeout_policy,
)

__all__ = ["Finding", "diagnose"]


async def _check_redis(settings: Settings) -> list[Finding]:
    found: list[Finding] = []
    client = redis_client(settings)
    try:
        async with translate_errors("doctor"):
            await client.ping()
            modules = {
                (m.get(b"name") or m.get("name") or b"").decode().lower()
                if isinstance(m.get(b"name") or m.get("name"), bytes)
                else str(m.get(b"name") or m.get("name")).lower()
                for m in await client.module_list()
            }
        found.append(Finding("redis", True, f"reachable at {settings.redis_url}"))
        if "search" not in modules:
            found.append(
                Finding(
                    "redis search module",
                    False,
                    f"modules loaded: {sorted(modules) or 'none'}",
                    "use Redis 8 (query engine built in) or load redisearch.so (--loadmodule)",
                )
            )
            return found
        found.append(Finding("redis search module", True, "loaded"))
        if (timeout := await search_timeout_policy(client)) is not None:
            found.append(
                Finding(
                    "search timeout policy",
                    timeout == "fail",
                    f"ON_TIMEOUT {timeout}"
                    + ("" if timeout == "fail" else ": a slow query answers with partial results, silently"),
                    TIMEOUT_FIX,
                )
            )
        if (threshold := await gc_clean_threshold(client)) is not None:
            found.append(
                Finding(
                    "search GC threshold",
                    threshold <= GC_CLEAN_THRESHOLD,
                    f"FORK_GC_CLEAN_THRESHOLD {threshold}"
                    + (
                        ""
                        if threshold <= GC_CLEAN_THRESHOLD
                        else ": until that many chunks are rewritten, a word in most of them outranks every "
                        "other (its BM25 IDF overflows)"
                    ),
                    GC_FIX,
                )
            )
        if (eviction := await eviction_policy(client)) is not None:
            safe = eviction in SAFE_EVICTION
            found.append(
                Finding(
                    "eviction policy",
                    safe,
                    f"maxmemory-policy {eviction}"
                    + ("" if safe else ": a full Redis deletes memory (chunks, versions, graph) silently"),
                    EVICTION_FIX,
                )
            )
        name = settings.index.name
        try:
            async with translate_errors("doctor"):
                info = await client.ft(name).info()  # type: ignore[no-untyped-call]
        except MemdError as exc:
            found.append(
                Finding(
                    "index",
                    False,
                    f"index {name!r} not found ({exc})",
                    "start the daemon once (`agentmemd run`), it creates the index",
                )
            )
            return found
        dims = PACKAGED_DIMS if settings.embedding.model.startswith("packaged:") else None
        expected = index_schema(settings.index, dims=dims or PACKAGED_DIMS, generation=1)
        problems = compare_schema(expected, info_attributes(info))
        if dims is None:
            problems = [p for p in problems if "dims" not in p]
        if problems:
            found.append(
                Finding(
                    "index schema",
                    False,
                    "; ".join(problems),
                    "the index predates these settings or this version: rebuild it with "
                    "`agentmemd reindex` or drop it and replay from Kafka",
                )
            )
        else:
            entries = f"{info.get('num_docs', '?')} entries (chunks and community summaries)"
            found.append(Finding("index schema", True, f"{name!r} matches the settings, {entries}"))
        found.extend(await check_lengths(client, name, info))
        found.extend(await check_generation(client, settings, dims))
        found.extend(await check_unfinished_writes(client, settings, dims or PACKAGED_DIMS))
        found.extend(await check_directory(client, settings, dims or PACKAGED_DIMS))
        found.extend(await check_standings(client, settings))
        if settings.graph.enabled:
            found.extend(await check_summaries(client, settings))
    except MemdError as exc:
        if exc.code == "unauthorized":
            fix = "check AGENTMEM_REDIS_USERNAME / AGENTMEM_REDIS_PASSWORD"
        elif _hung(exc):
            fix = (
                f"Redis at {settings.redis_url} is hung or blocked (a long command, a stopped process, a host "
                "swapping): see its log, or what `redis-cli --latency` and `INFO` say once it answers"
            )
        else:
            fix = f"start Redis at {settings.redis_url} (`agentmemd servers` for a local one)"
        found.append(Finding("redis", False, str(exc), fix))
    finally:
        await client.aclose()
    return found


def _hung(exc: MemdError) -> bool:
    """Whether Redis took the connection and then did not answer: it runs (starting another would
    not help). A connect that timed out reached nothing: a host down or firewalled."""
    cause = exc.__cause__
    return isinstance(cause, redis.exceptions.TimeoutError | TimeoutError) and "connecting" not in str(cause)


async def diagnose(settings: Settings) -> list[Finding]:
    """Every finding, Redis first, then Kafka."""
    redis_findings, kafka_findings = await asyncio.gather(_check_redis(settings), check_kafka(settings))
    return [Finding("settings", True, "loaded"), *redis_findings, *kafka_findings]
