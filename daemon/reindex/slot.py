"""The build slot: one reindex per index across the deployment, held from its reservation to
its release (``memory.index.GenerationRegistry`` keeps it in the registry).

A reindex reserves the slot (taking over one whose heartbeat stopped, and dropping the
generation that build left half-built), keeps it with a heartbeat, switches through it, and
releases it at the end, first dropping its own build if that never went live. A build that
cannot be dropped keeps the slot: its heartbeat goes stale, and the next reindex drops it as
abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import structlog

from daemon.teardown import bounded, cancelled
from memory.errors import BackendUnavailable, NotFound, ReindexConflict
from memory.generations import GenerationState, IndexSpec
from memory.index import ChunkIndex, GenerationRegistry, translate_errors

log = structlog.get_logger()

HEARTBEAT_S = 10.0
#: Seconds the drop of an unswitched build may take (a scan of the keyspace) before the
#: slot is left to go stale instead.
DROP_TIMEOUT_S = 600.0


class BuildSlot:
    """One reindex's hold on the build slot (see the module docstring)."""

    def __init__(self, registry: GenerationRegistry) -> None:
        self.owner = f"reindex-{uuid.uuid4().hex[:8]}"
        self.generation = 0  # the one being built, from reserve() on
        self._registry = registry
        self._heartbeat: asyncio.Task[None] | None = None
        self._stop_beating = asyncio.Event()
        self._reserved = self._switched = False

    async def reserve(self) -> tuple[GenerationState, int]:
        """Take the slot to build the next generation (:attr:`generation`) of an index that has one.

        Returns:
            The registry's state once the slot is held, and the generation an abandoned build
            left behind (0 if none).

        Raises:
            NotFound: the index has no generation yet.
            ReindexConflict: another reindex holds the slot.
        """
        async with translate_errors("reindex start"):
            state = await self._registry.state()
        if state.active == 0:
            raise NotFound(f"index {self._registry.name!r} has no generation yet: start the daemon once to create it")
        async with translate_errors("reindex reservation"):
            self.generation, abandoned = await self._registry.reserve(self.owner)
        self._reserved = True
        async with translate_errors("reindex start"):  # a reindex may have switched meanwhile
            state = await self._registry.state()
        return state, abandoned

    async def drop_abandoned(self, abandoned: int, build: ChunkIndex) -> None:
        """Drop generation ``abandoned`` (``build``): its index, keys and registry notes."""
        # A reindex that died mid-build left its generation's index and keys behind
        # (one that died after its switch left the active one: that stays).
        log.warning("reindex.abandoned_build_dropped", generation=abandoned)
        with contextlib.suppress(ReindexConflict):  # only its notes: it is neither active nor building
            await self._registry.unregister(abandoned)
        await build.drop()

    def start_heartbeat(self) -> None:
        """Beat every ``HEARTBEAT_S`` until :meth:`release`, so the slot does not go stale while the build works."""
        self._heartbeat = asyncio.create_task(self._beat())

    def check(self) -> None:
        """Raise what ended the heartbeat, if it ended.

        Raises:
            ReindexConflict: the slot was taken over.
        """
        assert self._heartbeat is not None, "start_heartbeat() starts it"
        if self._heartbeat.done():
            self._heartbeat.result()

    async def _beat(self) -> None:
        # The flag as well as the cancellation: a cancellation swallowed somewhere in a
        # client library would otherwise leave this loop beating after the reindex ended.
        while not self._stop_beating.is_set():
            await asyncio.sleep(HEARTBEAT_S)
            if self._stop_beating.is_set():
                return
            try:
                async with translate_errors("reindex heartbeat"):
                    await self._registry.heartbeat(self.owner)
            except BackendUnavailable as exc:
                # A blip must not end the build: the slot only goes stale after
                # STALE_BUILD_S without a beat, and the next beat retries.
                log.warning("reindex.heartbeat_failed", error=str(exc))

    async def switch(self, spec: IndexSpec) -> None:
        """Make the build the active generation, with ``spec``, and move the alias to it (one
        Redis script).

        Raises:
            BackendUnavailable: Redis went away, and the build did not go live.
        """
        try:
            async with translate_errors("reindex switch"):
                await self._registry.switch(self.owner, self.generation, spec)
        except BackendUnavailable:
            # The reply may be what was lost, not the switch: never treat the live
            # generation as an unswitched build (release() would drop it).
            if await self._went_live() is not True:
                raise
        self._switched = True

    async def release(self, build: ChunkIndex | None) -> None:
        """Stop the heartbeat, drop ``build`` unless it was switched to, and give the slot up.

        Each step is bounded: a drop that fails or runs long keeps the slot instead.
        """
        self._stop_beating.set()
        if self._heartbeat is not None:
            await cancelled("reindex heartbeat", self._heartbeat)
        build_left = await self._drop_unswitched(build)
        if self._reserved and not build_left:
            await bounded("release the build slot", self._registry.release(self.owner))

    async def _drop_unswitched(self, build: ChunkIndex | None) -> bool:
        """Leave no trace of a build that was not switched to; returns whether some is left."""
        if self._switched or build is None:
            return False
        # A drop that fails or runs long keeps the slot: its heartbeat goes stale, and the next
        # reindex's reservation reports the build as abandoned and drops it (never the active
        # generation: when it cannot be read whether the build went live after all, the slot
        # is kept too).
        live = await self._went_live()
        if live is None:
            return True
        if live:
            return False
        return not await bounded("drop the unswitched build", build.drop(), seconds=DROP_TIMEOUT_S)

    async def _went_live(self) -> bool | None:
        """Whether the build is the active generation (a switch whose reply was lost); ``None``
        when that cannot be read either."""
        gen = self.generation
        try:
            async with translate_errors("reindex switch check"):
                return (await self._registry.state()).active == gen
        except Exception as exc:
            log.warning("reindex.switch_unconfirmed", generation=gen, error=str(exc))
            return None
