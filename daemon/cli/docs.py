"""``docs``: generated documentation (the AsyncAPI document)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from daemon.cli._app import _load_settings, app, out

docs_app = typer.Typer(no_args_is_help=True, help="Generated documentation.")
app.add_typer(docs_app, name="docs")


@docs_app.command("asyncapi")
def docs_asyncapi(
    out_path: Annotated[Path | None, typer.Option("--out", help="Write here instead of stdout.")] = None,
    as_yaml: Annotated[bool, typer.Option("--yaml", metavar="")] = False,
) -> None:
    """The AsyncAPI 3.0 document of every topic and message (FastStream's generator)."""
    import yaml

    from daemon.asyncapi import asyncapi_document

    doc = asyncapi_document(_load_settings())
    text = yaml.safe_dump(doc, sort_keys=False) if as_yaml else json.dumps(doc, indent=2)
    if out_path is None:
        sys.stdout.write(text + "\n")
    else:
        out_path.write_text(text + "\n")
        out.print(f"wrote {out_path}")
