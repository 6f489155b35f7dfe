"""An index's life and the generation it follows: creation, adoption, recovery, drop.

Following (the default), reads and writes go to the active generation of the registry
(``memory.generations``) and searches through the alias; pinned, to one generation.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

import redis.asyncio as aredis
import structlog
from redisvl.exceptions import RedisVLError
from redisvl.index import AsyncSearchIndex
from redisvl.schema import IndexSchema

from memory import keys
from memory.config import ChunkingConfig, IndexConfig
from memory.errors import IndexMismatch, MemdError, NotFound, WritesHeld
from memory.generations import GenerationState, IndexSpec, index_spec
from memory.index.batching import CommandBatcher
from memory.index.codec import _RETURN_FIELDS
from memory.index.errors import IndexError_, _NoGeneration, translate_errors
from memory.index.marker_list import MarkerList
from memory.index.registry import GenerationRegistry
from memory.schema import compare_schema, filter_keys_of, index_schema, info_attributes, info_index_name
from memory.server_policies import writes_per_chunk

log = structlog.get_logger()

_WATCH_RETRIES = 16

#: How the reason a process may not use the index begins (``IndexMismatch``'s message), which
#: doctor finds in the summaries that failed for it.
REFUSED_INDEX = "the active index generation"


async def redis_now(conn: Any) -> float:
    """Redis's clock (epoch seconds): write markers and the reindex's heartbeats are stamped
    and judged by it, so that no two hosts' clocks have to agree. (Asked on its own
    connection: a watched pipeline buffers TIME instead of sending it.)"""
    sec, usec = await conn.time()
    return float(sec) + float(usec) / 1e6


class _Lifecycle:
    """What every part of ``ChunkIndex`` stands on: the client, config, spec, and which
    generation reads and writes go to (and whether this process may use it)."""

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
        self._batch = CommandBatcher(client)
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
        self.marker_list = MarkerList(client, cfg.name)

    @property
    def cfg(self) -> IndexConfig:
        """This index's config."""
        return self._cfg

    def _schema(self, generation: int) -> IndexSchema:
        return IndexSchema.from_dict(index_schema(self._cfg, dims=self._dims, generation=generation))

    # Key names come from memory.keys, the layout's one home.
    def _chunk_key(self, gen: int, tenant: str, chunk_id: str) -> str:
        return keys.chunk_key(self._cfg.name, gen, tenant, chunk_id)

    def _ver_key(self, gen: int, tenant: str, doc_id: str) -> str:
        return keys.ver_key(self._cfg.name, gen, tenant, doc_id)

    def _doc_key(self, gen: int, tenant: str, doc_id: str) -> str:
        return keys.doc_key(self._cfg.name, gen, tenant, doc_id)

    def _writing_key(self) -> str:
        """Where every marker key set is listed (``memory.index.marker_list``): every ``SET``
        of a marker queues an ``SADD`` of its key here in the same transaction."""
        return self.marker_list.key

    def _marker_key(self, gen: int, tenant: str, doc_id: str) -> str:
        """The doc's write marker (``memory.visibility``): only while (or just after) it
        was written in slices."""
        return keys.marker_key(self._cfg.name, gen, tenant, doc_id)

    def _history_key(self, gen: int, tenant: str, doc_id: str) -> str:
        """The doc's earlier versions (``memory.index.history``)."""
        return keys.history_key(self._cfg.name, gen, tenant, doc_id)

    def _search_name(self) -> str:
        return self._cfg.name if self.pinned is None else keys.physical_name(self._cfg.name, self.pinned)

    def _ft(self) -> Any:
        # redis-py builds a new Search object (and its callback table) on every .ft() call:
        # ~5% of a query's event-loop time at 200 q/s. The name is fixed per instance.
        if self._search is None:
            self._search = self._r.ft(self._search_name())
        return self._search

    def _mismatch(self, state: GenerationState) -> str | None:
        if state.spec is None or state.spec.known(self.spec) == self.spec:
            return None
        state = dataclasses.replace(state, spec=state.spec.known(self.spec))
        assert state.spec is not None
        if state.spec.only_analysis_differs(self.spec):
            head = (
                f"{REFUSED_INDEX} {state.active} of {self._cfg.name!r} was analyzed with "
                f"text analysis version {state.spec.analyzer}, this process uses version {self.spec.analyzer}: "
            )
        else:
            head = (
                f"{REFUSED_INDEX} {state.active} of {self._cfg.name!r} was built with "
                f"{state.spec.describe()}, this process has {self.spec.describe()}: "
            )
        return head + state.spec.fix_for(self.spec)

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

    async def refuse_mismatch(self) -> None:
        """Raise ``IndexMismatch`` when this process may not use the active generation: reads
        that search no leg (a lookup, a listing) answer ``unavailable`` as a search does."""
        await self._refuse_mismatch()

    async def mismatch(self) -> str | None:
        """Why this process may not use the active generation, or ``None`` when it may; where
        only the index fields differ, with the filter keys it was built with."""
        if self.pinned is not None:
            return None
        state = await self.state(fresh=True)
        why = self._mismatch(state)
        if why is None or state.spec is None:
            return why
        old = state.spec.known(self.spec)
        if old.same_vectors(self.spec) and old.schema_digest != self.spec.schema_digest:
            keys = await self.built_with_keys(state.active)
            if keys is not None and keys != self._cfg.filter_keys:
                why += f" (its filter keys: {', '.join(keys)}; these settings': {', '.join(self._cfg.filter_keys)})"
        return why

    async def built_with_keys(self, generation: int) -> tuple[str, ...] | None:
        """The filter keys generation ``generation``'s search index was built with (its FT.INFO);
        None if it cannot be read."""
        try:
            async with translate_errors("index info"):
                info = await self._r.ft(keys.physical_name(self._cfg.name, generation)).info()  # type: ignore[no-untyped-call]
        except MemdError:
            return None
        return filter_keys_of(info_attributes(info))

    async def _generation(self) -> int:
        """The generation reads and writes go to (following: the active one)."""
        if self.pinned is not None:
            return self.pinned
        state = await self.state()
        # A reindex may switch any moment: a cached generation could be dropped. This host's
        # clock against Redis's: a skewed one only costs a read, or falls back to the cache.
        if state.build_alive(time.time()):
            state = await self.state(fresh=True)
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
            "index.generation_lost",
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
            await self.marker_list.relist()
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
            log.error("index.spec_mismatched", index=self._cfg.name, reason=why)
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
        gen = keys.generation_of(self._cfg.name, physical)
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
        if not await self._holds_keys(gen):
            # Created empty: every write to it keeps the directory (memory.index.directory).
            await self._r.set(keys.directory_flag(self._cfg.name, gen), 1)
        try:
            await index.create(overwrite=False)
        except RedisVLError as exc:  # another daemon created it a moment ago
            if "already exists" not in str(exc.__cause__ or exc).lower():
                raise
            return False
        log.info("index.generation_created", index=keys.physical_name(self._cfg.name, gen), dims=self._dims)
        return True

    async def _holds_keys(self, gen: int) -> bool:
        """Whether any key of generation ``gen`` exists (a scan: once, when it is created)."""
        async for _ in self._r.scan_iter(match=keys.key_root(self._cfg.name, gen) + "*", count=1000):
            return True
        return False

    async def has_directory(self, gen: int | None = None) -> bool:
        """Whether this generation (``gen``, else the one followed) keeps a whole directory."""
        gen = await self._generation() if gen is None else gen
        async with translate_errors("directory check"):
            return bool(await self._r.exists(keys.directory_flag(self._cfg.name, gen)))

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
                async for key in self._r.scan_iter(match=keys.key_root(self._cfg.name, gen) + "*", count=1000):
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

    async def count(self) -> int:
        """Number of indexed chunks."""
        return (await self.counts())[0]

    async def counts(self) -> tuple[int, float | None]:
        """Number of indexed chunks, and the writes the index has counted per chunk
        (``memory.server_policies.writes_per_chunk``), from one FT.INFO."""
        async with translate_errors("index info"):
            info = await self._ft().info()
        return int(info.get("num_docs", 0)), writes_per_chunk(info)

    async def _write_generation(self, pipe: Any, *, unversioned: bool = False) -> int:
        """Inside a WATCH transaction: the generation to write to, with the registry watched.

        Watching the registry is what makes the reindex switch safe: a write that read the
        old generation and has not executed yet fails and retries against the new one. The
        same goes for a reindex's hold on ``unversioned`` writes.

        Raises:
            WritesHeld: the write is unversioned and a reindex holds such writes.
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
        if unversioned:
            await self._refuse_if_held(state)
        return state.active

    async def _refuse_if_held(self, state: GenerationState) -> None:
        """Raise ``WritesHeld`` if a live reindex holds unversioned writes to the active
        generation (judged by Redis's clock, which the reindex's heartbeats are on)."""
        # Redis's clock is asked only when a hold is recorded: the common write pays nothing.
        if state.hold_recorded and state.unversioned_held(await redis_now(self._r)):
            raise WritesHeld(
                f"a reindex is replaying the last unversioned events (transcript turns) into generation "
                f"{state.active} of {self._cfg.name!r}; their live writes wait for it"
            )

    async def refuse_held_writes(self) -> None:
        """Raise ``WritesHeld`` now if unversioned writes are held (a fresh registry read), so
        that a batch holding some waits before it reads or embeds anything.

        Raises:
            WritesHeld: a live reindex holds them.
            BackendUnavailable: Redis is unreachable.
        """
        if self.pinned is None:
            state = await self.state(fresh=True)
            async with translate_errors("write hold check"):
                await self._refuse_if_held(state)
