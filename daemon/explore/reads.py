"""What the explorer reads, through the index's, the graph's and the retrieval's own APIs.

Every read names its tenant; which tenants a request may name is the routes' check
(``daemon.explore.access``). A question runs the path the Kafka query handler runs: the
request is validated as the contract's ``QueryRequest`` and answered by ``ScopedSearch``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from consumers.encoding import iso
from consumers.queries import parse_request, to_spec
from consumers.requests import QueryRequest
from consumers.times import when
from daemon.dlq_marks import ReplayMark
from daemon.explore.dlq import DeadLetter, DlqCache, erased_letter, recent_dead_letters
from daemon.explore.views_ask import AskForm, leg_only_ids, parse_filters
from daemon.explore.views_memory import TenantRow
from graph import Community, ScopedSearch, StaleItem, TenantGraphs
from memory.errors import InvalidRequest
from memory.index import MAX_PAGE, ChunkIndex, ChunkPage, Group, PageKey
from memory.index.history import Version
from memory.records import DEFAULT_TENANT, StoredChunk
from memory.retrieval import Retriever
from memory.search_results import SearchOutcome
from memory.tenants import Erasure

if TYPE_CHECKING:
    from daemon.settings import Settings
    from daemon.status import StatusState


@dataclass(frozen=True, slots=True)
class Answer:
    """A question's outcome and what explains it."""

    outcome: SearchOutcome
    stale: dict[str, bool]
    weights: dict[str, float]
    rrf_k: int
    texts: dict[str, str]  # the legs' shown candidates that are not results: chunk id -> text


@dataclass(frozen=True, slots=True)
class GraphView:
    """A tenant's communities and stale queue."""

    communities: list[Community]
    stale: dict[str, StaleItem | None]  # every stale community; its details where listed
    depth: int
    history: list[tuple[float, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class CommunityView:
    """One community with its summary, members' names and stale state."""

    community: Community | None
    summary: dict[str, Any] | None
    members: dict[str, tuple[str, str]]
    item: StaleItem | None
    stale: bool


class MemoryReads:
    """The explorer's reads over one daemon's index, search, graph, status and settings."""

    def __init__(
        self,
        *,
        index: ChunkIndex,
        retriever: Retriever,
        search: ScopedSearch,
        graph: TenantGraphs | None,
        status: StatusState,
        settings: Settings,
        erased: Callable[[], Awaitable[Mapping[str, Erasure]]] | None = None,
        replay_marks: Callable[[], Awaitable[Mapping[str, ReplayMark]]] | None = None,
    ) -> None:
        self.index = index
        self._erased = erased  # topic tenancy: the erased tenants (their rows, their dead letters never shown)
        self._replay_marks = replay_marks  # which dead letters `dlq replay` sent again
        self._retriever = retriever
        self._search = search
        self._graph = graph
        self._status = status
        self.settings = settings
        self.dlq_cache = DlqCache()

    async def tenants(self) -> list[str]:
        """Every tenant: ``default`` alone in single tenancy; in topic tenancy those the graph
        layer has seen (every daemon records them), else those the chunks name."""
        if self.settings.consumer.tenancy == "single":
            return [DEFAULT_TENANT]
        if self._graph is not None:
            return await self._graph.tenants()
        return [g.value for g in await self.index.groups("tenant", {}, limit=MAX_PAGE)]

    async def tenant_rows(self, tenants: Sequence[str]) -> list[TenantRow]:
        """Chunk counts per kind of each tenant (count-only queries: no chunk is read); a
        tenant erased and not started anew says when instead (it holds nothing)."""
        erased = await self._erased() if self._erased is not None else {}
        rows = []
        for t in tenants[:MAX_PAGE]:
            if (gone := erased.get(t)) is not None and not gone.restored:
                rows.append(TenantRow(t, 0, 0, 0, erased_at=gone.at))
                continue
            counts = [
                await self.index.count_where({"tenant": t, "kind": k}) for k in ("document", "transcript", "community")
            ]
            rows.append(TenantRow(t, *counts))
        return rows

    async def groups(
        self, what: str, tenant: str, *, offset: int, limit: int, agent: str | None = None
    ) -> tuple[list[Group], int | None]:
        """A page of agents, sessions (of ``agent``) or documents, and the next page's offset."""
        if what == "agents":
            found = await self.index.agents(tenant, limit=limit + 1, offset=offset)
        elif what == "documents":
            found = await self.index.documents(tenant, limit=limit + 1, offset=offset)
        else:  # an agent's sessions: grouped from its chunks
            where = {"agent_id": agent} if agent is not None else None
            found = await self.index.groups(
                "session_id", {"tenant": tenant, "kind": "transcript"}, limit=limit + 1, offset=offset, where=where
            )
        return found[:limit], offset + limit if len(found) > limit else None

    async def turns(self, tenant: str, agent: str, session: str, start: PageKey | None, limit: int) -> ChunkPage:
        """A session's turn chunks in time order."""
        tags = {"tenant": tenant, "kind": "transcript", "agent_id": agent, "session_id": session}
        return await self.index.chunk_page(tags, limit=limit, start=start, order="asc")

    async def timeline(self, tenant: str, start: PageKey | None, limit: int) -> ChunkPage:
        """A tenant's chunks, newest first."""
        return await self.index.chunk_page({"tenant": tenant}, limit=limit, start=start, order="desc")

    async def document(
        self, tenant: str, doc_id: str, offset: int, limit: int
    ) -> tuple[list[StoredChunk], int, list[Version]]:
        """``limit`` of a document's (or a turn's) stored chunks in order from ``offset``, how
        many it has, and on the first page its earlier versions, newest first (those older
        than the chunks read: a write in between pushed theirs)."""
        chunks = (await self.index.turns([doc_id], tenant, page=(offset, limit))).get(doc_id, [])
        total = await self.index.chunk_count(doc_id, tenant)
        if not chunks or chunks[0].kind != "document" or offset:
            return chunks, total, []
        current = {doc_id: chunks[0].version or 0}
        return chunks, total, (await self.index.history([doc_id], tenant, current=current)).get(doc_id, [])

    async def ask(self, form: AskForm, tenant: str) -> Answer:
        """Answer the form's question as the Kafka query handler would, and read why.

        Raises:
            InvalidRequest: what the contract's validation or the retrieval refuses.
            BackendUnavailable: Redis is unreachable.
        """
        body: dict[str, Any] = {"query_id": "explore", "search_text": form.q, "scope": form.scope}
        body["top_k"] = _number(form.k or "10", "k (results)", int)
        hybrid: dict[str, Any] = {}
        for name, value in (
            ("dense_weight", form.dense),
            ("sparse_weight", form.sparse),
            ("identifier_weight", form.identifier),
            ("recency_weight", form.recency),
            ("speaker_weight", form.speaker),
        ):
            if value.strip():
                hybrid[name] = _number(value, name, float)
        if form.rrf_k.strip():
            hybrid["rrf_k_constant"] = _number(form.rrf_k, "rrf_k", int)
        body["hybrid_params"] = hybrid
        if form.filters.strip():
            body["metadata_filter"] = parse_filters(form.filters)
        times = {name: when(value, name) for name, value in (("since", form.since), ("until", form.until))}
        if window := {name: iso(t) for name, t in times.items() if t is not None}:
            body["time_range"] = window
        # The Kafka handler's own parsing: its reasons, not pydantic's dump.
        req = parse_request(json.dumps(body).encode())
        if not isinstance(req, QueryRequest):
            raise InvalidRequest("the explorer asks searches only")
        spec = to_spec(req, tenant)
        outcome, stale = await self._search.search(spec, req.scope)
        weights, rrf_k = self._retriever.weights(spec)
        wanted = [outcome.candidates[c] for c in leg_only_ids(outcome, spec.top_k) if c in outcome.candidates]
        chunks, _ = await self.index.hydrate(wanted, [])
        texts = {h.chunk_id: c.text for h, c in zip(wanted, chunks, strict=True) if c is not None}
        return Answer(outcome, stale, weights, rrf_k, texts)

    async def graph(self, tenant: str) -> GraphView | None:
        """The tenant's communities and stale queue; None when the graph layer is off."""
        if self._graph is None:
            return None
        store = self._graph.store(tenant)
        communities = await store.named(await store.communities())
        depth, items = await store.stale(limit=MAX_PAGE)
        flags = await store.is_stale([c.id for c in communities])
        listed = {i.community_id: i for i in items}
        stale: dict[str, StaleItem | None] = {cid: listed.get(cid) for cid, on in flags.items() if on}
        history = list(self._status.tenant_history.get(tenant, ()))
        return GraphView(communities, stale, depth, history)

    async def community(self, tenant: str, cid: str) -> CommunityView | None:
        """One community; None when the graph layer is off."""
        if self._graph is None:
            return None
        store = self._graph.store(tenant)
        community = await store.community(cid)
        if community is None:
            return CommunityView(None, None, {}, None, False)
        members = await store.nodes(sorted(community.members)[:500])
        is_stale = (await store.is_stale([cid])).get(cid, False)
        item = None
        if is_stale:
            _, items = await store.stale(limit=MAX_PAGE)
            item = next((i for i in items if i.community_id == cid), None)
        return CommunityView(community, await store.summaries.get(cid), members, item, is_stale)

    async def dead_letters(self) -> tuple[list[DeadLetter], int]:
        """The DLQ's recent records (``ExploreConfig.dlq_records`` a partition), newest first,
        and how many of them were left out as erased tenants'.

        Raises:
            BackendUnavailable: the broker could not be asked.
        """
        s = self.settings
        letters = await recent_dead_letters(
            bootstrap=s.kafka_bootstrap,
            topic=s.topics.dlq,
            options=s.kafka_security.aiokafka_kwargs(),
            limit=s.explore.dlq_records,
            wait_s=s.explore.dlq_wait_s,
            bases=(s.topics.documents, s.topics.transcripts, s.topics.requests),
            tenancy=s.consumer.tenancy,
            cache=self.dlq_cache,
        )
        if self._erased is None:
            return letters, 0
        erased = await self._erased()
        shown = [d for d in letters if not erased_letter(d, erased)]
        return shown, len(letters) - len(shown)

    async def replay_marks(self) -> Mapping[str, ReplayMark]:
        """Which dead letters were sent again (``daemon.dlq_marks``).

        Raises:
            BackendUnavailable: Redis is unreachable.
        """
        return {} if self._replay_marks is None else await self._replay_marks()

    def now(self) -> float:
        """The clock the pages' ages are measured by."""
        return time.time()


def _number(value: str, what: str, kind: type[int] | type[float]) -> Any:
    """A form field as a number.

    Raises:
        InvalidRequest: it is none, naming the field.
    """
    try:
        return kind(value.strip())
    except ValueError:
        raise InvalidRequest(f"{what} is no {'whole ' if kind is int else ''}number: {value!r}") from None
