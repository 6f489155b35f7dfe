"""Completeness: which docs the old generation holds that the new one lacks, and copying over
those it can (pure selections, and the copies they lead to)."""

from __future__ import annotations

from memory.errors import ReindexWouldLose
from memory.generations import IndexSpec
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


def carry_mode(old: IndexSpec | None, new: IndexSpec) -> str | None:
    """How the docs a replay did not reproduce can come over from the old generation (pure).

    ``"verbatim"``: the same spec, so the stored chunks are what a replay would write.
    ``"reanalyze"``: only the text analysis changed (a release that bumps ANALYZER_VERSION),
    so chunk texts and vectors still are, and their BM25 terms and identifiers are computed
    again. Without it an upgrade on the embedded broker, whose log does not outlive a
    restart, could reindex nothing and would lose every doc. ``None``: another model,
    chunking or schema, which only a replay can produce.
    """
    if old is None:
        return None
    if old == new:
        return "verbatim"
    if old.only_analysis_differs(new):
        return "reanalyze"
    return None


async def complete(
    source: ChunkIndex, target: ChunkIndex, held: dict[tuple[str, str], DocState], carry: str | None
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
        copied += await _carry_over(source, target, short, reanalyze=carry == "reanalyze")
        short = await target.behind(served)
    return short + await target.behind(tombstones), copied


async def _carry_over(
    source: ChunkIndex, target: ChunkIndex, keys: list[tuple[str, str]], *, reanalyze: bool = False
) -> int:
    """Copy docs the rebuild did not reproduce from the old generation (see :func:`carry_mode`)."""
    assert source.pinned is not None
    copied = 0
    for tenant, doc_id in keys:
        copied += await target.copy_doc(source.pinned, tenant, doc_id, reanalyze=reanalyze)
    return copied


def why_missing(keys: list[tuple[str, str]], failed: dict[tuple[str, str], str]) -> dict[str, str]:
    """``tenant/doc_id`` -> why the new generation lacks it."""
    return {f"{t}/{d}": failed.get((t, d), NOT_REPLAYED) for t, d in keys}


def losses_refused(lost: dict[str, str], old: int) -> ReindexWouldLose:
    """The refusal to switch away from generation ``old`` while the new one lacks the docs
    ``lost`` (``tenant/doc_id`` -> why, :func:`why_missing`)."""
    shown = "; ".join(f"{d} ({why})" for d, why in list(lost.items())[:10])
    return ReindexWouldLose(
        f"{len(lost)} doc(s) served by generation {old} are not in the new build, so the switch would "
        f"lose them: {shown}{' ...' if len(lost) > 10 else ''}. Nothing was switched; republish, fix or "
        "delete them, or pass --allow-losses"
    )
