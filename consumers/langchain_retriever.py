"""A LangChain ``BaseRetriever`` on the daemon's hybrid search (docs/langchain.md).

Needs ``langchain-core`` (the ``langgraph`` extra installs it); nothing else in the project
imports this module.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from consumers.client import MemoryClient
from consumers.requests import MAX_WEIGHT, QueryReply, ResultItem
from consumers.threaded_client import ThreadedClient
from consumers.times import when
from memory.conversation import MAX_CONTEXT_TURNS
from memory.errors import InvalidRequest

#: Result fields copied into each Document's metadata (they win over a memory's own keys of the same name).
RESULT_FIELDS = ("doc_id", "chunk_id", "source", "kind", "timestamp")


def to_document(result: ResultItem) -> Document:
    """One search result as a LangChain ``Document``: the chunk's text, its metadata, and ours
    (``doc_id``, ``chunk_id``, ``source``, ``kind``, ``timestamp``, ``score``, ``ranks``, a
    document chunk's ``section`` (the headings it falls under; None where it has none), a conversation
    turn's ``context`` when asked with ``context_turns``, and the ``repeats`` of its text when
    lower-ranked memories said it word for word)."""
    metadata: dict[str, Any] = dict(result.metadata)
    metadata.update({name: getattr(result, name) for name in RESULT_FIELDS})
    metadata.update(score=result.rrf_score, ranks=dict(result.ranks))
    metadata["section"] = result.section  # None too: a memory's own "section" never stands for it
    if result.context is not None:
        metadata["context"] = [t.model_dump() for t in result.context]
    if result.repeats is not None:
        metadata["repeats"] = [r.model_dump() for r in result.repeats]
        metadata["repeat_count"] = result.repeat_count
    return Document(page_content=result.text, metadata=metadata, id=result.chunk_id)


class MemoryRetriever(BaseRetriever):
    """Documents from agentmemd's hybrid search (BM25 + vector, fused), best first."""

    # A mistyped argument is an error, not a setting silently ignored.
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    client: ThreadedClient
    """The connection (its ``MemoryClient`` settings carry the tenant)."""
    top_k: int = Field(5, ge=1, le=100)
    metadata_filter: dict[str, str | list[str] | dict[str, str | list[str]]] | None = None
    """Filterable keys only (docs/contract.md); keys AND, a list ORs its values."""
    scope: Literal["chunks", "communities", "all"] = "chunks"
    dense_weight: float | None = Field(None, ge=0.0, le=MAX_WEIGHT)
    sparse_weight: float | None = Field(None, ge=0.0, le=MAX_WEIGHT)
    identifier_weight: float | None = Field(None, ge=0.0, le=MAX_WEIGHT)
    recency_weight: float | None = Field(None, ge=0.0, le=MAX_WEIGHT)
    speaker_weight: float | None = Field(None, ge=0.0, le=MAX_WEIGHT)
    """Each leg's or list's weight (docs/contract.md); None: the daemon's default."""
    min_similarity: float | None = Field(None, ge=-1.0, le=1.0)
    """The vector leg keeps only candidates this similar (cosine) to the question; None: the daemon's default."""
    since: datetime | str | None = None
    until: datetime | str | None = None
    """Only memories recorded in this window: a datetime, an ISO 8601 string, or an age such as
    ``"7d"`` (read anew at each call: the last seven days)."""
    context_turns: int = Field(0, ge=0, le=MAX_CONTEXT_TURNS)
    """Each conversation turn also brings this many turns before and after it (``metadata["context"]``)."""
    fold_repeats: bool = True
    """A text that later results repeat word for word comes once, with ``metadata["repeats"]``."""
    max_per_doc: int | None = Field(None, ge=0)
    """Most results of one document while other documents' are found (0: no limit); None: the daemon's default."""

    @field_validator("since", "until")
    @classmethod
    def _a_time(cls, value: datetime | str | None, info: ValidationInfo) -> datetime | str | None:
        try:
            when(value, info.field_name or "time")  # refused now, not at the first question
        except InvalidRequest as exc:
            raise ValueError(str(exc)) from None
        return value

    async def _ask(self, c: MemoryClient, query: str) -> QueryReply:
        return await c.query(
            query,
            top_k=self.top_k,
            metadata_filter=self.metadata_filter,
            scope=self.scope,
            dense_weight=self.dense_weight,
            sparse_weight=self.sparse_weight,
            identifier_weight=self.identifier_weight,
            recency_weight=self.recency_weight,
            speaker_weight=self.speaker_weight,
            min_similarity=self.min_similarity,
            since=self.since,
            until=self.until,
            context_turns=self.context_turns,
            fold_repeats=self.fold_repeats,
            max_per_doc=self.max_per_doc,
        )

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        reply = self.client.call(lambda c: self._ask(c, query))
        return [to_document(r) for r in reply.results]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        reply = await self.client.acall(lambda c: self._ask(c, query))
        return [to_document(r) for r in reply.results]


__all__ = ["MemoryRetriever", "to_document"]
