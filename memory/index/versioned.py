"""Versioned writes: a doc's chunks replaced in one optimistic transaction, and read back."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
from redis import exceptions as rexc

from memory.errors import MemdError
from memory.index import codec  # _record_mapping looked up on its module, where tests spy on it
from memory.index.codec import Analysis, _int_or_none, _text, analyze_records
from memory.index.directory import DocChange, queue_change
from memory.index.errors import IndexError_, _NoGeneration, raise_if_lost, translate_errors
from memory.index.history import Passed, kept_versions
from memory.index.lifecycle import _WATCH_RETRIES
from memory.index.sliced import _mark_finished, _SlicedWrites
from memory.keys import check_tenant
from memory.records import DEFAULT_TENANT, ApplyResult, ChunkRecord
from memory.schema import as_str

#: The version an unversioned doc's delete stores (below every real version, which start at 0
#: or more, so a versioned write would still apply; turns are never versioned).
UNVERSIONED_TOMBSTONE = 0

#: Docs of up to this many chunks have their hashes built on the event loop; larger ones
#: in a thread (a hop a one-chunk turn need not pay).
_INLINE_MAPPINGS = 64


class _VersionedWrites(_SlicedWrites):
    """``apply`` and the reads of what it stored: versions, chunk ids, texts."""

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
        passed: Sequence[Passed] = (),
    ) -> ApplyResult:
        """Replace every chunk of ``doc_id`` with ``chunks`` (none = delete), atomically.

        ``analyses`` (from :func:`analyze`, one per chunk) saves computing them here.
        ``version_ttl_s``: the stored version expires (a removed community's tombstone only
        has late writers of the last minutes to fence off; a document's is kept for good).
        ``passed``: the doc's versions its batch held before this one, never written, which
        its history keeps (``memory.index.history``).

        With a ``version``, applies only when it is above the stored one and then stores it;
        the check and the write form one optimistic transaction (WATCH), so two daemons
        racing through a rebalance cannot interleave. ``version=None`` always applies.

        Raises:
            BackendUnavailable: Redis is unreachable.
            IndexError_: the transaction kept conflicting.
        """
        check_tenant(tenant)
        if analyses is None:
            analyses = analyze_records(chunks)
        elif len(analyses) != len(chunks):
            raise MemdError(f"{len(analyses)} analyses for {len(chunks)} chunks of {doc_id!r}")
        try:
            return await self._apply(doc_id, version, chunks, vectors, tenant, analyses, version_ttl_s, passed)
        except _NoGeneration:
            if not self._recreate:
                raise
            await self._recover()
            return await self._apply(doc_id, version, chunks, vectors, tenant, analyses, version_ttl_s, passed)

    async def _apply(
        self,
        doc_id: str,
        version: int | None,
        chunks: Sequence[ChunkRecord],
        vectors: np.ndarray,
        tenant: str,
        analyses: Sequence[Analysis],
        version_ttl_s: int | None = None,
        passed: Sequence[Passed] = (),
    ) -> ApplyResult:
        keep = kept_versions(chunks, version, self._cfg.history_versions)
        rows = zip(chunks, vectors, analyses, strict=True)
        if len(chunks) <= _INLINE_MAPPINGS:
            mappings = [codec._record_mapping(*row) for row in rows]
        else:
            # Pure Python per chunk: a large doc's hashes, built on the event loop, stalled
            # queries (with the rest of its write, ~0.3 s for 1,200 chunks, measured).
            mappings = await asyncio.to_thread(lambda: [codec._record_mapping(*row) for row in rows])
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
                        seen_now = (stored_version, old_ids, marker)
                        plan = await self._history_plan(gen, tenant, doc_id, *seen_now, chunks, passed, keep)
                        pipe.multi()  # type: ignore[no-untyped-call]
                        deleting = version is not None and not chunks
                        self._write_history(pipe, gen, tenant, doc_id, plan, keep, deleting=deleting)
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
                        queue_change(pipe, self._cfg.name, gen, tenant, DocChange.of(doc_id, len(old_ids), chunks))
                        if marker is not None:
                            # Queries filter this doc's hits by its marker: it must show this
                            # version now. An unfinished sliced writer finds its token gone
                            # and stops.
                            if version is None:
                                pipe.delete(marker_key)
                            else:
                                _mark_finished(pipe, self._writing_key(), marker_key, version)
                        await pipe.execute()
                        return ApplyResult(
                            doc_id, applied=True, chunks=len(chunks), stored_version=version, removed=len(stale)
                        )
                    except rexc.WatchError as exc:
                        raise_if_lost(exc, f"write of {doc_id!r}")
                        continue
            else:
                raise IndexError_(f"write of {doc_id!r} kept conflicting; giving up after {_WATCH_RETRIES} tries")
            assert version is not None
            return await self._apply_sliced(doc_id, version, chunks, mappings, tenant, version_ttl_s, keep, passed)

    async def chunk_ids(self, doc_id: str, tenant: str = DEFAULT_TENANT) -> set[str]:
        """The chunk ids currently stored for a doc."""
        gen = await self._generation()
        async with translate_errors("chunk listing"):
            return {as_str(m) for m in await self._r.smembers(self._doc_key(gen, tenant, doc_id))}

    async def texts(self, chunk_ids: Sequence[str], tenant: str = DEFAULT_TENANT) -> dict[str, str]:
        """Stored text of each chunk that exists (see ``versioned_texts``)."""
        return {c: text for c, (text, _, _) in (await self.versioned_texts(chunk_ids, tenant)).items()}

    async def versioned_texts(
        self, chunk_ids: Sequence[str], tenant: str = DEFAULT_TENANT
    ) -> dict[str, tuple[str, int | None, str]]:
        """Stored text, doc version and open fence (``ChunkRecord.fence``) of each chunk that exists.

        Read from a generation that was still the active one when the read ended: a summary
        is written from these, and a reindex may have switched and dropped the generation
        cached a moment ago (its keys would read as missing). Then read again in the new one.
        """
        following = self.pinned is None
        for _ in range(_WATCH_RETRIES):
            gen = await self._generation()
            async with translate_errors("chunk read"), self._r.pipeline(transaction=False) as pipe:
                for cid in chunk_ids:
                    pipe.hmget(self._chunk_key(gen, tenant, cid), ["text", "version", "chunk_fence"])
                if following:
                    pipe.hget(self.registry.key, "active")
                values = await pipe.execute()
            if not following or int(values.pop() or 0) == gen:
                return {
                    c: (as_str(text), _int_or_none(version), _text(fence))
                    for c, (text, version, fence) in zip(chunk_ids, values, strict=True)
                    if text is not None
                }
            await self.state(fresh=True)
        raise IndexError_(f"chunk read kept meeting a generation switch; giving up after {_WATCH_RETRIES} tries")
