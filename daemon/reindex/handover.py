"""After the switch, the old generation hands over to the new one: the catch-up, then the old
one dropped only if the new one holds everything it does, else kept with the reason.

These are steps 6 and 7 of a reindex (:class:`~daemon.reindex.build.Reindex`). The switch is
done, so nothing here is rolled back: each failure goes to the run's ``errors``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog
from aiokafka.errors import KafkaError

from daemon.reindex.completeness import Carry, complete, summary_docs
from daemon.reindex.replay import Replayer
from daemon.reindex.report import ReindexProgress
from daemon.reindex.summaries import sync_communities
from memory.embedder import SentenceTransformerEmbedder
from memory.errors import BackendUnavailable, ReindexConflict
from memory.index import ChunkIndex, DocState, GenerationRegistry, translate_errors

log = structlog.get_logger()

#: Tries of the catch-up after the switch, before the old generation is kept for safety.
CATCH_UP_TRIES = 4


class Handover:
    """Generation ``old`` (``source``) handing over to ``gen`` (``target``), now active.

    It holds no state of its own: what it does goes to the run's ``progress`` (announced
    with ``report``) and ``errors``.
    """

    def __init__(
        self,
        *,
        registry: GenerationRegistry,
        owner: str,
        source: ChunkIndex,
        target: ChunkIndex,
        replayer: Replayer,
        embedder: SentenceTransformerEmbedder,
        carry: Carry | None,
        old: int,
        gen: int,
        keep_old: bool,
        progress: ReindexProgress,
        report: Callable[[], None],
        errors: list[str],
    ) -> None:
        self._registry = registry
        self._owner = owner
        self._source = source
        self._target = target
        self._replayer = replayer
        self._embedder = embedder
        self._carry = carry
        self._old = old
        self._gen = gen
        self._keep_old = keep_old
        self._progress = progress
        self._report = report
        self._errors = errors

    async def catch_up(self) -> None:
        """Replay again up to end offsets read after the switch, then once more while live
        unversioned writes are held (each retried); failures are reported.

        Versions make a replayed doc event that is older than what a live daemon wrote after
        the switch a no-op. A transcript turn has none: the first pass may write a turn's
        older event over a forget or a correction that a live daemon applied from beyond its
        end offsets. The second pass replays every event since, in order, while live daemons
        wait to write unversioned docs, so each such turn ends at its latest event. It only
        covers what was published during the first pass, so the hold is short.
        """
        self._progress.phase = "catching up"
        self._report()
        try:
            if await self._replay_retried():
                await self._replay_held()
        finally:
            if failed := self._replayer.failed_after_switch:
                self._errors.append(
                    f"{len(failed)} doc(s) failed in the catch-up after the switch: " + ", ".join(sorted(failed)[:10])
                )

    async def _replay_held(self) -> None:
        """The last catch-up pass, with live unversioned writes held."""
        try:
            async with translate_errors("hold of unversioned writes"):
                await self._registry.hold_unversioned(self._owner, self._gen)
        except (BackendUnavailable, ReindexConflict) as exc:
            self._errors.append(
                f"could not hold live writes of transcript turns for the last catch-up ({exc}): a turn "
                "forgotten or corrected while the reindex ran may show an earlier state; publish it again"
            )
            log.error("reindex.hold_failed", error=str(exc))
            if isinstance(exc, BackendUnavailable):  # the hold may have taken, its reply lost
                await self._release_hold()
            return
        log.info("reindex.unversioned_held", generation=self._gen)
        try:
            await self._replay_retried()
        finally:
            await self._release_hold()

    async def _release_hold(self) -> None:
        """End the hold, retried: until then every live batch holding a turn waits (the build
        slot's release at the very end would also end it, after the drop and the graph)."""
        for attempt in range(CATCH_UP_TRIES):
            try:
                async with translate_errors("release of unversioned writes"):
                    await self._registry.release_unversioned(self._owner)
                log.info("reindex.unversioned_released", generation=self._gen)
                return
            except BackendUnavailable as exc:
                log.warning("reindex.hold_release_retried", attempt=attempt + 1, error=str(exc))
                if attempt < CATCH_UP_TRIES - 1:
                    await asyncio.sleep(2.0**attempt)
                else:
                    self._errors.append(
                        f"could not end the hold on live writes of transcript turns ({exc}): they wait until "
                        "the reindex ends"
                    )

    async def _replay_retried(self) -> bool:
        """One catch-up pass to end offsets read now, retried; whether it got there."""
        for attempt in range(CATCH_UP_TRIES):
            try:
                await self._replayer.replay_to_end()
                return True
            except (KafkaError, BackendUnavailable) as exc:
                log.warning("reindex.catch_up_retried", attempt=attempt + 1, error=str(exc))
                if attempt == CATCH_UP_TRIES - 1:
                    self._errors.append(f"catch-up after the switch failed: {exc}")
                    log.error("reindex.catch_up_failed", error=str(exc))
                    return False
                await asyncio.sleep(2.0**attempt)
            except Exception as exc:  # the switch is done: report it, and keep N (drop_old)
                self._errors.append(f"catch-up after the switch failed: {type(exc).__name__}: {exc}")
                log.error("reindex.catch_up_failed", error=str(exc))
                return False
        return False

    async def drop_old(self, accepted: set[tuple[str, str]]) -> bool:
        """Drop N if N+1 holds everything N does (but the ``accepted`` losses); else keep it.

        Returns:
            Whether N was dropped.
        """
        unexpected = [k for k in await self._still_short() if k not in accepted]
        if unexpected:
            await self._mark_old_kept(unexpected)
            return False
        return await self._drop_old_generation()

    async def _still_short(self) -> list[tuple[str, str]]:
        """What N+1 lacks of N, after copying over what it can; unknown counts as lacking."""
        # N takes no writes since the switch: this check is exact. N is dropped only if N+1
        # holds everything N does, summaries and tombstones included (but the losses allowed
        # before the switch); what N+1 lacks is copied over first where it can be.
        source, target = self._source, self._target
        try:
            held = await source.doc_versions()
            await self._sync_summaries_again(held)
            short, copied = await complete(source, target, held, self._carry)
            self._progress.carried += copied
            short += await target.behind(summary_docs(held))
        except Exception as exc:  # unknown is not complete: N stays
            self._errors.append(f"could not bring the new generation level with the old: {type(exc).__name__}: {exc}")
            log.error("reindex.final_check_failed", error=str(exc))
            short = [("?", "?")]
        return short

    async def _sync_summaries_again(self, held: dict[tuple[str, str], DocState]) -> None:
        source, target = self._source, self._target
        for attempt in range(CATCH_UP_TRIES):
            try:
                self._progress.communities += await sync_communities(source, target, self._embedder, held)
                return
            except (KafkaError, BackendUnavailable) as exc:
                if attempt == CATCH_UP_TRIES - 1:
                    raise
                log.warning("reindex.summary_sync_retried", attempt=attempt + 1, error=str(exc))
                await asyncio.sleep(2.0**attempt)

    async def _mark_old_kept(self, unexpected: list[tuple[str, str]]) -> None:
        old = self._old
        shown = ", ".join(f"{t}/{d}" for t, d in unexpected[:10])
        why = (
            f"{len(unexpected)} doc(s) it holds are missing or older in generation {self._gen} ({shown}); they are "
            f"still in generation {old}'s keys"
        )
        self._errors.append(f"generation {old} was kept: {why}. Run `agentmemd reindex` again once the cause is fixed")
        log.error("reindex.old_generation_kept", generation=old, missing=len(unexpected))
        with contextlib.suppress(Exception):  # doctor shows it, and warns against dropping it
            await self._registry.mark_kept(old, why)

    async def _drop_old_generation(self) -> bool:
        source = self._source
        try:
            async with translate_errors("reindex final check"):
                await self._registry.unmark_kept(self._old)
            if self._keep_old:
                return False
            self._progress.phase = "dropping the old generation"
            self._report()
            # Its registry notes go with it, as drop-generation's do: else each reindex would
            # leave a spec entry behind.
            await self._registry.unregister(self._old)
            await source.drop()
            return True
        except Exception as exc:  # the switch is done: reported, never a failed command
            self._errors.append(
                f"generation {self._old} could not be dropped ({type(exc).__name__}: {exc}); "
                f"run `agentmemd drop-generation {self._old}`"
            )
            log.error("reindex.old_generation_drop_failed", generation=self._old, error=str(exc))
            return False
