"""A document's earlier versions: kept when a later one replaces them, read back by id.

When an upsert replaces a stored version of a document, the transaction that writes the new
version also pushes the old one (its content joined from its chunks, its time, source and
metadata, and ``until``, the time of the version that replaced it) onto the doc's history
list, newest first, trimmed to ``IndexConfig.history_versions``. A delete drops the list
with the chunks: a deleted document leaves nothing readable. Turns and community summaries
keep none. Only a version whose every stored chunk carries it is kept (a sliced write that
died half-way left a mix, which no version ever said), and never twice (a redelivery or a
restarted sliced write finds it at the head already).
"""

from __future__ import annotations

import json
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memory import keys
from memory.chunking import chunk_position, join_chunks
from memory.index.codec import JOIN_FIELDS, _stored, joined_text
from memory.index.errors import translate_errors
from memory.index.lifecycle import _Lifecycle
from memory.records import DEFAULT_TENANT, ChunkRecord
from memory.schema import as_str

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


def kept_versions(chunks: Sequence[ChunkRecord], version: int | None, limit: int) -> int:
    """How many earlier versions a write of ``chunks`` at ``version`` keeps: ``limit`` for
    a versioned document's upsert, else none (pure)."""
    if version is None or not chunks or chunks[0].kind != "document":
        return 0
    return limit


def _content(chunks: Sequence[ChunkRecord]) -> str:
    return join_chunks([c.text for c in chunks], [c.start for c in chunks], [c.gap for c in chunks], chunks[-1].tail)


class _History(_Lifecycle):
    """The history lists: what a replacing write pushes, and reads by doc id."""

    def _history_key(self, gen: int, tenant: str, doc_id: str) -> str:
        return keys.history_key(self._cfg.name, gen, tenant, doc_id)

    async def _replaced(
        self, gen: int, tenant: str, doc_id: str, stored: int | None, old_ids: set[str], by: Sequence[ChunkRecord]
    ) -> str | None:
        """The history entry of the stored version a write of ``by`` is about to replace, or
        None: nothing stored, a mix of versions, not a document, at the head already, or
        the same content, source and metadata as ``by`` (a new version of the same thing).

        Read outside the caller's transaction but after its WATCH of the doc's version and
        chunk set: a write between this read and the caller's EXEC fails the EXEC, and the
        caller reads again.
        """
        if stored is None or not old_ids:
            return None
        chunk_keys = [self._chunk_key(gen, tenant, cid) for cid in sorted(old_ids, key=chunk_position)]
        async with translate_errors("history read"), self._r.pipeline(transaction=False) as pipe:
            pipe.lindex(self._history_key(gen, tenant, doc_id), 0)
            for chunk_key in chunk_keys:
                pipe.hmget(chunk_key, list(_FIELDS))
            head, *rows = await pipe.execute()
        latest = Version.decode(head) if head is not None else None
        if latest is not None and latest.version == stored:
            return None
        chunks = [
            _stored(types.SimpleNamespace(id=key, **dict(zip(_FIELDS, row, strict=True))), ())
            for key, row in zip(chunk_keys, rows, strict=True)
            if row[0] is not None
        ]
        if len(chunks) != len(chunk_keys) or any(c.version != stored or c.kind != "document" for c in chunks):
            return None
        first, text = chunks[0], joined_text(chunks)
        if by and (text, first.source, first.metadata) == (_content(by), by[0].source, by[0].metadata):
            return None
        until = by[0].timestamp if by else None
        return Version(stored, text, first.source, first.metadata, first.timestamp, until).encode()

    def _push_history(self, pipe: Any, gen: int, tenant: str, doc_id: str, entry: str | None, keep: int) -> None:
        """Queue, in the caller's transaction, ``entry`` onto the doc's history (trimmed to ``keep``)."""
        if entry is None or keep <= 0:
            return
        key = self._history_key(gen, tenant, doc_id)
        pipe.lpush(key, entry)
        pipe.ltrim(key, 0, keep - 1)

    async def history(self, doc_ids: Sequence[str], tenant: str = DEFAULT_TENANT) -> dict[str, list[Version]]:
        """Each doc's earlier versions, newest first (docs without any are left out)."""
        if not doc_ids:
            return {}
        gen = await self._generation()
        async with translate_errors("history read"), self._r.pipeline(transaction=False) as pipe:
            for d in doc_ids:
                pipe.lrange(self._history_key(gen, tenant, d), 0, -1)
            lists = await pipe.execute()
        out: dict[str, list[Version]] = {}
        for d, raw in zip(doc_ids, lists, strict=True):
            versions = [v for v in (Version.decode(r) for r in raw) if v is not None]
            if versions:
                out[d] = versions
        return out
