"""A document's earlier versions: kept when a later one replaces them, read back by id.

When an upsert replaces a stored version of a document, the transaction that writes the new
version also pushes the old one (its content joined from its chunks, its time, source and
metadata, and ``until``, the time of the version that replaced it) onto the doc's history
list, newest first, trimmed to ``IndexConfig.history_versions``; so do the versions its batch
held before it and never wrote (``Passed``). A delete drops the list with the chunks: a
deleted document leaves nothing readable. Turns and community summaries keep none. What is
pushed is planned by ``plan_history`` (pure): the stored version only when every stored
chunk carries it and no sliced write is under way, no version that says what the next one
says, and nothing at or below the version at the head of the list (a write that starts
again pushes nothing twice).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memory.chunking import chunk_position
from memory.index.codec import JOIN_FIELDS, _stored, joined_text
from memory.index.errors import translate_errors
from memory.index.lifecycle import _Lifecycle
from memory.records import DEFAULT_TENANT, ChunkRecord, MemoryItem
from memory.schema import as_str
from memory.visibility import WriteMarker

#: Bytes of versions decoded on the event loop; more are decoded in a thread.
_DECODED_INLINE_BYTES = 256 * 1024

#: What is read of each old chunk to rebuild its version.
_FIELDS = ("text", "version", "kind", "source", "metadata", "timestamp", "ts", *JOIN_FIELDS)


@dataclass(frozen=True, slots=True)
class Version:
    """One earlier version of a document, as its history keeps it."""

    version: int
    content: str
    source: str
    metadata: dict[str, Any]
    timestamp: float | None  # when it was written (its event's time)
    until: float | None  # when the version that replaced it was written

    def encode(self) -> str:
        """The list entry (JSON)."""
        return json.dumps(
            {
                "version": self.version,
                "content": self.content,
                "source": self.source,
                "metadata": self.metadata,
                "timestamp": self.timestamp,
                "until": self.until,
            },
            ensure_ascii=False,
        )

    @classmethod
    def decode(cls, raw: Any) -> Version | None:
        """An entry read back; None for one that is not (written by another release)."""
        try:
            d = json.loads(as_str(raw))
            return cls(
                version=int(d["version"]),
                content=str(d["content"]),
                source=str(d["source"]),
                metadata=dict(d["metadata"]),
                timestamp=None if d["timestamp"] is None else float(d["timestamp"]),
                until=None if d["until"] is None else float(d["until"]),
            )
        except (ValueError, TypeError, KeyError):
            return None


def kept_versions(chunks: Sequence[ChunkRecord], version: int | None, limit: int) -> int | None:
    """How many earlier versions a write of ``chunks`` at ``version`` keeps: ``limit`` for
    a versioned document's upsert (0: none, and the list is dropped), else None: the write
    leaves the list alone (a turn, a summary) or drops it with the doc (a delete) (pure)."""
    if version is None or not chunks or chunks[0].kind != "document":
        return None
    return limit


@dataclass(frozen=True, slots=True)
class Passed:
    """A version of a doc that its batch held before the one written (``memory.batch_plan``):
    never written, yet said, so its history keeps it (or, a delete, drops what came before)."""

    version: int
    deleted: bool
    content: str
    source: str
    metadata: dict[str, Any]
    timestamp: float

    @classmethod
    def of(cls, item: MemoryItem) -> Passed:
        """What ``item`` said (a document's upsert or delete)."""
        deleted = item.op == "delete"
        return cls(item.version or 0, deleted, item.content, item.source, dict(item.metadata), item.timestamp)


def plan_history(
    stored: Version | None, floor: int | None, passed: Sequence[Passed], final: Passed, head: int | None
) -> tuple[list[Version], bool]:
    """The entries a write of ``final`` pushes, oldest first, and whether it drops the list
    first (a delete among ``passed``) (pure).

    ``stored``: the version stored now (its ``until`` unset), if it is to be kept; ``floor``:
    the version stored now, kept or not; ``passed``: the batch's versions, of which those
    between ``floor`` and ``final`` count; ``head``: the version at the head of the
    list, whose entries are kept already (a write that starts again pushes none twice).
    A version is kept with ``until`` the time of the next one that says something else
    (content, source or metadata). One that says the same is no change: the later of the two
    stands for both, as it does when they are written one at a time (and a write that starts
    again plans what it planned the first time).
    """
    entries: list[Version] = []
    clear = False
    prev = stored
    between = (p for p in passed if (floor is None or p.version > floor) and p.version < final.version)
    for p in sorted(between, key=lambda p: p.version):
        if p.deleted:
            entries, clear, prev = [], True, None
            continue
        said = Version(p.version, p.content, p.source, p.metadata, p.timestamp, None)
        if prev is not None and _says(prev) == _says(said):
            prev = said  # no change: the latest to say it holds, as when written one at a time
            continue
        if prev is not None:
            entries.append(dataclasses.replace(prev, until=p.timestamp))
        prev = said
    if prev is not None and _says(prev) != (final.content, final.source, final.metadata):
        entries.append(dataclasses.replace(prev, until=final.timestamp))
    if not clear and head is not None:
        entries = [e for e in entries if e.version > head]
    return entries, clear


def _says(v: Version) -> tuple[str, str, dict[str, Any]]:
    return v.content, v.source, v.metadata


def _final(chunks: Sequence[ChunkRecord]) -> Passed:
    """What a write of ``chunks`` (a document's, at least one) says."""
    first = chunks[0]
    return Passed(first.version, False, joined_text(chunks), first.source, dict(first.metadata), first.timestamp)


class _History(_Lifecycle):
    """The history lists: what a replacing write pushes, and reads by doc id."""

    async def _history_plan(
        self,
        gen: int,
        tenant: str,
        doc_id: str,
        stored: int | None,
        old_ids: set[str],
        marker: WriteMarker | None,
        chunks: Sequence[ChunkRecord],
        passed: Sequence[Passed],
        keep: int | None,
    ) -> tuple[list[Version], bool]:
        """What a write of ``chunks`` pushes onto the doc's history, and whether it drops the
        list first (``plan_history``); nothing, unread, when it keeps none (``keep``, as
        ``kept_versions`` says) or has nothing to keep (a new doc, alone in its batch).

        The stored version is kept only when every stored chunk carries it: not while a
        sliced write is under way (its start kept that version, or, a delete, dropped the
        list), nor after one died half-way (no version ever said that mix).

        Read outside the caller's transaction but after its WATCH of the doc's version, chunk
        set and marker: a write between this read and the caller's EXEC fails the EXEC, and
        the caller reads again.
        """
        if not keep or (not passed and (stored is None or not old_ids)):
            return [], False
        chunk_keys = [self._chunk_key(gen, tenant, cid) for cid in sorted(old_ids, key=chunk_position)]
        readable = stored is not None and chunk_keys and (marker is None or not marker.in_progress)
        async with translate_errors("history read"), self._r.pipeline(transaction=False) as pipe:
            pipe.lindex(self._history_key(gen, tenant, doc_id), 0)
            for chunk_key in chunk_keys if readable else ():
                pipe.hmget(chunk_key, list(_FIELDS))
            raw_head, *rows = await pipe.execute()
        head = Version.decode(raw_head) if raw_head is not None else None
        old = [
            _stored(types.SimpleNamespace(id=key, **dict(zip(_FIELDS, row, strict=True))), ())
            for key, row in zip(chunk_keys, rows, strict=False)
            if row[0] is not None
        ]
        kept: Version | None = None
        if readable and len(old) == len(chunk_keys) and all(c.version == stored and c.kind == "document" for c in old):
            first = old[0]
            kept = Version(first.version or 0, joined_text(old), first.source, first.metadata, first.timestamp, None)
        return plan_history(kept, stored, passed, _final(chunks), head.version if head is not None else None)

    def _write_history(
        self,
        pipe: Any,
        gen: int,
        tenant: str,
        doc_id: str,
        plan: tuple[list[Version], bool],
        keep: int | None,
        *,
        deleting: bool,
    ) -> None:
        """Queue, in the caller's transaction, what a write does to the doc's history: a delete
        drops it (a deleted doc leaves nothing readable); a document's upsert pushes its
        plan's entries, the list trimmed to ``keep`` (dropped at 0: a lowered setting frees
        what it no longer keeps); any other write (``keep`` None) leaves it alone."""
        key = self._history_key(gen, tenant, doc_id)
        if deleting:
            pipe.delete(key)
            return
        if keep is None:
            return
        entries, clear = plan
        if clear or keep <= 0:
            pipe.delete(key)
        if keep <= 0:
            return
        for entry in entries:
            pipe.lpush(key, entry.encode())
        pipe.ltrim(key, 0, keep - 1)

    async def history(
        self, doc_ids: Sequence[str], tenant: str = DEFAULT_TENANT, *, current: Mapping[str, int] | None = None
    ) -> dict[str, list[Version]]:
        """Each doc's earlier versions, newest first, as many as the setting keeps (docs
        without any are left out). ``current``: the version of each doc read as current just
        before; only versions older than it are kept (a write in between pushed that one)."""
        if not doc_ids:
            return {}
        keep = self._cfg.history_versions
        if keep <= 0:
            return {}
        gen = await self._generation()
        async with translate_errors("history read"), self._r.pipeline(transaction=False) as pipe:
            for d in doc_ids:
                pipe.lrange(self._history_key(gen, tenant, d), 0, keep - 1)
            lists = await pipe.execute()

        def decoded() -> dict[str, list[Version]]:
            out: dict[str, list[Version]] = {}
            for d, raw in zip(doc_ids, lists, strict=True):
                below = None if current is None else current.get(d)
                kept = (v for v in map(Version.decode, raw) if v is not None and (below is None or v.version < below))
                if versions := list(kept):
                    out[d] = versions
            return out

        # Versions of megabytes are decoded in a thread, off the event loop every query shares.
        large = sum(len(entry) for raw in lists for entry in raw) > _DECODED_INLINE_BYTES
        return await asyncio.to_thread(decoded) if large else decoded()
