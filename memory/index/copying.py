"""What a reindex carries between generations: doc listings, coverage and verbatim copies."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis import exceptions as rexc

from memory.index.codec import _reanalyzed, _refielded, _respoken, hash_timestamp
from memory.index.directory import DocChange, queue_change
from memory.index.errors import IndexError_, raise_if_lost, translate_errors
from memory.index.history import Version
from memory.index.lifecycle import _WATCH_RETRIES, _Lifecycle, redis_now
from memory.index.sliced import set_marker
from memory.keys import check_tenant, doc_prefix, ver_prefix
from memory.schema import as_str
from memory.visibility import WriteMarker, live


@dataclass(frozen=True, slots=True)
class DocState:
    """What one generation holds of a doc: its last applied version and whether it has chunks."""

    version: int | None
    has_chunks: bool


#: Docs whose versions and history lists one round trip of ``carry_history`` reads.
_CARRY_BATCH = 256


def _merged(theirs: Sequence[Any], ours: Sequence[Any], keep: int) -> list[Any]:
    """Two history lists as one, newest first, ``keep`` long; a version both hold keeps ours (pure)."""
    by_version: dict[int, Any] = {}
    for raw in [*theirs, *ours]:  # ours last: it wins a version both hold
        entry = Version.decode(raw)
        if entry is not None:
            by_version[entry.version] = raw
    return [by_version[v] for v in sorted(by_version, reverse=True)][:keep]


class _Copying(_Lifecycle):
    """``doc_versions``, ``behind`` and ``copy_doc``: one generation compared with and
    copied into another."""

    async def doc_versions(self) -> dict[tuple[str, str], DocState]:
        """Every doc this generation holds chunks or a version (tombstone) of:
        ``(tenant, doc_id)`` -> its version (None: unversioned) and whether it has chunks.

        A scan of the generation's keys: for a reindex's checks, not for the hot path.
        """
        gen = await self._generation()
        found: dict[tuple[str, str], list[Any]] = {}
        async with translate_errors("doc listing"):
            for kind, prefix in (("doc", doc_prefix(self._cfg.name, gen)), ("ver", ver_prefix(self._cfg.name, gen))):
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
            now = await redis_now(self._r)
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

    async def carry_history(self, source_generation: int, docs: Sequence[tuple[str, str]]) -> int:
        """Merge into this generation's history lists the earlier versions another generation
        keeps of ``docs`` (``(tenant, doc_id)``) where both hold the same version of the doc.
        Returns how many lists gained versions.

        Why: a reindex replays what Kafka retains. A doc whose latest event it retains comes
        out at the same version as in the old generation, so it is not copied, and its
        history would be only what the retained events said; the old generation's list
        also holds what fell out of retention. Versions both lists hold keep this one's entry.
        Read in pipelines, a few hundred docs a round trip; only a doc whose merge changes
        its list is written, in a transaction of its own.
        """
        keep = self._cfg.history_versions
        if keep <= 0 or not docs:
            return 0
        gen = await self._generation()
        merged = 0
        for start in range(0, len(docs), _CARRY_BATCH):
            batch = docs[start : start + _CARRY_BATCH]
            async with translate_errors("history carry-over"), self._r.pipeline(transaction=False) as pipe:
                for tenant, doc_id in batch:
                    pipe.mget(self._ver_key(source_generation, tenant, doc_id), self._ver_key(gen, tenant, doc_id))
                    pipe.lrange(self._history_key(source_generation, tenant, doc_id), 0, -1)
                    pipe.lrange(self._history_key(gen, tenant, doc_id), 0, -1)
                rows = await pipe.execute()
            for n, (tenant, doc_id) in enumerate(batch):
                versions, theirs, ours = rows[3 * n : 3 * n + 3]
                level = theirs and versions[0] is not None and versions[0] == versions[1]
                if level and _merged(theirs, ours, keep) != list(ours):
                    merged += await self._merge_history(source_generation, gen, tenant, doc_id, keep)
        return merged

    async def _merge_history(self, source_generation: int, gen: int, tenant: str, doc_id: str, keep: int) -> int:
        src_ver, ver = self._ver_key(source_generation, tenant, doc_id), self._ver_key(gen, tenant, doc_id)
        src_list = self._history_key(source_generation, tenant, doc_id)
        here = self._history_key(gen, tenant, doc_id)
        async with translate_errors("history carry-over"):
            for _ in range(_WATCH_RETRIES):
                async with self._r.pipeline(transaction=True) as pipe:
                    try:
                        # A write to either side between the reads and the merge retries it.
                        await pipe.watch(src_ver, ver, src_list, here)
                        versions = await pipe.mget(src_ver, ver)
                        if versions[0] is None or versions[0] != versions[1]:
                            return 0
                        theirs, ours = await pipe.lrange(src_list, 0, -1), await pipe.lrange(here, 0, -1)
                        entries = _merged(theirs, ours, keep)
                        if entries == list(ours):
                            return 0
                        pipe.multi()  # type: ignore[no-untyped-call]
                        pipe.delete(here)
                        if entries:
                            pipe.rpush(here, *entries)
                        await pipe.execute()
                        return 1
                    except rexc.WatchError as exc:
                        raise_if_lost(exc, f"write of {doc_id!r}")
                        continue
        raise IndexError_(f"history carry-over of {doc_id!r} kept conflicting; giving up after {_WATCH_RETRIES} tries")

    async def copy_doc(
        self, source_generation: int, tenant: str, doc_id: str, *, reanalyze: bool = False, refield: bool = False
    ) -> bool:
        """Copy a doc's chunks (hashes verbatim, vectors included) and version from another
        generation built with the same spec into this one's, unless this one already has
        that version or a later one. True if copied.

        Why verbatim: a reindex must keep docs whose events Kafka no longer holds (past
        retention, an in-memory broker restarted); with an unchanged spec their stored
        chunks are exactly what a replay would have written.

        ``reanalyze``: the source was built with the same model, chunking and schema but an
        older text analysis. The chunk texts and vectors are still what a replay would
        write; the ``terms`` and ``idents`` fields are computed again from each stored text.

        ``refield``: the source was built with the same model and chunking but other index
        fields (filter keys, HNSW settings). Its chunks and vectors still hold; each chunk's
        filter fields are set again from its stored metadata for this index's filter keys.
        """
        check_tenant(tenant)
        gen = await self._generation()
        src_ver_key = self._ver_key(source_generation, tenant, doc_id)
        src_doc = self._doc_key(source_generation, tenant, doc_id)
        src_marker_key = self._marker_key(source_generation, tenant, doc_id)
        src_history = self._history_key(source_generation, tenant, doc_id)
        history = self._history_key(gen, tenant, doc_id)
        async with translate_errors("doc copy"):
            for _ in range(_WATCH_RETRIES):
                async with self._r.pipeline(transaction=True) as pipe:
                    try:
                        ver_key, doc_key = self._ver_key(gen, tenant, doc_id), self._doc_key(gen, tenant, doc_id)
                        marker_key = self._marker_key(gen, tenant, doc_id)
                        # The source is watched too: a live write to it between these reads
                        # (before a switch, daemons still write there) retries the copy, so
                        # chunks and version are never copied from two different writes.
                        watched = (src_ver_key, src_doc, src_marker_key, src_history, ver_key, doc_key, marker_key)
                        await pipe.watch(*watched)
                        src_ver = await pipe.get(src_ver_key)
                        src_marker = WriteMarker.decode(await pipe.get(src_marker_key))
                        marker = WriteMarker.decode(await pipe.get(marker_key))
                        if (
                            marker is not None
                            and marker.writing is not None
                            and (src_ver is None or marker.writing >= int(src_ver))
                            and live(marker, await redis_now(self._r))
                        ):
                            # A live sliced write of that version or a later one is under way
                            # here: it replaces whatever the copy would bring (and copying
                            # would stop it). A dead or copied one is overwritten.
                            return False
                        chunk_ids = sorted(as_str(m) for m in await pipe.smembers(src_doc))
                        hashes = [await pipe.hgetall(self._chunk_key(source_generation, tenant, c)) for c in chunk_ids]
                        if reanalyze:
                            hashes = [_reanalyzed(h) for h in hashes]
                        if refield:
                            hashes = [_refielded(h, self._cfg.filter_keys) for h in hashes]
                        hashes = _respoken(hashes)
                        stored = await pipe.get(ver_key)
                        if src_ver is not None and stored is not None and int(stored) >= int(src_ver):
                            return False
                        if src_ver is None and (stored is not None or await pipe.exists(doc_key)):
                            return False  # unversioned: whatever the target holds (or forgot) is as new
                        old_ids = {as_str(m) for m in await pipe.smembers(doc_key)}
                        earlier = await pipe.lrange(src_history, 0, -1)
                        pipe.multi()  # type: ignore[no-untyped-call]
                        # The doc's earlier versions come with it (memory.index.history).
                        pipe.delete(history)
                        if earlier:
                            pipe.rpush(history, *earlier)
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
                        last = max((t for h in hashes if (t := hash_timestamp(h)) is not None), default=None)
                        # A new doc caught mid-write in the source shows nothing yet: not listed
                        # until that write, carried on here, finishes.
                        hidden = src_marker is not None and src_marker.in_progress and src_marker.shown is None
                        change = DocChange(doc_id, was=len(old_ids), now=0 if hidden else len(chunk_ids), last=last)
                        queue_change(pipe, self._cfg.name, gen, tenant, change)
                        if src_marker is not None and src_marker.in_progress:
                            # A sliced write was half-way through the source: the copy hides
                            # what the source hides. Nobody holds the copy's marker (a new
                            # token, no owner, no recent progress): that write, started again
                            # here after a switch, or its redelivery, takes it over at once.
                            copied = WriteMarker(
                                src_marker.shown, src_marker.writing, token=uuid.uuid4().hex, since=src_marker.since
                            )
                            set_marker(pipe, self._writing_key(), marker_key, copied)
                        else:
                            # A whole copy, written at once: nothing to hide. A sliced write
                            # under way here (a reindex's replay) finds its token gone.
                            pipe.delete(marker_key)
                        await pipe.execute()
                        return True
                    except rexc.WatchError as exc:
                        raise_if_lost(exc, f"write of {doc_id!r}")
                        continue
        raise IndexError_(f"copy of {doc_id!r} kept conflicting; giving up after {_WATCH_RETRIES} tries")
