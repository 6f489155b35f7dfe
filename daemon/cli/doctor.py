"""``doctor``: check every dependency, and say how to fix what fails."""

from __future__ import annotations

import asyncio

import typer
from rich.markup import escape

from daemon.cli._app import app, err, out, settings_problem
from daemon.logging import configure_logging


@app.command()
def doctor() -> None:
    """Check settings, Redis, the index schema, Kafka, topics and consumer groups; exit 0 only when healthy."""
    from daemon.doctor import diagnose

    settings, problem = settings_problem()
    if settings is None:
        err.print(f"[red]✗ settings[/red]: {escape(problem)}")
        raise typer.Exit(code=1)
    configure_logging("error", settings.log_format)
    findings = asyncio.run(diagnose(settings))
    for f in findings:
        mark = "[green]✓[/green]" if f.ok else "[red]✗[/red]"
        out.print(f"{mark} {f.check}: {f.detail}")
        if not f.ok and f.fix:
            out.print(f"    fix: {f.fix}")
    if not all(f.ok for f in findings):
        raise typer.Exit(code=1)
