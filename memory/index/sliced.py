"""Writes of large docs in slices, under a write marker (the I/O of ``memory.visibility``).

Also the step every write of a doc begins with (``_watch_doc``: watch and read its version,
chunk set and marker) and the marker reads doctor and graph work use.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from redis import exceptions as rexc

from memory import keys
from memory.errors import BackendUnavailable
from memory.index.directory import DocChange, queue_change
from memory.index.errors import IndexError_, WriteInProgress, raise_if_lost, translate_errors
from memory.index.history import Passed, _History
from memory.index.lifecycle import _WATCH_RETRIES, redis_now
from memory.metrics import SLICED_WRITES
from memory.records import DEFAULT_TENANT, ApplyResult, ChunkRecord
from memory.schema import as_str
from memory.visibility import FINISHED_MARKER_TTL_S, WriteMarker, decide, slices

log = structlog.get_logger()


class _GenerationSwitched(Exception):
    """A sliced write's generation stopped being the one written to: write it all again."""


class _Superseded(Exception):
    """A sliced write's marker no longer holds its token: another write took the doc over."""


def set_marker(pipe: Any, writing_key: str, marker_key: str, marker: WriteMarker, *, ex: int | None = None) -> None:
    """Queue ``marker``'s write and the listing of its key in ``writing_key`` (see
    ``keys.writing_key``): a marker that is not listed there is one queries may skip."""
    pipe.set(marker_key, marker.encode(), ex=ex)
    pipe.sadd(writing_key, marker_key)


def _mark_finished(pipe: Any, writing_key: str, marker_key: str, version: int) -> None:
    """Queue the marker of a doc whose write is whole: queries show ``version``. Kept a while
    for queries whose legs straddled the flip; after that the doc needs no marker."""
    set_marker(pipe, writing_key, marker_key, WriteMarker(shown=version, writing=None), ex=FINISHED_MARKER_TTL_S)


def _unfinished(doc_id: str, why: str) -> BackendUnavailable:
    """A sliced write that could not go on. Retried (not dead-lettered, which would commit
    the event with the doc half-written and nobody left to finish it)."""
    return BackendUnavailable(f"write of {doc_id!r} in slices {why} after {_WATCH_RETRIES} tries; retried later")


class _SlicedWrites(_History):
    """Sliced writes, the marker checks every write makes, and marker reads."""

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
        gen = await self._write_generation(pipe, unversioned=version is None)
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
        now = await redis_now(self._r)
        decision = decide(version, marker, owner=self._owner, now=now)
        if decision == "wait":
            SLICED_WRITES.labels("waited").inc()
            raise WriteInProgress(
                f"version {version} of {doc_id!r} is being written in slices by another process "
                f"(progress {now - marker.beat:.0f}s ago): waiting for it to finish"
            )
        return decision

    async def _apply_sliced(
        self,
        doc_id: str,
        version: int,
        chunks: Sequence[ChunkRecord],
        mappings: Sequence[dict[str, Any]],
        tenant: str,
        version_ttl_s: int | None,
        keep: int | None = None,
        passed: Sequence[Passed] = (),
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
        ``keep`` and ``passed``: the earlier versions the doc's history keeps, and those of its
        batch (``memory.index.history``); the versions replaced are pushed when the write begins.
        """
        token = uuid.uuid4().hex
        for _ in range(_WATCH_RETRIES):
            try:
                begun = await self._begin_sliced(
                    doc_id, version, tenant, token, deleting=not chunks, keep=keep, by=chunks, passed=passed
                )
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

    async def _begin_sliced(
        self,
        doc_id: str,
        version: int,
        tenant: str,
        token: str,
        *,
        deleting: bool,
        keep: int | None = None,
        by: Sequence[ChunkRecord] = (),
        passed: Sequence[Passed] = (),
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
                        now = await redis_now(self._r)
                        began = WriteMarker(shown, version, token=token, owner=self._owner, since=now, beat=now)
                        seen_now = (stored_version, old_ids, marker)
                        plan = await self._history_plan(gen, tenant, doc_id, *seen_now, by, passed, keep)
                        pipe.multi()  # type: ignore[no-untyped-call]
                        self._write_history(pipe, gen, tenant, doc_id, plan, keep, deleting=deleting)
                        # No expiry: a writer that dies leaves the doc hidden until its
                        # event's redelivery (or a later version) writes it again.
                        set_marker(pipe, self._writing_key(), marker_key, began)
                        await pipe.execute()
                        return gen, old_ids
                    except rexc.WatchError as exc:
                        raise_if_lost(exc, f"write of {doc_id!r}")
                        continue
        raise IndexError_(f"write of {doc_id!r} kept conflicting; giving up after {_WATCH_RETRIES} tries")

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
            # Listed only now: a doc being written in slices is hidden until it is whole. Its
            # count change reads the live set (slices included): exact only because counts are
            # kept for turns alone, which are unversioned and so never written in slices.
            queue_change(pipe, self._cfg.name, gen, tenant, DocChange.of(doc_id, len(members), chunks))
            _mark_finished(pipe, self._writing_key(), self._marker_key(gen, tenant, doc_id), version)

        await self._guarded(gen, tenant, doc_id, token, finish, members=True)
        SLICED_WRITES.labels("finished").inc()
        # The list of markers holds those of the last few minutes' sliced writes, not all
        # ever set: queries read it whole.
        async with translate_errors("marker list"):
            await self.marker_list.prune()
        log.info(
            "index.sliced_write_finished",
            doc_id=doc_id,
            version=version,
            chunks=len(chunks),
            deleted=len(stale),
            transactions=len(writes) + len(drops) + 2,
            took_s=round(time.monotonic() - started, 3),
        )
        return ApplyResult(doc_id, applied=True, chunks=len(chunks), stored_version=version, removed=len(stale))

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
                        beat = await redis_now(self._r)
                        pipe.multi()  # type: ignore[no-untyped-call]
                        set_marker(pipe, self._writing_key(), marker_key, dataclasses.replace(marker, beat=beat))
                        fill(pipe, found)
                        await pipe.execute()
                        return
                    except rexc.WatchError as exc:
                        raise_if_lost(exc, f"write of {doc_id!r}")
                        continue
        raise _unfinished(doc_id, "kept conflicting")

    async def unfinished_writes(self) -> dict[tuple[str, str], WriteMarker]:
        """Every sliced write under way, or left half-way by a writer that died:
        ``(tenant, doc_id)`` -> its marker. A scan: for doctor, not for the hot path."""
        gen = await self._generation()
        prefix = keys.marker_prefix(self._cfg.name, gen)
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
        # One prefix per generation and tenant (a doc id ends the key): a query reads the
        # markers of every candidate's doc, up to hundreds.
        prefixes = {(g, t): self._marker_key(g, t, "") for g, t in {(g, t) for g, t, _ in docs}}
        async with translate_errors("marker read"):
            values = await self._r.mget([prefixes[g, t] + d for g, t, d in docs])
        return {k: m for k, v in zip(docs, values, strict=True) if (m := WriteMarker.decode(v)) is not None}

    async def writes_in_progress(self, doc_ids: Sequence[str], tenant: str = DEFAULT_TENANT) -> set[str]:
        """Those of these docs a sliced write is under way on (or was left half-way)."""
        gen = await self._generation()
        found = await self.write_markers([(gen, tenant, d) for d in doc_ids])
        return {d for (_, _, d), m in found.items() if m.in_progress}
