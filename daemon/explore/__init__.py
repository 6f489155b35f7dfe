"""The memory explorer: read-only pages under ``/explore`` on the daemon's HTTP server.

``access`` (tokens and who sees which tenant), ``reads`` (the index's, graph's, retrieval's
and DLQ's reads), ``routes`` (the aiohttp edge), and pure renderers: ``html`` (the frame),
``views_memory``, ``views_ask``, ``views_graph``, ``views_dlq``; ``dlq`` reads the DLQ.
No page carries a script.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memory.imports import lazy_exports

if TYPE_CHECKING:
    from daemon.explore.access import OPERATOR, Access, Principal, explorer_refusal, is_loopback
    from daemon.explore.config import ExploreConfig
    from daemon.explore.reads import MemoryReads
    from daemon.explore.routes import PRINCIPAL, Explorer

# Names load on first use: the settings (and so every CLI command) import the explorer's
# access rules and config, not its pages, reads and the search they run.
_HOMES: dict[str, str] = {
    "OPERATOR": "daemon.explore.access",
    "Access": "daemon.explore.access",
    "Principal": "daemon.explore.access",
    "explorer_refusal": "daemon.explore.access",
    "is_loopback": "daemon.explore.access",
    "ExploreConfig": "daemon.explore.config",
    "MemoryReads": "daemon.explore.reads",
    "PRINCIPAL": "daemon.explore.routes",
    "Explorer": "daemon.explore.routes",
}

__getattr__ = lazy_exports(__name__, _HOMES, globals())

__all__ = [
    "OPERATOR",
    "PRINCIPAL",
    "Access",
    "ExploreConfig",
    "Explorer",
    "MemoryReads",
    "Principal",
    "explorer_refusal",
    "is_loopback",
]
