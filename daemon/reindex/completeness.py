"""Completeness: which docs the old generation holds that the new one lacks, and copying over
those it can (pure selections, and the copies they lead to)."""

from __future__ import annotations

from dataclasses import dataclass

from memory.config import IndexConfig
from memory.errors import ReindexWouldLose
from memory.filters import BASE_FILTER_KEYS
from memory.generations import IndexSpec, schema_digest
from memory.index import ChunkIndex, DocState
from memory.records import COMMUNITY_PREFIX

NOT_REPLAYED = (
    "not reproduced by the replay: its events are gone from the topics (retention, a restarted "
    "in-memory broker, --since) or the new settings reject them"
)


def _is_summary(key: tuple[str, str]) -> bool:
    return key[1].startswith(COMMUNITY_PREFIX)


def _served(held: dict[tuple[str, str], DocState]) -> dict[tuple[str, str], DocState]:
    """The docs (not summaries) a generation serves: those with chunks."""
    return {k: st for k, st in held.items() if st.has_chunks and not _is_summary(k)}


def _tombstones(held: dict[tuple[str, str], DocState]) -> dict[tuple[str, str], DocState]:
    """Deleted docs (not summaries): a version and no chunks. Kept so that an older upsert,
    redelivered or re-sent, can never bring the doc back; they hold no vectors, so they are
    copied whatever the spec."""
    return {k: st for k, st in held.items() if not st.has_chunks and st.version is not None and not _is_summary(k)}


def summary_docs(held: dict[tuple[str, str], DocState]) -> dict[tuple[str, str], DocState]:
    """The community summaries among ``held`` (tenant, doc id) -> state (pure)."""
    return {k: st for k, st in held.items() if _is_summary(k)}


@dataclass(frozen=True, slots=True)
class Carry:
    """How the docs a replay did not reproduce come over from the old generation: as stored,
    with their BM25 terms and identifiers analyzed again (``reanalyze``), and with their
    filter fields set again from their stored metadata (``refield``)."""

    reanalyze: bool = False
    refield: bool = False


def carry_mode(old: IndexSpec | None, new: IndexSpec, *, fields_only: bool = False) -> Carry | None:
    """How the docs a replay did not reproduce can come over from the old generation (pure).

    Only when ``new`` cuts the same chunks with the same model: then the stored chunk texts
    and vectors are what a replay would write, and what else differs can be computed from
    the stored chunk. A new text analysis (a release that bumps ANALYZER_VERSION) analyzes
    each chunk's text again. Another schema only when ``fields_only``: the old index is this
    release's schema under other filter keys (:func:`fields_only_change`), so each chunk's
    filter values come from its stored metadata; a schema a release changed may hold fields
    no stored chunk has. Without this an upgrade, or a new filter key, on the embedded
    broker, whose log does not outlive a restart, could reindex nothing and would lose every
    doc. ``None``: another model, chunking or schema, which only a replay can produce.
    """
    if old is None or not old.same_vectors(new):
        return None
    refield = old.schema_digest != new.schema_digest
    if refield and not fields_only:
        return None
    return Carry(reanalyze=old.analyzer != new.analyzer, refield=refield)


def fields_only_change(old: IndexSpec, cfg: IndexConfig, old_keys: tuple[str, ...] | None) -> bool:
    """Whether the old generation's schema is the one these settings (``cfg``) build but for
    its filter keys ``old_keys`` (read from its index), so that a carry-over may set each
    chunk's filter fields again (pure)."""
    if old_keys is None or old_keys[: len(BASE_FILTER_KEYS)] != BASE_FILTER_KEYS:
        return False
    then = cfg.model_copy(update={"extra_filter_keys": list(old_keys[len(BASE_FILTER_KEYS) :])})
    return schema_digest(then, dims=old.dims) == old.schema_digest


async def complete(
    source: ChunkIndex, target: ChunkIndex, held: dict[tuple[str, str], DocState], carry: Carry | None
) -> tuple[list[tuple[str, str]], int]:
    """Bring ``target`` level with the docs ``held`` from ``source`` where it can: tombstones
    always, served docs when ``carry`` (:func:`carry_mode`) allows. Returns the docs still
    missing (or older) in ``target``, and how many were copied."""
    copied = 0
    tombstones = _tombstones(held)
    if short := await target.behind(tombstones):
        copied += await _carry_over(source, target, short)
    served = _served(held)
    short = await target.behind(served)
    if short and carry is not None:
        copied += await _carry_over(source, target, short, carry)
        short = await target.behind(served)
    # Docs the replay brought level: their earlier versions that fell out of Kafka's retention.
    assert source.pinned is not None
    # (A doc just copied brought its list: it is level with nothing to merge.)
    missing = set(short)
    level = [k for k, st in served.items() if st.version is not None and k not in missing]
    await target.carry_history(source.pinned, level)
    return short + await target.behind(tombstones), copied


async def _carry_over(
    source: ChunkIndex, target: ChunkIndex, keys: list[tuple[str, str]], carry: Carry = Carry()
) -> int:
    """Copy docs the rebuild did not reproduce from the old generation (see :func:`carry_mode`)."""
    assert source.pinned is not None
    copied = 0
    for tenant, doc_id in keys:
        copied += await target.copy_doc(source.pinned, tenant, doc_id, reanalyze=carry.reanalyze, refield=carry.refield)
    return copied


def why_missing(keys: list[tuple[str, str]], failed: dict[tuple[str, str], str]) -> dict[str, str]:
    """``tenant/doc_id`` -> why the new generation lacks it."""
    return {f"{t}/{d}": failed.get((t, d), NOT_REPLAYED) for t, d in keys}


#: Said when docs went missing and :func:`carry_mode` allowed no carry-over.
NOT_CARRIED = (
    "They could not come over from the old generation either: the new settings change the model, "
    "the chunking or the index schema, which only a replay of a doc's events rebuilds"
)


def losses_refused(lost: dict[str, str], old: int, *, carried: bool = True) -> ReindexWouldLose:
    """The refusal to switch away from generation ``old`` while the new one lacks the docs
    ``lost`` (``tenant/doc_id`` -> why, :func:`why_missing`); ``carried``: whether docs the
    replay missed could be carried over from the old generation (:func:`carry_mode`)."""
    by_reason: dict[str, list[str]] = {}
    for doc, why in lost.items():
        by_reason.setdefault(why, []).append(doc)
    shown = "; ".join(
        f"{why}: {', '.join(docs[:10])}{f' and {len(docs) - 10} more' if len(docs) > 10 else ''}"
        for why, docs in by_reason.items()
    )
    return ReindexWouldLose(
        f"{len(lost)} doc(s) served by generation {old} are not in the new build, so the switch would "
        f"lose them. {shown}.{'' if carried else ' ' + NOT_CARRIED + '.'} Nothing was switched; republish, fix or "
        "delete them, keep the old settings, or pass --allow-losses"
    )
