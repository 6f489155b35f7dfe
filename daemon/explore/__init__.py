"""The memory explorer: read-only pages under ``/explore`` on the daemon's HTTP server.

``access`` (tokens and who sees which tenant), ``reads`` (the index's, graph's, retrieval's
and DLQ's reads), ``routes`` (the aiohttp edge), and pure renderers: ``html`` (the frame),
``views_memory``, ``views_ask``, ``views_graph``, ``views_dlq``; ``dlq`` reads the DLQ.
No page carries a script.
"""

from daemon.explore.access import OPERATOR, Access, Principal, explorer_refusal, is_loopback
from daemon.explore.config import ExploreConfig
from daemon.explore.reads import MemoryReads
from daemon.explore.routes import PRINCIPAL, Explorer

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
