"""The wire contract: models, Kafka subscribers that translate it, and a typed client."""

from consumers.client import MemoryClient, QueryFailed
from consumers.config import ConsumerConfig, Topics
from consumers.models import (
    DlqRecord,
    DocumentEvent,
    ErrorReply,
    ForgetEvent,
    HybridParams,
    QueryReply,
    QueryRequest,
    ResultItem,
    TranscriptEvent,
)
from consumers.routers import build_router

__all__ = [
    "ConsumerConfig",
    "DlqRecord",
    "DocumentEvent",
    "ErrorReply",
    "ForgetEvent",
    "HybridParams",
    "MemoryClient",
    "QueryFailed",
    "QueryReply",
    "QueryRequest",
    "ResultItem",
    "Topics",
    "TranscriptEvent",
    "build_router",
]
