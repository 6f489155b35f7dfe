"""``reindex`` and ``drop-generation``: index generations."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.progress import Progress

from daemon.cli._app import _fail, _settings, _with_redis, app, err, out
from memory.errors import MemdError


def _since_ms(value: str | None) -> int | None:
    """``--since``: Unix milliseconds, or an ISO 8601 time (UTC when it names no zone)."""
    if value is None:
        return None
    if value.isdigit():
        return int(value)
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(value)
    except ValueError as exc:
        raise typer.BadParameter(f"{value!r} is neither Unix milliseconds nor an ISO 8601 time") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


@app.command("drop-generation")
def drop_generation(
    generation: Annotated[int, typer.Argument(help="The generation to drop (doctor lists those kept).")],
    force: Annotated[
        bool,
        typer.Option(
            "--force", metavar="", help="Drop even one a reindex kept because the live one lacks some of its docs."
        ),
    ] = False,
) -> None:
    """Drop an index generation kept beside the active one: its index and keys. Never the
    active one, nor one a running reindex is building."""
    from daemon.reindex import drop_generation as run_drop

    keys = _with_redis(lambda settings, client: run_drop(settings, client, generation, force=force))
    out.print(f"generation {generation} dropped ({keys} keys)")


@app.command()
def reindex(
    since: Annotated[
        str | None, typer.Option(help="Replay from this time (ISO 8601 or Unix ms) instead of the earliest offset.")
    ] = None,
    keep_old: Annotated[
        bool, typer.Option("--keep-old", metavar="", help="Keep the old generation after the switch.")
    ] = False,
    allow_losses: Annotated[
        bool,
        typer.Option(
            "--allow-losses", metavar="", help="Switch even if docs the live generation serves failed in the new build."
        ),
    ] = False,
) -> None:
    """Rebuild the index from Kafka with the current settings into a new generation, then switch
    queries to it atomically. The old generation serves queries until the switch."""
    from daemon.reindex import ReindexProgress
    from daemon.reindex import reindex as run_reindex

    # The progress bar and the summary say what a line per replayed doc would, thousands of times over.
    settings = _settings(quiet=True)
    phases: list[str] = []
    # No bar where no terminal draws it: a file got its last frame.
    with Progress(console=err, transient=False, disable=not err.is_terminal) as bar:
        task = bar.add_task("starting", total=None)

        def show(p: ReindexProgress) -> None:
            bar.update(
                task,
                description=f"generation {p.generation}: {p.phase}",
                total=p.total or None,
                completed=p.done,
            )
            if phases[-1:] == [p.phase]:
                return
            phases.append(p.phase)
            if not err.is_terminal:  # no bar drawn: each phase gets its line, as it starts
                err.print(f"generation {p.generation}: {p.phase}")
            if p.phase == "switched" and p.settings_changed:
                # Said now: queries of daemons on the old settings fail from here, not from the end.
                err.print(
                    f"[yellow]switched:[/yellow] generation {p.generation} serves queries now; daemons still running "
                    "with the old settings answer `unavailable` from here on: restart them with these"
                )

        try:
            rep = asyncio.run(
                run_reindex(
                    settings, since_ms=_since_ms(since), keep_old=keep_old, allow_losses=allow_losses, on_progress=show
                )
            )
        except MemdError as exc:
            raise _fail(exc) from exc
    p = rep.progress
    out.print(
        f"generation {rep.new_generation} is live (was {rep.old_generation}): {p.done} records replayed, "
        f"{p.applied} applied, {p.skipped} superseded, {p.invalid} invalid, {p.failed} failed, "
        f"{p.communities} summaries copied, {rep.chunks} chunks, {rep.took_s:.1f}s"
        + (f", {p.erased} of erased tenants left out" if p.erased else "")
        + (f", {p.carried} docs carried over from the old generation" if p.carried else "")
        + (f", {p.graph_docs} graph docs re-pointed to the new chunks" if p.graph_docs else "")
        + ("" if rep.old_dropped else f"; generation {rep.old_generation} kept")
    )
    if rep.settings_changed:
        err.print(
            "[yellow]note:[/yellow] it was built with other settings than the old generation: daemons still "
            "running with the old ones (or an older release) now refuse writes and vector queries until "
            "restarted with these; those that refused the old generation use this one now, unrestarted. "
            "Under `agentmemd up`, a restart forgets the events they had not applied (docs/reindex.md)."
        )
    for e in rep.errors:
        err.print(f"[yellow]warning:[/yellow] {e}")
    if rep.errors:
        # Live, but not finished as asked (a catch-up, a drop or the graph left to redo):
        # scripts must not read this as a clean success.
        raise typer.Exit(code=2)
