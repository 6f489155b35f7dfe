"""The wire contract: models, Kafka subscribers that translate it, and a typed client."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memory.imports import lazy_exports

if TYPE_CHECKING:
    from consumers.client import MemoryClient
    from consumers.config import ConsumerConfig, Topics
    from consumers.errors import QueryFailed, VersionGone, WriteRejected
    from consumers.events import DlqRecord, DocumentEvent, ForgetEvent, TranscriptEvent
    from consumers.requests import ErrorReply, HybridParams, QueryReply, QueryRequest, ResultItem
    from consumers.routers import build_router
    from consumers.threaded_client import ThreadedClient
    from memory.errors import BackendUnavailable, InvalidEvent, InvalidRequest, MemdError, NotFound

# Names load on first use, so importing one light piece (the client, a config model) does not
# pull in the rest (the model, Redis search, FastStream).
_HOMES: dict[str, str] = {
    # The errors a client raises, in one import with the client's own.
    "BackendUnavailable": "memory.errors",
    "InvalidEvent": "memory.errors",
    "InvalidRequest": "memory.errors",
    "MemdError": "memory.errors",
    "NotFound": "memory.errors",
    "ConsumerConfig": "consumers.config",
    "DlqRecord": "consumers.events",
    "DocumentEvent": "consumers.events",
    "ErrorReply": "consumers.requests",
    "ForgetEvent": "consumers.events",
    "HybridParams": "consumers.requests",
    "MemoryClient": "consumers.client",
    "QueryFailed": "consumers.errors",
    "VersionGone": "consumers.errors",
    "WriteRejected": "consumers.errors",
    "QueryReply": "consumers.requests",
    "QueryRequest": "consumers.requests",
    "ResultItem": "consumers.requests",
    "ThreadedClient": "consumers.threaded_client",
    "Topics": "consumers.config",
    "TranscriptEvent": "consumers.events",
    "build_router": "consumers.routers",
}


__getattr__ = lazy_exports(__name__, _HOMES, globals())


__all__ = [
    "BackendUnavailable",
    "ConsumerConfig",
    "DlqRecord",
    "DocumentEvent",
    "ErrorReply",
    "ForgetEvent",
    "HybridParams",
    "InvalidEvent",
    "InvalidRequest",
    "MemdError",
    "MemoryClient",
    "NotFound",
    "QueryFailed",
    "QueryReply",
    "QueryRequest",
    "ResultItem",
    "ThreadedClient",
    "Topics",
    "TranscriptEvent",
    "VersionGone",
    "WriteRejected",
    "build_router",
]
