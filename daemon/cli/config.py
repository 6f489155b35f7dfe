"""``config``: every setting as TOML, Markdown or JSON, and the index schema they create."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from daemon.cli._app import _load_settings, app
from daemon.settings import render_markdown, render_toml
from memory.config import PACKAGED_DIMS

config_app = typer.Typer(no_args_is_help=True, help="Show configuration.")
app.add_typer(config_app, name="config")


@config_app.command("toml")
def config_toml() -> None:
    """Print every setting with its default and meaning, as TOML."""
    sys.stdout.write(render_toml())


@config_app.command("markdown")
def config_markdown() -> None:
    """Print every setting with its env name, default and meaning, as docs/configuration.md."""
    sys.stdout.write(render_markdown())


@config_app.command("index-schema")
def config_index_schema(
    dims: Annotated[int, typer.Option(help="Vector dimensions of the model.")] = PACKAGED_DIMS,
    generation: Annotated[int, typer.Option(help="Whose index and key names to print.", min=1)] = 1,
) -> None:
    """Print the Redis index schema (redisvl YAML) that the current settings create."""
    import yaml

    from memory.schema import index_schema

    # Offline (no Redis): which generation is active is for `agentmemd doctor` to say; after a
    # reindex it is no longer 1, and a bare "agentmem-g1" read as the live index's name.
    sys.stdout.write(
        f"# generation {generation}'s names (--generation N for another; `agentmemd doctor` names the active one)\n"
    )
    schema = index_schema(_load_settings().index, dims=dims, generation=generation)
    sys.stdout.write(yaml.safe_dump(schema, sort_keys=False))


@config_app.command("show")
def config_show() -> None:
    """Print the effective settings as JSON."""
    print(json.dumps(_load_settings().model_dump(mode="json"), indent=2))
