"""Redis I/O for chunks: index creation, versioned writes, and the two search legs.

Every redis exception is translated here; none leaves ``memory/``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
import types
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis.asyncio as aredis
import structlog
from redis import exceptions as rexc
from redis.commands.search.query import Query
from redisvl.exceptions import RedisVLError
from redisvl.index import AsyncSearchIndex
from redisvl.schema import IndexSchema

from memory.chunking import chunk_id, chunk_position
from memory.config import ChunkingConfig, IndexConfig
from memory.conversation import date_words, matching_terms
from memory.errors import BackendUnavailable, MemdError, NotFound, Unauthorized
from memory.filters import hash_clause, hash_field, value_hash
from memory.generations import GenerationRegistry, GenerationState, IndexMismatch, IndexSpec, index_spec
from memory.identifiers import identifiers
from memory.metrics import SLICED_WRITES
from memory.records import DEFAULT_TENANT, ApplyResult, ChunkRecord, StoredChunk
from memory.schema import (
    as_str,
    compare_schema,
    generation_of,
    index_schema,
    info_attributes,
    info_index_name,
    key_root,
    physical_name,
)
from memory.text import index_terms
from memory.visibility import FINISHED_MARKER_TTL_S, WriteMarker, decide, live, slices

log = structlog.get_logger()

_RETURN_FIELDS = ("chunk_id", "text", "doc_id", "source", "kind", "metadata", "idents", "timestamp", "ts", "version")
_WATCH_RETRIES = 16


class _NoGeneration(NotFound):
    """The index has no active generation (never created, or lost with Redis's data)."""


class _GenerationSwitched(Exception):
    """A sliced write's generation stopped being the one written to: write it all again."""


class _Superseded(Exception):
    """A sliced write's marker no longer holds its token: another write took the doc over."""


class WriteInProgress(BackendUnavailable):
    """Another live process is writing this very version of the doc in slices: retried later
    (by then it has finished, and the stored version says so, or stopped, and is taken over)."""


@dataclass(frozen=True, slots=True)
class DocState:
    """What one generation holds of a doc: its last applied version and whether it has chunks."""

    version: int | None
    has_chunks: bool


class IndexError_(MemdError):
    """Redis rejected an index command (schema mismatch, bad query)."""

    code = "index_error"


class QuerySyntaxError(IndexError_):
    """RediSearch could not parse a query we built: our bug, not an outage (retrying the
    same query can only fail again)."""


# Refusals that pass: memory full (maxmemory), a replica after a failover, a failed
# snapshot write, a busy script, a cluster resharding. Reported as outages, so ingestion
# backs off without committing, instead of dead-lettering every event it holds.
_REFUSED_FOR_NOW = (
    rexc.OutOfMemoryError,
    rexc.ReadOnlyError,
    rexc.MasterDownError,
    rexc.ClusterDownError,
    rexc.TryAgainError,
)
# The error code leads the message of a single command; inside a transaction redis-py
# rewrites it as 'Command # 1 (DEL …) of pipeline caused error: ("MISCONF …",)'.
_AT_CODE = r"(?:^|caused error: \(['\"])"
_REFUSED = re.compile(_AT_CODE + r"(?:OOM|READONLY|MASTERDOWN|MISCONF|BUSY |TRYAGAIN|CLUSTERDOWN|NOREPLICAS)")
_DENIED = re.compile(_AT_CODE + r"(?:NOAUTH|WRONGPASS|NOPERM)")
#: Search timeout of bulk listings (a reindex's summaries), not of askers' queries.
BULK_QUERY_TIMEOUT_MS = 60_000
# Most listings of one forget (see doc_ids_where).
_LISTING_PASSES = 4
#: The version an unversioned doc's delete stores (below every real version, which start at 0
#: or more, so a versioned write would still apply; turns are never versioned).
UNVERSIONED_TOMBSTONE = 0
# The error for a query that outlived its timeout under ON_TIMEOUT FAIL (newer releases
# prefix the message with a SEARCH_TIMEOUT code).
_SEARCH_TIMEOUT = re.compile(r"Timeout limit was reached|^SEARCH_TIMEOUT\b")


def _translated(exc: BaseException, what: str) -> MemdError | None:
    """Our error for a redis (or redisvl-wrapped redis) exception, or ``None``."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 5:  # redisvl wraps the redis error it hit
        if isinstance(cur, rexc.AuthenticationError):
            return Unauthorized(f"redis refused the credentials during {what}: {cur}")
        if isinstance(cur, rexc.ConnectionError | rexc.TimeoutError | rexc.BusyLoadingError | OSError):
            return BackendUnavailable(f"redis unavailable during {what}: {cur}")
        if isinstance(cur, _REFUSED_FOR_NOW):
            return BackendUnavailable(f"redis refused the command for now during {what}: {cur}")
        if isinstance(cur, rexc.NoPermissionError | rexc.AuthorizationError):
            return Unauthorized(f"redis refused access during {what}: {cur}")
        if isinstance(cur, rexc.ResponseError):
            text = str(cur)
            if _DENIED.search(text):
                return Unauthorized(f"redis refused access during {what}: {cur}")
            if "LOADING" in text or _REFUSED.search(text):
                return BackendUnavailable(f"redis not ready during {what}: {cur}")
            if _SEARCH_TIMEOUT.search(text):
                return BackendUnavailable(f"redis search timed out during {what}: {cur}")
            if text.startswith("Syntax error"):
                return QuerySyntaxError(f"redis could not parse the query during {what}: {cur}")
            return IndexError_(f"redis error during {what}: {cur}")
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return None


@asynccontextmanager
async def translate_errors(what: str) -> AsyncIterator[None]:
    """Turn redis exceptions into our hierarchy at the point they enter."""
    try:
        yield
    except (rexc.RedisError, RedisVLError, OSError) as exc:
        ours = _translated(exc, what)
        if ours is None:
            raise
        raise ours from exc


@dataclass(frozen=True, slots=True)
class TurnEntry:
    """A stored chunk of a transcript turn: its id, text, context and kind."""

    chunk_id: str
    text: str
    context: str
    context_vec: str
    kind: str
    timestamp: float


@dataclass(frozen=True, slots=True)
class Analysis:
    """A chunk text's BM25 terms and identifiers, as the ``terms`` and ``idents`` fields hold them."""

    terms: str
    idents: str


def analyze(texts: Sequence[str]) -> list[Analysis]:
    """The text analysis of each chunk (pure CPU: ~2.5 ms per 250-token chunk).

    Ingestion runs it while the batch is being embedded, so that writing a batch after its
    vectors arrive costs Redis round trips only.
    """
    return [Analysis(index_terms(t), " ".join(identifiers(t))) for t in texts]


def turn_terms(text: str, context: str, timestamp: float) -> str:
    """The ``terms`` of a transcript turn's chunk: its own terms weighted up, the day it was said,
    then its neighbours' (``memory.conversation``)."""
    return matching_terms(index_terms(text), [index_terms(date_words(timestamp)), index_terms(context)])


def analyze_records(chunks: Sequence[ChunkRecord]) -> list[Analysis]:
    """:func:`analyze` for chunk records: a transcript turn's terms also hold its context's."""
    out = analyze([c.text for c in chunks])
    return [
        dataclasses.replace(a, terms=turn_terms(c.text, c.context, c.timestamp)) if c.kind == "transcript" else a
        for a, c in zip(out, chunks, strict=True)
    ]


def _reanalyzed(mapping: dict[Any, Any]) -> dict[Any, Any]:
    """A stored chunk hash with its ``terms`` and ``idents`` analyzed again from its ``text``."""
    fields = {as_str(k): k for k in mapping}
    if "text" not in fields:
        return mapping
    text = as_str(mapping[fields["text"]])
    analysis = analyze([text])[0]
    out = dict(mapping)
    terms = analysis.terms
    if "kind" in fields and as_str(mapping[fields["kind"]]) == "transcript":
        context = as_str(mapping[fields["context"]]) if "context" in fields else ""
        terms = turn_terms(text, context, float(as_str(mapping[fields["ts"]])) if "ts" in fields else 0.0)
    out[fields.get("terms", "terms")] = terms
    out[fields.get("idents", "idents")] = analysis.idents
    return out


#: Docs of up to this many chunks have their hashes built on the event loop; larger ones
#: in a thread (a hop a one-chunk turn need not pay).
_INLINE_MAPPINGS = 64


def _record_mapping(rec: ChunkRecord, vector: np.ndarray, analysis: Analysis) -> dict[str, Any]:
    mapping: dict[str, Any] = {
        "chunk_id": rec.chunk_id,
        "doc_id": rec.doc_id,
        "position": rec.position,
        "text": rec.text,
        "terms": analysis.terms,
        "idents": analysis.idents,
        "context": rec.context,
        "context_vec": rec.context_vec,
        "kind": rec.kind,
        "source": rec.source,
        "version": rec.version,
        "timestamp": rec.timestamp,
        # Not in the schema: RediSearch returns the NUMERIC field rounded to 12 significant
        # digits (10 ms of an epoch timestamp), while this hash field comes back as written.
        "ts": repr(float(rec.timestamp)),
        "metadata": json.dumps(rec.metadata, sort_keys=True),
        "vector": np.asarray(vector, dtype=np.float32).tobytes(),
    }
    for key, value in {**rec.tags, "tenant": rec.tenant}.items():
        mapping[key] = value
        mapping[hash_field(key)] = value_hash(value)
    return mapping


def _stored(doc: Any, tag_keys: Sequence[str]) -> StoredChunk:
    raw_meta = getattr(doc, "metadata", "{}")
    try:
        metadata = json.loads(as_str(raw_meta))
    except ValueError:
        metadata = {}
    return StoredChunk(
        chunk_id=as_str(getattr(doc, "chunk_id", "")),
        text=as_str(getattr(doc, "text", "")),
        doc_id=as_str(getattr(doc, "doc_id", "")),
        source=as_str(getattr(doc, "source", "")),
        kind=as_str(getattr(doc, "kind", "")),
        metadata=metadata if isinstance(metadata, dict) else {},
        tags={k: as_str(getattr(doc, k)) for k in tag_keys if getattr(doc, k, None) is not None},
        idents=tuple(as_str(getattr(doc, "idents", "")).split()),
        timestamp=_timestamp(doc),
        version=_int_or_none(getattr(doc, "version", None)),
        generation=_key_generation(as_str(getattr(doc, "id", ""))),
    )


_KEY_GENERATION = re.compile(r"^[^:]+:g(\d+):chunk:")


def _text(value: Any) -> str:
    return "" if value is None else as_str(value)


def _mark_finished(pipe: Any, marker_key: str, version: int) -> None:
    """Queue the marker of a doc whose write is whole: queries show ``version``. Kept a while
    for queries whose legs straddled the flip; after that the doc needs no marker."""
    pipe.set(marker_key, WriteMarker(shown=version, writing=None).encode(), ex=FINISHED_MARKER_TTL_S)


def _unfinished(doc_id: str, why: str) -> BackendUnavailable:
    """A sliced write that could not go on. Retried (not dead-lettered, which would commit
    the event with the doc half-written and nobody left to finish it)."""
    return BackendUnavailable(f"write of {doc_id!r} in slices {why} after {_WATCH_RETRIES} tries; retried later")


async def _redis_now(conn: Any) -> float:
    """Redis's clock (epoch seconds): write markers are stamped and judged by it, so that no
    two hosts' clocks have to agree. (Asked on its own connection: a watched pipeline
    buffers TIME instead of sending it.)"""
    sec, usec = await conn.time()
    return float(sec) + float(usec) / 1e6


def _key_generation(key: str) -> int | None:
    """The generation a chunk's key belongs to (``<name>:g<N>:chunk:…``; names hold no colon)."""
    found = _KEY_GENERATION.search(key)
    return int(found.group(1)) if found else None


def _timestamp(doc: Any) -> float | None:
    """The exact stored timestamp (``ts``), else the indexed one, rounded by RediSearch (a
    chunk written before ``ts`` existed)."""
    exact = _float_or_none(getattr(doc, "ts", None))
    return exact if exact is not None else _float_or_none(getattr(doc, "timestamp", None))


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(as_str(value))
    except ValueError:
        return None


def _float_or_none(value: Any) -> float | None:
    try:
        return None if value is None else float(as_str(value))
    except ValueError:
        return None


class ChunkIndex:
    """Chunks of every document in one RediSearch index, plus per-doc version bookkeeping.

    The index is generational (``memory.generations``): by default this object follows the
    active generation (writes go to it, searches go through the alias ``cfg.name``); with
    ``generation`` it is pinned to one generation (what a reindex builds). Key layout under
    a generation's root ``<name>:g<N>:``: ``chunk:<tenant>:<chunk_id>`` hashes (indexed),
    ``ver:<tenant>:<doc_id>`` the last applied version (kept after a delete, as a tombstone,
    so an older upsert can never resurrect the doc), ``doc:<tenant>:<doc_id>`` the set of
    its chunk ids.
    """

    #: How long a read of the active generation is trusted by searches (writes always re-read).
    STATE_TTL_S = 1.0

    def __init__(
        self,
        *,
        client: aredis.Redis,
        cfg: IndexConfig,
        dims: int,
        spec: IndexSpec | None = None,
        generation: int | None = None,
        recreate: bool = False,
    ) -> None:
        self._r = client
        self._recreate = recreate and generation is None
        self._cfg = cfg
        self._dims = dims
        self._tag_keys = ("tenant", *cfg.filter_keys)
        self._fields = tuple(dict.fromkeys((*_RETURN_FIELDS, *self._tag_keys)))
        self.spec = spec or index_spec(cfg, model="unspecified", dims=dims, chunking=ChunkingConfig())
        self.pinned = generation
        self.registry = GenerationRegistry(client, cfg.name)
        self._state: GenerationState | None = None
        self._state_at = 0.0
        self._search: Any = None
        # Names this writer in the markers of its sliced writes (memory.visibility.decide).
        self._owner = uuid.uuid4().hex

    @property
    def cfg(self) -> IndexConfig:
        """This index's config."""
        return self._cfg

    def _schema(self, generation: int) -> IndexSchema:
        return IndexSchema.from_dict(index_schema(self._cfg, dims=self._dims, generation=generation))

    # Tenants never share a key: the tenant (no ':' allowed) leads every per-doc key.
    def _chunk_key(self, gen: int, tenant: str, chunk_id: str) -> str:
        return f"{key_root(self._cfg.name, gen)}chunk:{tenant}:{chunk_id}"

    def _ver_key(self, gen: int, tenant: str, doc_id: str) -> str:
        return f"{key_root(self._cfg.name, gen)}ver:{tenant}:{doc_id}"

    def _doc_key(self, gen: int, tenant: str, doc_id: str) -> str:
        return f"{key_root(self._cfg.name, gen)}doc:{tenant}:{doc_id}"

    def _marker_key(self, gen: int, tenant: str, doc_id: str) -> str:
        """The doc's write marker (``memory.visibility``): only while (or just after) it
        was written in slices."""
        return f"{key_root(self._cfg.name, gen)}wr:{tenant}:{doc_id}"

    def _search_name(self) -> str:
        return self._cfg.name if self.pinned is None else physical_name(self._cfg.name, self.pinned)

    def _ft(self) -> Any:
        # redis-py builds a new Search object (and its callback table) on every .ft() call:
        # ~5% of a query's event-loop time at 200 q/s. The name is fixed per instance.
        if self._search is None:
            self._search = self._r.ft(self._search_name())
        return self._search

    def _mismatch(self, state: GenerationState) -> str | None:
        if state.spec is None or state.spec == self.spec:
            return None
        if state.spec.only_analysis_differs(self.spec):
            # Only the text analysis differs: no settings bring the other one back.
            head = (
                f"the active index generation {state.active} of {self._cfg.name!r} was analyzed with "
                f"text analysis version {state.spec.analyzer}, this process uses version {self.spec.analyzer}: "
            )
            if state.spec.analyzer > self.spec.analyzer:
                return head + "upgrade this process to the release that built it"
            return head + (
                "run `agentmemd reindex` to re-analyze it (its chunks and vectors are kept, even "
                "where the broker no longer holds their events), or run the release that built it"
            )
        return (
            f"the active index generation {state.active} of {self._cfg.name!r} was built with "
            f"{state.spec.describe()}, this process has {self.spec.describe()}: restart it with the "
            "settings the index was built with (or run `agentmemd reindex` with these)"
        )

    async def state(self, *, fresh: bool = False) -> GenerationState:
        """The generation registry, cached for ``STATE_TTL_S`` unless ``fresh``."""
        now = time.monotonic()
        if fresh or self._state is None or now - self._state_at > self.STATE_TTL_S:
            async with translate_errors("generation read"):
                self._state = await self.registry.state()
            self._state_at = now
        return self._state

    async def _refuse_mismatch(self) -> None:
        """Raise ``IndexMismatch`` when the active generation was built with other settings
        (the cached registry state: a query pays no extra round trip)."""
        if self.pinned is None and (why := self._mismatch(await self.state())):
            raise IndexMismatch(why)

    async def mismatch(self) -> str | None:
        """Why this process may not use the active generation, or ``None`` when it may."""
        if self.pinned is not None:
            return None
        return self._mismatch(await self.state(fresh=True))

    async def _generation(self) -> int:
        """The generation reads and writes go to (following: the active one)."""
        if self.pinned is not None:
            return self.pinned
        state = await self.state()
        if state.active == 0 and self._recreate:
            await self._recover()
            state = await self.state(fresh=True)
        if state.active == 0:
            raise self._no_generation()
        return state.active

    def _no_generation(self) -> NotFound:
        return _NoGeneration(f"index {self._cfg.name!r} has no generation yet; start the daemon once to create it")

    async def _recover(self) -> None:
        """The registry is gone while running (Redis restarted without persistence, or was
        flushed): create the index again so ingestion and queries go on, and say loudly that
        what was indexed before is gone. Otherwise every event would fail its attempts and be
        dead-lettered. ``agentmemd reindex`` rebuilds the rest from Kafka.
        """
        async with translate_errors("index recovery"):
            if await self._adopt():  # only the registry is gone: the data is all there
                return
        log.error(
            "index.lost",
            index=self._cfg.name,
            action="recreated empty; run `agentmemd reindex` to rebuild it from what Kafka retains",
        )
        await self.ensure()

    async def ensure(self) -> bool:
        """Create the index (the pinned generation, or generation 1 behind the alias) if missing.

        Returns True when it was created. A spec mismatch is logged, not raised: the daemon
        still starts, reports it as not ready and refuses writes until restarted.
        """
        created = False
        async with translate_errors("index creation"):
            if self.pinned is not None:
                return await self._create(self.pinned)
            state = await self.registry.state()
            if state.active == 0 and await self._adopt():
                state = await self.registry.state()
            # Never (re)create the active generation's index with settings it was not built with.
            if self._mismatch(state) is None:
                created = await self._create(state.active or 1)
            if state.active == 0:
                await self.registry.bootstrap(self.spec)
        why = await self.mismatch()
        if why:
            log.error("index.spec_mismatch", index=self._cfg.name, reason=why)
        return created

    async def _adopt(self) -> bool:
        """The registry is gone but the alias is not (a key deleted or evicted, a partial
        restore): adopt the generation it points at instead of failing every start on an
        alias that already exists, or starting an empty generation 1 beside the data.

        Raises:
            IndexError_: the alias names an index that is not one of this name's generations,
                or one whose schema these settings would not build.
        """
        info = await self.registry.alias_info()
        if info is None:
            return False  # no alias, no index: a first start
        physical = info_index_name(info)
        gen = generation_of(self._cfg.name, physical)
        if gen is None:
            raise IndexError_(
                f"a search index or alias {self._cfg.name!r} exists ({physical!r}) that is not one of this "
                f"name's generations ({self._cfg.name}-g<N>): drop it (FT.DROPINDEX / FT.ALIASDEL) or "
                "choose another AGENTMEM_INDEX__NAME"
            )
        expected = index_schema(self._cfg, dims=self._dims, generation=gen)
        problems = compare_schema(expected, info_attributes(info))
        if problems:
            raise IndexError_(
                f"the generation registry {self.registry.key!r} is gone and the alias {self._cfg.name!r} points "
                f"at {physical!r}, which these settings would not build ({'; '.join(problems)}): start with the "
                "settings it was built with, or drop it to start empty"
            )
        seq = max([gen, *await self.registry.listed()])
        why = (
            f"registry lost; adopted from the alias at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, "
            "spec assumed from the adopting process's settings"
        )
        if await self.registry.adopt(gen, seq, self.spec, why):
            log.error(
                "index.registry_recovered",
                index=self._cfg.name,
                generation=gen,
                seq=seq,
                action="adopted the generation the alias points at; its model and chunking cannot be checked: "
                "if it was built with other settings, run `agentmemd reindex`",
            )
        return True

    async def _create(self, gen: int) -> bool:
        index = AsyncSearchIndex(self._schema(gen), redis_client=self._r)
        if await index.exists():
            return False
        try:
            await index.create(overwrite=False)
        except RedisVLError as exc:  # another daemon created it a moment ago
            if "already exists" not in str(exc.__cause__ or exc).lower():
                raise
            return False
        log.info("index.created", index=physical_name(self._cfg.name, gen), dims=self._dims)
        return True

    async def drop(self, *, delete_documents: bool = True) -> None:
        """Drop this object's generation: its physical index, chunk hashes and bookkeeping keys.

        Following (not pinned), this resets the index name: the active generation and the
        registry go, and the next ``ensure()`` creates generation 1 again. Used by tests,
        benchmarks and reindexing (an aborted build, or the old generation after a switch).
        """
        if self.pinned is None and (await self.state(fresh=True)).active == 0:
            return
        gen = await self._generation()
        async with translate_errors("index drop"):
            index = AsyncSearchIndex(self._schema(gen), redis_client=self._r)
            if await index.exists():
                await index.delete(drop=delete_documents)
            if delete_documents:
                batch: list[Any] = []
                async for key in self._r.scan_iter(match=key_root(self._cfg.name, gen) + "*", count=1000):
                    batch.append(key)
                    if len(batch) >= 500:
                        await self._r.unlink(*batch)
                        batch = []
                if batch:
                    await self._r.unlink(*batch)
                if self.pinned is None:
                    # Dropping what this process follows is a reset: the next ensure() starts over.
                    await self._r.delete(self.registry.key)
        self._state = None

    async def ping(self) -> None:
        """Raise BackendUnavailable unless Redis answers."""
        async with translate_errors("ping"):
            await self._r.ping()

    async def versions(self, doc_ids: Sequence[str], tenant: str = DEFAULT_TENANT) -> dict[str, int]:
        """Last applied version of each doc that has one."""
        if not doc_ids:
            return {}
        gen = await self._generation()
        async with translate_errors("version read"):
            values = await self._r.mget([self._ver_key(gen, tenant, d) for d in doc_ids])
        return {d: int(v) for d, v in zip(doc_ids, values, strict=True) if v is not None}

    async def apply(
        self,
        doc_id: str,
        version: int | None,
        chunks: Sequence[ChunkRecord],
        vectors: np.ndarray,
        tenant: str = DEFAULT_TENANT,
        analyses: Sequence[Analysis] | None = None,
        version_ttl_s: int | None = None,
    ) -> ApplyResult:
        """Replace every chunk of ``doc_id`` with ``chunks`` (none = delete), atomically.

        ``analyses`` (from :func:`analyze`, one per chunk) saves computing them here.
        ``version_ttl_s``: the stored version expires (a removed community's tombstone only
        has late writers of the last minutes to fence off; a document's is kept for good).

        With a ``version``, applies only when it is above the stored one and then stores it;
        the check and the write form one optimistic transaction (WATCH), so two daemons
        racing through a rebalance cannot interleave. ``version=None`` always applies.

        Raises:
            BackendUnavailable: Redis is unreachable.
            IndexError_: the transaction kept conflicting.
        """
        if analyses is None:
            analyses = analyze_records(chunks)
        elif len(analyses) != len(chunks):
            raise MemdError(f"{len(analyses)} analyses for {len(chunks)} chunks of {doc_id!r}")
        try:
            return await self._apply(doc_id, version, chunks, vectors, tenant, analyses, version_ttl_s)
        except _NoGeneration:
            if not self._recreate:
                raise
            await self._recover()
            return await self._apply(doc_id, version, chunks, vectors, tenant, analyses, version_ttl_s)

    async def _apply(
        self,
        doc_id: str,
        version: int | None,
        chunks: Sequence[ChunkRecord],
        vectors: np.ndarray,
        tenant: str,
        analyses: Sequence[Analysis],
        version_ttl_s: int | None = None,
    ) -> ApplyResult:
        rows = zip(chunks, vectors, analyses, strict=True)
        if len(chunks) <= _INLINE_MAPPINGS:
            mappings = [_record_mapping(*row) for row in rows]
        else:
            # Pure Python per chunk: a large doc's hashes, built on the event loop, stalled
            # queries (with the rest of its write, ~0.3 s for 1,200 chunks, measured).
            mappings = await asyncio.to_thread(lambda: [_record_mapping(*row) for row in rows])
        async with translate_errors("chunk write"):
            for _ in range(_WATCH_RETRIES):
                async with self._r.pipeline(transaction=True) as pipe:
                    try:
                        seen = await self._watch_doc(pipe, tenant, doc_id, version)
                        if isinstance(seen, ApplyResult):
                            return seen
                        gen, stored_version, marker, old_ids = seen
                        ver_key, doc_key = self._ver_key(gen, tenant, doc_id), self._doc_key(gen, tenant, doc_id)
                        marker_key = self._marker_key(gen, tenant, doc_id)
                        new_ids = {c.chunk_id for c in chunks}
                        if version is not None and len(chunks) + len(old_ids - new_ids) > self._cfg.write_slice_chunks:
                            break  # too large for one transaction: see memory.visibility
                        pipe.multi()  # type: ignore[no-untyped-call]
                        stale = [self._chunk_key(gen, tenant, c) for c in old_ids - new_ids]
                        if stale:
                            pipe.delete(*stale)
                        pipe.delete(doc_key)
                        for rec, mapping in zip(chunks, mappings, strict=True):
                            key = self._chunk_key(gen, tenant, rec.chunk_id)
                            # Replace, not merge: a tag dropped by an edit must not linger.
                            pipe.delete(key)
                            pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]
                        if new_ids:
                            pipe.sadd(doc_key, *sorted(new_ids))
                        if version is not None:
                            pipe.set(ver_key, version, ex=version_ttl_s)
                        elif not chunks and stored_version is None:
                            # An unversioned delete (a forgotten transcript turn) leaves a
                            # tombstone at version 0, as a document's delete leaves its
                            # version: a reindex must tell "forgotten" from "never had it",
                            # or it would carry the turn back over from the old generation.
                            pipe.set(ver_key, UNVERSIONED_TOMBSTONE)
                        if marker is not None:
                            # Queries filter this doc's hits by its marker: it must show this
                            # version now. An unfinished sliced writer finds its token gone
                            # and stops.
                            if version is None:
                                pipe.delete(marker_key)
                            else:
                                _mark_finished(pipe, marker_key, version)
                        await pipe.execute()
                        return ApplyResult(doc_id, applied=True, chunks=len(chunks), stored_version=version)
                    except rexc.WatchError:
                        continue
            else:
                raise IndexError_(f"write of {doc_id!r} kept conflicting; giving up after {_WATCH_RETRIES} tries")
            assert version is not None
            return await self._apply_sliced(doc_id, version, chunks, mappings, tenant, version_ttl_s)

    async def _apply_sliced(
        self,
        doc_id: str,
        version: int,
        chunks: Sequence[ChunkRecord],
        mappings: Sequence[dict[str, Any]],
        tenant: str,
        version_ttl_s: int | None,
    ) -> ApplyResult:
        """Write a large doc in transactions of ``write_slice_chunks`` (see memory.visibility).

        A marker taken in one transaction first hides what is about to change. Each slice
        then overwrites chunks in place and adds their ids to the doc's chunk set, which stays
        a superset of its chunk keys throughout, so a write that dies half-way orphans nothing
        (its redelivery takes the marker over and deletes what the new version lacks). Old
        chunks the new version lacks go next, and one last transaction stores the version,
        the exact chunk set and the finished marker. Every step checks, in its transaction,
        that the marker still holds this write's token and the generation is unchanged, and
        records progress. When another write took the doc over (a newer version, a reindex's
        copy, a redelivery that found this one stalled), this one begins again, which settles
        it (see ``_begin_sliced``); a generation switch starts it again in the new generation.
        """
        token = uuid.uuid4().hex
        for _ in range(_WATCH_RETRIES):
            try:
                begun = await self._begin_sliced(doc_id, version, tenant, token, deleting=not chunks)
                if isinstance(begun, ApplyResult):
                    return begun
                gen, old_ids = begun
                return await self._write_slices(
                    gen, old_ids, doc_id, version, chunks, mappings, tenant, token, version_ttl_s
                )
            except _GenerationSwitched:
                log.info("index.sliced_write_restarted", doc_id=doc_id, version=version, reason="generation switched")
                SLICED_WRITES.labels("restarted").inc()
                continue
            except _Superseded:
                # Begin again, which looks at what took over: this version or a later one
                # stored (not applied), a later one being written (skipped), this one being
                # written by another live process (WriteInProgress, retried later), or an
                # older copy (a reindex's) that this write must still replace.
                log.info("index.sliced_write_superseded", doc_id=doc_id, version=version)
                SLICED_WRITES.labels("superseded").inc()
                continue
        raise _unfinished(doc_id, "kept restarting")

    async def _write_slices(
        self,
        gen: int,
        old_ids: set[str],
        doc_id: str,
        version: int,
        chunks: Sequence[ChunkRecord],
        mappings: Sequence[dict[str, Any]],
        tenant: str,
        token: str,
        version_ttl_s: int | None,
    ) -> ApplyResult:
        """The slices, the deletions and the flip of one sliced write, begun in ``gen``."""
        started = time.monotonic()
        size = self._cfg.write_slice_chunks
        doc_key = self._doc_key(gen, tenant, doc_id)
        writes = slices(len(chunks), size)
        for part in writes:

            def write(pipe: Any, _members: set[str], part: range = part) -> None:
                for i in part:
                    key = self._chunk_key(gen, tenant, chunks[i].chunk_id)
                    pipe.delete(key)
                    pipe.hset(key, mapping=mappings[i])
                pipe.sadd(doc_key, *(chunks[i].chunk_id for i in part))

            await self._guarded(gen, tenant, doc_id, token, write)
        new_ids = {c.chunk_id for c in chunks}
        # The chunk set as it is now, not as begin read it: it also holds what a write this
        # one took over had added.
        async with translate_errors("chunk listing"):
            current = {as_str(m) for m in await self._r.smembers(doc_key)}
        stale = sorted((old_ids | current) - new_ids)
        drops = slices(len(stale), size)
        for part in drops:

            def drop(pipe: Any, _members: set[str], ids: list[str] = stale[part.start : part.stop]) -> None:
                pipe.delete(*(self._chunk_key(gen, tenant, c) for c in ids))
                pipe.srem(doc_key, *ids)

            await self._guarded(gen, tenant, doc_id, token, drop)

        def finish(pipe: Any, members: set[str]) -> None:
            # Read in this transaction (watched): nothing added since is left orphaned.
            leftover = members - new_ids
            if leftover:
                pipe.delete(*(self._chunk_key(gen, tenant, c) for c in leftover))
            pipe.delete(doc_key)
            if new_ids:
                pipe.sadd(doc_key, *sorted(new_ids))
            pipe.set(self._ver_key(gen, tenant, doc_id), version, ex=version_ttl_s)
            _mark_finished(pipe, self._marker_key(gen, tenant, doc_id), version)

        await self._guarded(gen, tenant, doc_id, token, finish, members=True)
        SLICED_WRITES.labels("finished").inc()
        log.info(
            "index.sliced_write",
            doc_id=doc_id,
            version=version,
            chunks=len(chunks),
            deleted=len(stale),
            transactions=len(writes) + len(drops) + 2,
            took_s=round(time.monotonic() - started, 3),
        )
        return ApplyResult(doc_id, applied=True, chunks=len(chunks), stored_version=version)

    async def _watch_doc(
        self, pipe: Any, tenant: str, doc_id: str, version: int | None
    ) -> tuple[int, int | None, WriteMarker | None, set[str]] | ApplyResult:
        """Inside a WATCH transaction, before any write of a doc: watch its version, chunk set
        and write marker, and read them: the generation, the stored version, the marker and
        the chunk ids; or the result when this version is not to be written (this version or
        a later one is stored, or a later one is being written in slices).

        Raises:
            WriteInProgress: another live process is writing this very version in slices.
        """
        gen = await self._write_generation(pipe)
        ver_key, doc_key = self._ver_key(gen, tenant, doc_id), self._doc_key(gen, tenant, doc_id)
        marker_key = self._marker_key(gen, tenant, doc_id)
        await pipe.watch(ver_key, doc_key, marker_key)
        stored, marker_raw = await pipe.mget(ver_key, marker_key)
        stored_version = int(stored) if stored is not None else None
        if version is not None and stored_version is not None and version <= stored_version:
            return ApplyResult(doc_id, applied=False, stored_version=stored_version)
        marker = WriteMarker.decode(marker_raw)
        if await self._decide(doc_id, version, marker) == "skip":
            return ApplyResult(doc_id, applied=False, stored_version=stored_version)
        return gen, stored_version, marker, {as_str(m) for m in await pipe.smembers(doc_key)}

    async def _decide(self, doc_id: str, version: int | None, marker: WriteMarker | None) -> str:
        """``write`` or ``skip`` (see memory.visibility.decide); ``wait`` is raised.

        Raises:
            WriteInProgress: another live process is writing this version in slices.
        """
        if marker is None or not marker.in_progress or version is None:
            return "write"
        now = await _redis_now(self._r)
        decision = decide(version, marker, owner=self._owner, now=now)
        if decision == "wait":
            SLICED_WRITES.labels("waited").inc()
            raise WriteInProgress(
                f"version {version} of {doc_id!r} is being written in slices by another process "
                f"(progress {now - marker.beat:.0f}s ago): waiting for it to finish"
            )
        return decision

    async def _begin_sliced(
        self, doc_id: str, version: int, tenant: str, token: str, *, deleting: bool
    ) -> tuple[int, set[str]] | ApplyResult:
        """Take the doc's marker for a sliced write: its generation and current chunk ids,
        or the result when this version is not to be written (this version or a later one is
        stored, or a later one is being written).

        Raises:
            WriteInProgress: another live process is writing this very version.
        """
        async with translate_errors("chunk write"):
            for _ in range(_WATCH_RETRIES):
                async with self._r.pipeline(transaction=True) as pipe:
                    try:
                        seen = await self._watch_doc(pipe, tenant, doc_id, version)
                        if isinstance(seen, ApplyResult):
                            return seen
                        gen, stored_version, marker, old_ids = seen
                        marker_key = self._marker_key(gen, tenant, doc_id)
                        # Queries go on seeing what they saw: an unfinished write's shown
                        # version (its slices already hid the rest), else the stored one;
                        # nothing of a doc being deleted.
                        if deleting or not old_ids:
                            shown = None
                        elif marker is not None and marker.in_progress:
                            shown = marker.shown
                        else:
                            shown = stored_version
                        now = await _redis_now(self._r)
                        began = WriteMarker(shown, version, token=token, owner=self._owner, since=now, beat=now)
                        pipe.multi()  # type: ignore[no-untyped-call]
                        # No expiry: a writer that dies leaves the doc hidden until its
                        # event's redelivery (or a later version) writes it again.
                        pipe.set(marker_key, began.encode())
                        await pipe.execute()
                        return gen, old_ids
                    except rexc.WatchError:
                        continue
        raise IndexError_(f"write of {doc_id!r} kept conflicting; giving up after {_WATCH_RETRIES} tries")

    async def _guarded(
        self,
        gen: int,
        tenant: str,
        doc_id: str,
        token: str,
        fill: Callable[[Any, set[str]], None],
        *,
        members: bool = False,
    ) -> None:
        """One transaction of a sliced write, run only while its marker holds ``token`` in
        generation ``gen``; it also records progress in the marker. ``members``: the doc's
        chunk set is watched and read, and handed to ``fill`` (else an empty set).

        Raises:
            _Superseded: another write took the doc over.
            _GenerationSwitched: ``gen`` is no longer the one written to.
        """
        marker_key = self._marker_key(gen, tenant, doc_id)
        doc_key = self._doc_key(gen, tenant, doc_id)
        async with translate_errors("chunk write"):
            for _ in range(_WATCH_RETRIES):
                async with self._r.pipeline(transaction=True) as pipe:
                    try:
                        if await self._write_generation(pipe) != gen:
                            raise _GenerationSwitched
                        await pipe.watch(marker_key, *([doc_key] if members else []))
                        marker = WriteMarker.decode(await pipe.get(marker_key))
                        if marker is None or marker.token != token:
                            raise _Superseded
                        found = {as_str(m) for m in await pipe.smembers(doc_key)} if members else set()
                        beat = await _redis_now(self._r)
                        pipe.multi()  # type: ignore[no-untyped-call]
                        pipe.set(marker_key, dataclasses.replace(marker, beat=beat).encode())
                        fill(pipe, found)
                        await pipe.execute()
                        return
                    except rexc.WatchError:
                        continue
        raise _unfinished(doc_id, "kept conflicting")

    async def unfinished_writes(self) -> dict[tuple[str, str], WriteMarker]:
        """Every sliced write under way, or left half-way by a writer that died:
        ``(tenant, doc_id)`` -> its marker. A scan: for doctor, not for the hot path."""
        gen = await self._generation()
        prefix = f"{key_root(self._cfg.name, gen)}wr:"
        found: dict[tuple[str, str], WriteMarker] = {}
        async with translate_errors("marker listing"):
            async for raw in self._r.scan_iter(match=prefix + "*", count=1000):
                key = as_str(raw)
                marker = WriteMarker.decode(await self._r.get(key))
                if marker is not None and marker.in_progress:
                    tenant, _, doc_id = key[len(prefix) :].partition(":")
                    found[(tenant, doc_id)] = marker
        return found

    async def write_markers(self, docs: Sequence[tuple[int, str, str]]) -> dict[tuple[int, str, str], WriteMarker]:
        """The write markers (``memory.visibility``) of those of these ``(generation, tenant,
        doc_id)`` that have one.

        Searches read them after their legs, in the generation each hit came from (a hit's
        key says it: the alias may have moved to another generation since the last read of
        the registry), to drop hits a sliced write has hidden.
        """
        if not docs:
            return {}
        async with translate_errors("marker read"):
            values = await self._r.mget([self._marker_key(g, t, d) for g, t, d in docs])
        return {k: m for k, v in zip(docs, values, strict=True) if (m := WriteMarker.decode(v)) is not None}

    async def writes_in_progress(self, doc_ids: Sequence[str], tenant: str = DEFAULT_TENANT) -> set[str]:
        """Those of these docs a sliced write is under way on (or was left half-way)."""
        gen = await self._generation()
        found = await self.write_markers([(gen, tenant, d) for d in doc_ids])
        return {d for (_, _, d), m in found.items() if m.in_progress}

    async def _write_generation(self, pipe: Any) -> int:
        """Inside a WATCH transaction: the generation to write to, with the registry watched.

        Watching the registry is what makes the reindex switch safe: a write that read the
        old generation and has not executed yet fails and retries against the new one.
        """
        if self.pinned is not None:
            return self.pinned
        await pipe.watch(self.registry.key)
        state = await self.registry.state(pipe)
        self._state, self._state_at = state, time.monotonic()
        if state.active == 0:
            raise self._no_generation()
        if why := self._mismatch(state):
            raise IndexMismatch(why)
        return state.active

    async def chunk_ids(self, doc_id: str, tenant: str = DEFAULT_TENANT) -> set[str]:
        """The chunk ids currently stored for a doc."""
        gen = await self._generation()
        async with translate_errors("chunk listing"):
            return {as_str(m) for m in await self._r.smembers(self._doc_key(gen, tenant, doc_id))}

    async def texts(self, chunk_ids: Sequence[str], tenant: str = DEFAULT_TENANT) -> dict[str, str]:
        """Stored text of each chunk that exists."""
        gen = await self._generation()
        async with translate_errors("chunk read"), self._r.pipeline(transaction=False) as pipe:
            for cid in chunk_ids:
                pipe.hget(self._chunk_key(gen, tenant, cid), "text")
            values = await pipe.execute()
        return {c: as_str(v) for c, v in zip(chunk_ids, values, strict=True) if v is not None}

    async def turn_texts(self, doc_ids: Sequence[str], tenant: str = DEFAULT_TENANT) -> dict[str, str]:
        """The first chunk's text of each doc that is stored (what a turn's neighbours read)."""
        if not doc_ids:
            return {}
        gen = await self._generation()
        async with translate_errors("turn read"), self._r.pipeline(transaction=False) as pipe:
            for d in doc_ids:
                pipe.hget(self._chunk_key(gen, tenant, chunk_id(d, 0)), "text")
            values = await pipe.execute()
        return {d: as_str(v) for d, v in zip(doc_ids, values, strict=True) if v is not None}

    async def turn_entries(self, doc_ids: Sequence[str], tenant: str = DEFAULT_TENANT) -> dict[str, list[TurnEntry]]:
        """Each stored doc's chunks in position order, with the text and context they were indexed with."""
        if not doc_ids:
            return {}
        gen = await self._generation()
        async with translate_errors("turn read"):
            async with self._r.pipeline(transaction=False) as pipe:
                for d in doc_ids:
                    pipe.smembers(self._doc_key(gen, tenant, d))
                members = await pipe.execute()
            ids = {
                d: sorted((as_str(m) for m in ms), key=chunk_position) for d, ms in zip(doc_ids, members, strict=True)
            }
            async with self._r.pipeline(transaction=False) as pipe:
                for d in doc_ids:
                    for cid in ids[d]:
                        pipe.hmget(self._chunk_key(gen, tenant, cid), ["text", "context", "context_vec", "kind", "ts"])
                rows = iter(await pipe.execute())
        out: dict[str, list[TurnEntry]] = {}
        for d in doc_ids:
            entries = []
            for cid in ids[d]:
                text, context, context_vec, kind, ts = next(rows)
                if text is not None:
                    entries.append(
                        TurnEntry(
                            cid,
                            as_str(text),
                            _text(context),
                            _text(context_vec),
                            _text(kind),
                            _float_or_none(ts) or 0.0,
                        )
                    )
            if entries:
                out[d] = entries
        return out

    async def turns(self, doc_ids: Sequence[str], tenant: str = DEFAULT_TENANT) -> dict[str, list[StoredChunk]]:
        """Each stored doc's chunks in position order, as a search leg returns them (for the
        turns around a hit: unversioned, so no write marker applies)."""
        if not doc_ids:
            return {}
        gen = await self._generation()
        async with translate_errors("turn read"):
            async with self._r.pipeline(transaction=False) as pipe:
                for d in doc_ids:
                    pipe.smembers(self._doc_key(gen, tenant, d))
                members = await pipe.execute()
            keys = {
                d: [self._chunk_key(gen, tenant, c) for c in sorted((as_str(m) for m in ms), key=chunk_position)]
                for d, ms in zip(doc_ids, members, strict=True)
            }
            async with self._r.pipeline(transaction=False) as pipe:
                for d in doc_ids:
                    for key in keys[d]:
                        pipe.hmget(key, list(self._fields))
                rows = iter(await pipe.execute())
        out: dict[str, list[StoredChunk]] = {}
        for d in doc_ids:
            found = []
            for key in keys[d]:
                values = next(rows)
                if values[0] is not None:
                    doc = types.SimpleNamespace(id=key, **dict(zip(self._fields, values, strict=True)))
                    found.append(_stored(doc, self._tag_keys))
            if found:
                out[d] = found
        return out

    async def recontext(
        self,
        doc_id: str,
        updates: Sequence[tuple[TurnEntry, str, str, np.ndarray | None]],
        tenant: str = DEFAULT_TENANT,
    ) -> bool:
        """Re-index a turn's chunks with a new context (and vector, where given), atomically, only
        if the doc still has exactly these chunks with these texts and contexts (False if not:
        whoever changed it indexed it with its own context)."""
        async with translate_errors("context write"):
            for _ in range(_WATCH_RETRIES):
                async with self._r.pipeline(transaction=True) as pipe:
                    try:
                        gen = await self._write_generation(pipe)
                        doc_key = self._doc_key(gen, tenant, doc_id)
                        keys = [self._chunk_key(gen, tenant, u[0].chunk_id) for u in updates]
                        await pipe.watch(doc_key, *keys)
                        members = {as_str(m) for m in await pipe.smembers(doc_key)}
                        if members != {u[0].chunk_id for u in updates}:
                            return False
                        for key, (entry, _, _, _) in zip(keys, updates, strict=True):
                            text, context, context_vec = await pipe.hmget(key, ["text", "context", "context_vec"])
                            if text is None or (as_str(text), _text(context), _text(context_vec)) != (
                                entry.text,
                                entry.context,
                                entry.context_vec,
                            ):
                                return False
                        pipe.multi()  # type: ignore[no-untyped-call]
                        for key, (entry, context, context_vec, vector) in zip(keys, updates, strict=True):
                            fields: dict[str, Any] = {
                                "context": context,
                                "context_vec": context_vec,
                                "terms": turn_terms(entry.text, context, entry.timestamp),
                            }
                            if vector is not None:
                                fields["vector"] = np.asarray(vector, dtype=np.float32).tobytes()
                            pipe.hset(key, mapping=fields)  # type: ignore[arg-type]
                        await pipe.execute()
                        return True
                    except rexc.WatchError:
                        continue
        raise IndexError_(f"context write of {doc_id!r} kept conflicting; giving up after {_WATCH_RETRIES} tries")

    async def count(self) -> int:
        """Number of indexed chunks."""
        async with translate_errors("index info"):
            info = await self._ft().info()
        return int(info.get("num_docs", 0))

    async def doc_versions(self) -> dict[tuple[str, str], DocState]:
        """Every doc this generation holds chunks or a version (tombstone) of:
        ``(tenant, doc_id)`` -> its version (None: unversioned) and whether it has chunks.

        A scan of the generation's keys: for a reindex's checks, not for the hot path.
        """
        gen = await self._generation()
        root = key_root(self._cfg.name, gen)
        found: dict[tuple[str, str], list[Any]] = {}
        async with translate_errors("doc listing"):
            for kind in ("doc", "ver"):
                prefix = f"{root}{kind}:"
                async for raw in self._r.scan_iter(match=prefix + "*", count=1000):
                    tenant, _, doc_id = as_str(raw)[len(prefix) :].partition(":")
                    entry = found.setdefault((tenant, doc_id), [None, False])
                    if kind == "doc":
                        entry[1] = True
            keys = list(found)
            for start in range(0, len(keys), 1000):
                part = keys[start : start + 1000]
                values = await self._r.mget([self._ver_key(gen, t, d) for t, d in part])
                for key, value in zip(part, values, strict=True):
                    found[key][0] = int(value) if value is not None else None
        return {k: DocState(version=v, has_chunks=c) for k, (v, c) in found.items()}

    async def behind(self, held: dict[tuple[str, str], DocState]) -> list[tuple[str, str]]:
        """The docs of ``held`` (another generation's served docs) this generation does not
        cover: it has neither their version or a later one (a later delete counts), nor, for
        an unversioned doc, any chunks or a tombstone (the doc was forgotten here; the old
        generation's live daemons forget it too when they reach that event)."""
        gen = await self._generation()
        keys = sorted(held)
        out: list[tuple[str, str]] = []
        async with translate_errors("coverage check"):
            now = await _redis_now(self._r)
            for start in range(0, len(keys), 500):
                part = keys[start : start + 500]
                async with self._r.pipeline(transaction=False) as pipe:
                    for t, d in part:
                        pipe.get(self._ver_key(gen, t, d))
                        pipe.exists(self._doc_key(gen, t, d))
                        pipe.get(self._marker_key(gen, t, d))
                    values = await pipe.execute()
                for i, key in enumerate(part):
                    ver, has_doc, marker = values[3 * i], bool(values[3 * i + 1]), WriteMarker.decode(values[3 * i + 2])
                    want = held[key].version
                    covered = (has_doc or ver is not None) if want is None else ver is not None and int(ver) >= want
                    # A live sliced write of that version or a later one under way here covers
                    # it too (its event is committed only once it is whole). A dead or copied
                    # one does not: the copy must overwrite it.
                    writing = marker.writing if marker is not None else None
                    covered = covered or (
                        want is not None and writing is not None and writing >= want and live(marker, now)
                    )
                    if not covered:
                        out.append(key)
        return out

    async def copy_doc(self, source_generation: int, tenant: str, doc_id: str, *, reanalyze: bool = False) -> bool:
        """Copy a doc's chunks (hashes verbatim, vectors included) and version from another
        generation built with the same spec into this one's, unless this one already has
        that version or a later one. True if copied.

        Why verbatim: a reindex must keep docs whose events Kafka no longer holds (past
        retention, an in-memory broker restarted); with an unchanged spec their stored
        chunks are exactly what a replay would have written.

        ``reanalyze``: the source was built with the same model, chunking and schema but an
        older text analysis. The chunk texts and vectors are still what a replay would
        write; the ``terms`` and ``idents`` fields are computed again from each stored text.
        """
        gen = await self._generation()
        src_ver_key = self._ver_key(source_generation, tenant, doc_id)
        src_doc = self._doc_key(source_generation, tenant, doc_id)
        src_marker_key = self._marker_key(source_generation, tenant, doc_id)
        async with translate_errors("doc copy"):
            for _ in range(_WATCH_RETRIES):
                async with self._r.pipeline(transaction=True) as pipe:
                    try:
                        ver_key, doc_key = self._ver_key(gen, tenant, doc_id), self._doc_key(gen, tenant, doc_id)
                        marker_key = self._marker_key(gen, tenant, doc_id)
                        # The source is watched too: a live write to it between these reads
                        # (before a switch, daemons still write there) retries the copy, so
                        # chunks and version are never copied from two different writes.
                        await pipe.watch(src_ver_key, src_doc, src_marker_key, ver_key, doc_key, marker_key)
                        src_ver = await pipe.get(src_ver_key)
                        src_marker = WriteMarker.decode(await pipe.get(src_marker_key))
                        marker = WriteMarker.decode(await pipe.get(marker_key))
                        if (
                            marker is not None
                            and marker.writing is not None
                            and (src_ver is None or marker.writing >= int(src_ver))
                            and live(marker, await _redis_now(self._r))
                        ):
                            # A live sliced write of that version or a later one is under way
                            # here: it replaces whatever the copy would bring (and copying
                            # would stop it). A dead or copied one is overwritten.
                            return False
                        chunk_ids = sorted(as_str(m) for m in await pipe.smembers(src_doc))
                        hashes = [await pipe.hgetall(self._chunk_key(source_generation, tenant, c)) for c in chunk_ids]
                        if reanalyze:
                            hashes = [_reanalyzed(h) for h in hashes]
                        stored = await pipe.get(ver_key)
                        if src_ver is not None and stored is not None and int(stored) >= int(src_ver):
                            return False
                        if src_ver is None and (stored is not None or await pipe.exists(doc_key)):
                            return False  # unversioned: whatever the target holds (or forgot) is as new
                        old_ids = {as_str(m) for m in await pipe.smembers(doc_key)}
                        pipe.multi()  # type: ignore[no-untyped-call]
                        stale = [self._chunk_key(gen, tenant, c) for c in old_ids - set(chunk_ids)]
                        if stale:
                            pipe.delete(*stale)
                        pipe.delete(doc_key)
                        for cid, mapping in zip(chunk_ids, hashes, strict=True):
                            if mapping:
                                key = self._chunk_key(gen, tenant, cid)
                                pipe.delete(key)
                                pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]
                        if chunk_ids:
                            pipe.sadd(doc_key, *chunk_ids)
                        if src_ver is not None:
                            pipe.set(ver_key, src_ver)
                        if src_marker is not None and src_marker.in_progress:
                            # A sliced write was half-way through the source: the copy hides
                            # what the source hides. Nobody holds the copy's marker (a new
                            # token, no owner, no recent progress): that write, started again
                            # here after a switch, or its redelivery, takes it over at once.
                            copied = WriteMarker(
                                src_marker.shown, src_marker.writing, token=uuid.uuid4().hex, since=src_marker.since
                            )
                            pipe.set(marker_key, copied.encode())
                        else:
                            # A whole copy, written at once: nothing to hide. A sliced write
                            # under way here (a reindex's replay) finds its token gone.
                            pipe.delete(marker_key)
                        await pipe.execute()
                        return True
                    except rexc.WatchError:
                        continue
        raise IndexError_(f"copy of {doc_id!r} kept conflicting; giving up after {_WATCH_RETRIES} tries")

    async def _bulk_pages(self, query: str, fields: Sequence[str], what: str, page: int) -> AsyncIterator[Any]:
        """Every hit of ``query``, page by page in timestamp order (a bulk listing).

        Not an asker's query: deep pages of a big index may outlive the search timeout,
        which now fails the query (ON_TIMEOUT FAIL) instead of cutting it.
        """
        offset = 0
        while True:
            q = (
                Query(query)
                .paging(offset, page)
                .return_fields(*fields)
                .sort_by("timestamp")
                .timeout(BULK_QUERY_TIMEOUT_MS)
                .dialect(2)
            )
            async with translate_errors(what):
                res = await self._ft().search(q)
            for doc in res.docs:
                yield doc
            offset += len(res.docs)
            if len(res.docs) < page:
                return

    async def community_records(self, *, since: float = 0.0, page: int = 500) -> list[ChunkRecord]:
        """Every community-summary chunk of this index (written at or after ``since``).

        Summaries come from the graph, not from Kafka, so a reindex carries them over from
        the old generation instead of replaying them.
        """
        out: list[ChunkRecord] = []
        fields = tuple(dict.fromkeys((*self._fields, "position", "version", "timestamp")))
        query = f"@kind:{{community}} @timestamp:[{since!r} +inf]"
        async for doc in self._bulk_pages(query, fields, "community listing", page):
            stored = _stored(doc, self._tag_keys)
            tags = dict(stored.tags)
            tenant = tags.pop("tenant", DEFAULT_TENANT)
            out.append(
                ChunkRecord(
                    chunk_id=stored.chunk_id,
                    doc_id=stored.doc_id,
                    position=int(as_str(getattr(doc, "position", "0"))),
                    text=stored.text,
                    kind="community",
                    source=stored.source,
                    tags=tags,
                    metadata=stored.metadata,
                    version=int(float(as_str(getattr(doc, "version", "0")))),
                    timestamp=stored.timestamp or 0.0,
                    tenant=tenant,
                )
            )
        return out

    async def doc_ids_where(self, tenant: str, tags: dict[str, str], *, page: int = 1000) -> set[str]:
        """Ids of the docs of ``tenant`` with a chunk whose tags equal ``tags`` (a forget's listing).

        Filtered on the hashed NUMERIC fields, which match any value exactly (a TAG query
        cannot hold some characters), and re-checked against the stored tags (a hash may
        collide).
        """
        want = {**tags, "tenant": tenant}
        query = hash_clause({k: [v] for k, v in want.items()})
        fields = tuple(dict.fromkeys(("doc_id", "timestamp", *want)))
        found: set[str] = set()
        # Listed again until a pass finds nothing new: the listing pages by offset, and chunks
        # deleted meanwhile (another daemon forgetting one of these sessions) move later ones
        # up past a page boundary, unseen (found by a review: 5 of 1,005 turns survived an
        # agent-wide forget). Bounded: new matching turns could keep arriving. Not an
        # FT.AGGREGATE cursor: RediSearch ends a paused cursor early, without an error, when
        # writes meanwhile changed a numeric tree it reads (measured: 1,000 of 3,000 hits, with
        # 20,000 numeric values written between two reads), and every pass would stop there.
        for _ in range(_LISTING_PASSES):
            before = len(found)
            found |= {
                as_str(getattr(doc, "doc_id", ""))
                async for doc in self._bulk_pages(query, fields, "doc listing", page)
                if all(as_str(getattr(doc, k, "")) == v for k, v in want.items())
            }
            if len(found) == before:
                break
        return found

    async def search_text(self, query: str, *, k: int) -> list[StoredChunk]:
        """A BM25 leg: ``query`` is a full, already-escaped RediSearch query over analyzed terms.

        ``VERBATIM``: the terms were analyzed by ``memory.text`` (or are identifiers) and
        the fields are NOSTEM, so RediSearch must not expand them with its own stemmer.
        """
        q = Query(query).scorer("BM25STD").verbatim().paging(0, k).return_fields(*self._fields).dialect(2)
        # The terms were analyzed by this process's analyzer: meaningless to an index built
        # with another one (a request with dense_weight 0 runs only these legs).
        await self._refuse_mismatch()
        async with translate_errors("text search"):
            res = await self._ft().search(q)
        return [_stored(d, self._tag_keys) for d in res.docs]

    async def search_vector(self, vector: np.ndarray, *, filter_query: str, k: int) -> list[StoredChunk]:
        """The HNSW leg: KNN ``k`` within ``filter_query`` (applied inside the engine)."""
        base = filter_query if filter_query == "*" else f"({filter_query})"
        q = (
            Query(f"{base}=>[KNN {k} @vector $vec EF_RUNTIME $ef AS vector_distance]")
            .sort_by("vector_distance")
            .paging(0, k)
            .return_fields(*self._fields, "vector_distance")
            .dialect(2)
        )
        # The query was embedded with this process's model: meaningless to another's index.
        await self._refuse_mismatch()
        params = {"vec": np.asarray(vector, dtype=np.float32).tobytes(), "ef": max(self._cfg.hnsw_ef_runtime, k)}
        async with translate_errors("vector search"):
            res = await self._ft().search(q, query_params=params)
        return [_stored(d, self._tag_keys) for d in res.docs]
