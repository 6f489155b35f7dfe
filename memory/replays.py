"""Whether an event of the version already stored says what is stored, and the replays of a
batch told from its conflicts (pure: no I/O but a log line)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import structlog

from memory.index.codec import joined_text
from memory.ingest_report import IngestReport, ItemOutcome
from memory.records import MemoryItem, StoredChunk
from memory.turn_claims import Held

log = structlog.get_logger()


def differs_from_stored(item: MemoryItem, chunks: Sequence[StoredChunk]) -> str | None:
    """What of ``item`` (an upsert whose version is the stored one) differs from the doc as
    stored (``chunks``, in position order): ``"content"``, ``"source"`` or ``"metadata"``, or
    None when it is the same event again (a redelivery) or the stored chunks are not all of
    that version (nothing to compare: a write of it is not whole)."""
    if not chunks or any(c.version != item.version for c in chunks):
        return None
    # Chunks written before they kept their starts read back only near the content: not compared.
    if all(c.start is not None for c in chunks) and joined_text(chunks) != item.content:
        return "content"
    if chunks[0].source != item.source:
        return "source"
    if chunks[0].metadata != item.metadata:
        return "metadata"
    return None


def held_in(chunks: Sequence[StoredChunk]) -> Held:
    """What a stored turn holds (``chunks``, in position order; none: nothing). Chunks written
    before they kept their starts cannot give the content back: they hold an unknown one."""
    if not chunks:
        return None
    content = joined_text(chunks) if all(c.start is not None for c in chunks) else "\x00unknown"
    return content, chunks[0].metadata


def differs_between(item: MemoryItem, other: MemoryItem) -> str | None:
    """What of ``item`` differs from ``other``, an event of the same doc and version: as
    :func:`differs_from_stored` says it, or None for a copy (a producer's retry). A delete and
    an upsert are not compared, in a batch as one at a time: a stored delete leaves nothing
    to compare with."""
    if item.op != other.op:
        return None
    if item.content != other.content:
        return "content"
    if item.source != other.source:
        return "source"
    if item.metadata != other.metadata:
        return "metadata"
    return None


def conflicts_apart(
    replays: list[MemoryItem],
    copies: Sequence[MemoryItem],
    stored: Mapping[tuple[str, str], list[StoredChunk]],
    report: IngestReport,
) -> list[MemoryItem]:
    """``replays`` (their version is the stored one) without the document upserts that say
    something else than what is stored: another content, source or metadata under a version
    already written (a producer that reused a version). Those are acked ``ignored`` with
    the reason in ``report``, never a silent "indexed", and not handed to the graph. A
    redelivery says what is stored, and is kept (decision 0057).

    Args:
        replays: the batch's items whose version is the stored one.
        copies: the batch's other upserts of a replay's doc and version, which ``coalesce``
            passed over. Each is judged against what is stored too, as it would be alone: the
            batch ``[v5 B, v5 A]`` over a stored v5 A acks B ``ignored`` and A ``indexed``,
            and A goes to the graph in B's place.
        stored: the chunks as written of each replayed document, by (tenant, doc id).
        report: the batch's report, which takes the outcome of each item judged.
    """
    upserts = [i for i in replays if i.op == "upsert" and i.kind == "document"]
    if not upserts:
        return replays
    docs = {(i.tenant, i.doc_id) for i in upserts}
    copies = [c for c in copies if c.op == "upsert" and c.kind == "document" and (c.tenant, c.doc_id) in docs]
    copied = {id(c) for c in copies}
    kept: list[MemoryItem] = []
    kept_docs: set[tuple[str, str]] = set()
    compared = {id(i) for i in upserts} | copied
    for item in [*replays, *copies]:
        chunks = stored.get((item.tenant, item.doc_id))
        if id(item) in compared and chunks and (why := differs_from_stored(item, chunks)) is not None:
            report.outcomes[id(item)] = ItemOutcome("ignored", stored_version=item.version, conflict=why)
            log.warning(
                "ingest.version_conflict_ignored",
                tenant=item.tenant,
                doc_id=item.doc_id,
                version=item.version,
                differs=why,
            )
        elif id(item) in copied:
            report.outcomes[id(item)] = ItemOutcome("indexed", stored_version=item.version)
            if (item.tenant, item.doc_id) not in kept_docs:
                kept.append(item)  # the doc's kept item conflicted: this one says what is stored
                kept_docs.add((item.tenant, item.doc_id))
        else:
            kept.append(item)
            kept_docs.add((item.tenant, item.doc_id))
    return kept
