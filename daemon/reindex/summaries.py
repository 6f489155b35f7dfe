"""Community summaries copied from the old generation into the new one, re-embedded, at their
fencing tokens (they come from the graph, not from Kafka)."""

from __future__ import annotations

import numpy as np
import structlog

from daemon.reindex.completeness import summary_docs
from graph import COMMUNITY_TOMBSTONE_S
from memory.conversation import vector_text
from memory.embedder import SentenceTransformerEmbedder
from memory.errors import EmbedderError, WorkerCrashed
from memory.index import ChunkIndex, DocState
from memory.records import ChunkRecord

log = structlog.get_logger()

#: Summaries embedded per request while they are copied into the new generation.
SUMMARY_BATCH = 64


async def sync_communities(
    source: ChunkIndex,
    target: ChunkIndex,
    embedder: SentenceTransformerEmbedder,
    held: dict[tuple[str, str], DocState] | None = None,
) -> int:
    """Bring the new generation's community summaries level with the old one's: each summary
    (or tombstone of a removed one) the new generation lacks at the old one's fencing token
    is written there at that token, re-embedded. Returns how many summaries it copied.

    Summaries come from the graph, not from Kafka. Copied with their tokens, a worker whose
    claim expired can no more overwrite a newer summary in the new generation than in the
    old, nor bring back one a recompute removed; a summary a live worker already wrote to
    the new generation (a later token) is left alone.
    """
    held = summary_docs(await source.doc_versions() if held is None else held)  # a scan: reuse one
    todo = set(await target.behind(held))
    if not todo:
        return 0
    records = [r for r in await source.community_records() if (r.tenant, r.doc_id) in todo]
    for rec, vec in await _embedded(embedder, records):
        await target.apply(rec.doc_id, held[(rec.tenant, rec.doc_id)].version, [rec], vec[None, :], rec.tenant)
    tombstones = [k for k in todo if not held[k].has_chunks and held[k].version is not None]
    for tenant, doc_id in tombstones:
        # Expiring as the recompute's own do: a permanent copy would outlive what fences it.
        await target.apply(
            doc_id,
            held[(tenant, doc_id)].version,
            [],
            np.zeros((0, 1), np.float32),
            tenant,
            version_ttl_s=COMMUNITY_TOMBSTONE_S,
        )
    return len(records)  # summaries: a tombstone is no summary copied


async def _embedded(
    embedder: SentenceTransformerEmbedder, records: list[ChunkRecord]
) -> list[tuple[ChunkRecord, np.ndarray]]:
    """The summaries with their vectors, in batches. One the model fails on, or that crashes
    the worker alone, is left out and logged rather than ending the whole reindex: the new
    generation then lacks it, so the exact check after the switch keeps the old generation
    and says which. An outage (the worker killed, a crash not pinned on one summary) still
    ends the step, retried like any."""
    out: list[tuple[ChunkRecord, np.ndarray]] = []
    for start in range(0, len(records), SUMMARY_BATCH):
        part = records[start : start + SUMMARY_BATCH]
        try:  # an outage (EmbedderUnavailable) is not an EmbedderError: it ends the step
            out.extend(zip(part, await embedder.embed_documents([vector_text(r.text, "") for r in part]), strict=True))
            continue
        except EmbedderError:
            pass  # which one? each alone
        except WorkerCrashed as exc:
            if not exc.signalled:  # killed: an outage
                raise
        for rec in part:
            try:
                (vec,) = await embedder.embed_documents([vector_text(rec.text, "")])
            except (EmbedderError, WorkerCrashed) as exc:
                if isinstance(exc, WorkerCrashed) and not exc.attributable:
                    raise
                log.warning("reindex.summary_not_embedded", tenant=rec.tenant, doc_id=rec.doc_id, error=str(exc))
                continue
            out.append((rec, vec))
    return out
