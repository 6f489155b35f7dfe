"""The ``agentmemd`` command line: the root ``app`` and one module per command group.

Importing a group's module registers its commands on ``app``; ``agentmemd --help`` lists the
commands, then the groups, in the order they are imported below.
"""

# isort: off
from daemon.cli._app import app
from daemon.cli import servers, query, get, publish, dlq, config, doctor, topics, docs, graph, reindex, mcp  # noqa: F401

# isort: on

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point."""
    app()
