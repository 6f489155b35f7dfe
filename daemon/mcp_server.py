"""``agentmemd mcp``: the memory as MCP tools, over stdio or streamable HTTP.

The tools' logic is ``daemon.mcp_tools``; this module names and describes them for a model,
turns their failures into tool errors, and runs the transports (with a bearer token on HTTP).
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import json
from collections.abc import Awaitable, Mapping, Sequence
from typing import Annotated, Any, Literal

import structlog
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.types import CallToolResult, InputRequiredResult, TextContent
from pydantic import Field, Strict, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from consumers.decoding import validation_reason
from consumers.requests import MAX_WEIGHT
from consumers.spelling import near_spelling
from daemon.about import package_version
from daemon.explore.access import BEARER_CHALLENGE, UNAUTHORIZED
from daemon.mcp_tools import MemoryTools
from daemon.mcp_views import MCP_MAX_CHARS, Noted, ToolFailure
from memory.conversation import MAX_CONTEXT_TURNS, MAX_RECENT_TURNS

log = structlog.get_logger()

INSTRUCTIONS = (
    "Long-term memory shared by agents: documents and conversation turns, searchable by meaning and keywords. "
    "Search before answering questions about past work, decisions or documents; remember facts worth keeping. "
    "Every write is acknowledged once searchable, so a search right after it finds it."
)

SEARCH = (
    "Search long-term memory (documents and past conversation turns) by meaning and keywords; best matches first. "
    "Use it before answering anything that may depend on earlier sessions, decisions, runbooks or notes. "
    "Args: query (natural language or exact identifiers such as error codes; 'I' and 'my' in it mean the user, "
    "'you' and 'your' the assistant, so ask about your own turns as 'you' or by your agent_id); top_k 1..100; "
    "filters: exact metadata matches, e.g. {'agent_id': 'a1'} or {'kind': ['document', 'transcript']} (any of them), "
    "or exclusions, e.g. {'session_id': {'not': 's-7'}} (none of them; a memory without the key passes) "
    "(only keys the daemon indexes, here {keys}: an unknown key is an invalid_request error); "
    "scope: 'chunks' (default), 'communities' (graph summaries of related memories) or 'all'; "
    "since/until: ISO 8601 times or dates, ages such as '24h' or '7d', or 'today', 'yesterday' (UTC days), "
    "bounding when the memory was recorded (a weekday or 'last week' is not read: give its date, "
    "e.g. since and until both '2026-12-01' for that whole day); "
    "context_turns 0..10: each conversation turn found also comes with that many turns before and after it "
    "in its session (context), so you read the exchange, not a fragment; "
    "min_similarity -1..1 (off by default): leave out what the meaning search finds less similar than this, "
    "so a question about nothing remembered returns little or nothing; "
    "recency_weight 0..1000 (0 by default): lift the newer results, for questions about what holds now "
    "(a newer result passes an older one that matches up to 1 + weight times as well: about 0.5 puts an update "
    "worded like the question first; it reorders only the top_k found, so ask for 10 or more when an update may "
    "rank below older mentions); "
    "fold_repeats (true by default): a text that later results repeat word for word comes once; "
    "max_per_doc (the daemon's default, 3; 0 no limit): most passages of one long document among the results "
    "while other memories match (ask with 0, or get_document, to read one document's passages). "
    "Returns results with text, score, source, doc_id, kind, metadata, timestamp and ranks (the rank each list "
    "gave it: sparse its words, dense its meaning, identifier an identifier it names, speaker a speaker the query "
    "names, recency its time; without sparse, its words were not among the best matches of the query's) "
    "(and context); a result "
    "whose text others repeat lists them, newest first (repeats: doc_id, timestamp; repeat_count)."
)
REMEMBER = (
    "Record one observation or conversation turn in long-term memory, for this and other agents to find later "
    "with search_memory (searchable as soon as this returns). Give agent_id and session_id to group it; role is "
    "who said it (assistant, user, tool...). Leave turn unset: the next free turn of the session is used "
    "(never one another writer took); a turn given replaces whatever that turn held, unless if_absent is true "
    "(then it is written only if that turn holds nothing else). If the call times out, its error names the "
    "turn it sent: call again with that turn and if_absent true (stored once), not without a turn (stored "
    "twice). timestamp (ISO 8601, an age such as '2h', or 'yesterday'; optional) is when it was said, "
    "for importing past conversations; now by default. "
    "Returns the acknowledgement (status 'indexed', doc_id, turn)."
)
UPSERT = (
    "Store or replace a whole document (notes, a runbook, a file's text) under doc_id; a later upsert of the same "
    "doc_id replaces it; get_document with history=true reads what it said before. timestamp (ISO 8601, optional) "
    "is when it was written, for imports; now by default. Searchable as soon as this returns. "
    "Returns the acknowledgement (status, doc_id, version)."
)
DELETE = "Delete the document doc_id from memory (it is no longer found). Returns the acknowledgement."
FORGET = (
    "Forget every remembered turn of one session of an agent (session_id), only one turn of it "
    "(session_id and turn), or all its sessions (all_sessions=true, session_id unset). Irreversible. "
    "Returns the acknowledgement."
)
GET = (
    "Read one document (or a turn, by its doc_id such as 'transcript:agent/session/3'): status "
    "'found' with content, version and metadata, 'not_found', or 'writing' (being replaced: ask again shortly). "
    "history=true also returns a document's earlier versions, newest first, each with its content and the time "
    "it held from (timestamp) and until: what it said before it was changed. version reads that version, current "
    "or kept in the history. At most max_chars characters of the content come back (default 50,000): a longer "
    "one comes cut, with content_truncated true and read_on, the content_offset and version to call again with "
    "for the next part."
)
RECENT = (
    "Read an agent's latest conversation turns, whole and oldest first: of one session (session_id), or "
    "across all its sessions. Use it to pick up where a session left off. limit 1..100 (default 20). Each "
    "turn has its doc_id, content, timestamp and metadata (role, turn, session_id)."
)
STATUS = (
    "Check whether the memory daemon answers (a round trip over Kafka) and, if it serves HTTP, its readiness "
    "checks (Redis, index, Kafka consumers). Use it when other memory tools fail."
)


Rows = list[dict[str, Any]]
#: A flag is true or false: pydantic's lax reading would also take "yes", "off" or 1.
StrictFlag = Annotated[bool, Strict()]
#: A count is a whole number: lax reading took "3" as 3 (a turn number "3" replaced turn 3) and true as 1.
StrictCount = Annotated[int, Strict()]
#: The most results a tool returns: the daemon's default ``max_top_k``, and more than a host
#: model's context holds well. Ask over Kafka for more, from a daemon configured for it.
MCP_MAX_TOP_K = 100
Doc = dict[str, Any]


async def _run(call: Awaitable[Any], *, wrap: bool = False) -> CallToolResult:
    """A tool's result: its JSON (as text and structured), or its ToolFailure as an isError
    result whose text starts with the contract's error code. Built here rather than raised
    as the SDK's ToolError, which prefixes every message with "Error executing tool"."""
    try:
        value = await call
    except ToolFailure as exc:
        return CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)
    notes = []
    if isinstance(value, Noted):
        # Beside the JSON, where a model reads it; the structured result keeps its schema.
        value, notes = value.value, [TextContent(type="text", text=value.note)]
    text = json.dumps(value, ensure_ascii=False, default=str)
    return CallToolResult(
        content=[TextContent(type="text", text=text), *notes],
        structured_content={"result": value} if wrap else value,
    )


class _Server(MCPServer[Any]):
    """The SDK's server, with arguments that fail the tools' schema reported as the other
    failures are: ``invalid_request: <tool>: <field>: <problem>``, not pydantic's whole dump."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Each tool's argument names: the SDK reads past any other, so ``filter`` for
        #: ``filters`` would search unfiltered.
        self.arguments: dict[str, tuple[str, ...]] = {}

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Any = None
    ) -> CallToolResult | InputRequiredResult:
        """The SDK's call, with an unknown argument or a schema failure of the arguments as a
        tool error in our words."""
        if (why := unknown_arguments(arguments or {}, self.arguments.get(name))) is not None:
            text = f"invalid_request: {name}: {why}"
            return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc, UnexpectedToolError) or not isinstance(exc.__cause__, ValidationError):
                raise
            text = f"invalid_request: {name}: {validation_reason(exc.__cause__, root='arguments')}"
            return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def build_server(tools: MemoryTools) -> MCPServer[Any]:
    """The MCP server whose tools are ``tools``'."""
    server = _Server("agentmem", instructions=INSTRUCTIONS, version=package_version(), log_level="WARNING")

    async def search_memory(
        query: str,
        top_k: Annotated[StrictCount, Field(ge=1, le=MCP_MAX_TOP_K)] = 10,
        # Objects of any key: the daemon names a wrong one ({"nope": ...}) in a sentence, where
        # the SDK's own check of a Literal key dumped every shape of the union.
        filters: dict[str, str | list[str] | dict[str, str | list[str]]] | None = None,
        scope: Literal["chunks", "communities", "all"] = "chunks",
        since: str | None = None,
        until: str | None = None,
        context_turns: Annotated[StrictCount, Field(ge=0, le=MAX_CONTEXT_TURNS)] = 0,
        min_similarity: Annotated[float | None, Field(ge=-1.0, le=1.0, allow_inf_nan=False)] = None,
        recency_weight: Annotated[float | None, Field(ge=0.0, le=MAX_WEIGHT, allow_inf_nan=False)] = None,
        fold_repeats: StrictFlag = True,
        max_per_doc: Annotated[StrictCount | None, Field(ge=0, le=MCP_MAX_TOP_K)] = None,
    ) -> Annotated[CallToolResult, Rows]:
        return await _run(
            tools.search_memory(
                query,
                top_k,
                filters,
                scope,
                since,
                until,
                context_turns,
                min_similarity,
                recency_weight,
                fold_repeats,
                max_per_doc,
            ),
            wrap=True,
        )

    async def remember(
        text: str,
        agent_id: str,
        session_id: str,
        role: str = "assistant",
        turn: StrictCount | None = None,
        metadata: dict[str, Any] | None = None,
        timestamp: str | None = None,
        if_absent: StrictFlag = False,
    ) -> Annotated[CallToolResult, Doc]:
        return await _run(tools.remember(text, agent_id, session_id, role, turn, metadata, timestamp, if_absent))

    async def upsert_document(
        doc_id: str, content: str, metadata: dict[str, Any] | None = None, timestamp: str | None = None
    ) -> Annotated[CallToolResult, Doc]:
        return await _run(tools.upsert_document(doc_id, content, metadata, timestamp))

    async def delete_document(doc_id: str) -> Annotated[CallToolResult, Doc]:
        return await _run(tools.delete_document(doc_id))

    async def forget(
        agent_id: str,
        session_id: str | None = None,
        all_sessions: StrictFlag = False,
        turn: Annotated[StrictCount | None, Field(ge=0)] = None,
    ) -> Annotated[CallToolResult, Doc]:
        return await _run(tools.forget(agent_id, session_id, all_sessions, turn))

    async def get_document(
        doc_id: str,
        history: StrictFlag = False,
        version: Annotated[StrictCount, Field(ge=0)] | None = None,
        content_offset: Annotated[StrictCount, Field(ge=0)] = 0,
        max_chars: Annotated[StrictCount, Field(ge=1)] = MCP_MAX_CHARS,
    ) -> Annotated[CallToolResult, Doc]:
        return await _run(tools.get_document(doc_id, history, version, content_offset, max_chars))

    async def recent_turns(
        agent_id: str,
        session_id: str | None = None,
        limit: Annotated[StrictCount, Field(ge=1, le=MAX_RECENT_TURNS)] = 20,
    ) -> Annotated[CallToolResult, Rows]:
        return await _run(tools.recent_turns(agent_id, session_id, limit), wrap=True)

    async def memory_status() -> Annotated[CallToolResult, Doc]:
        return await _run(tools.memory_status())

    for fn, description in (
        (search_memory, SEARCH.replace("{keys}", ", ".join(tools.filter_keys))),
        (remember, REMEMBER),
        (upsert_document, UPSERT),
        (delete_document, DELETE),
        (forget, FORGET),
        (get_document, GET),
        (recent_turns, RECENT),
        (memory_status, STATUS),
    ):
        server.add_tool(fn, name=fn.__name__, description=description)
        server.arguments[fn.__name__] = tuple(inspect.signature(fn).parameters)
    return server


def unknown_arguments(arguments: Mapping[str, Any], known: Sequence[str] | None) -> str | None:
    """Why ``arguments`` hold one a tool taking ``known`` does not (None: they do not, or
    the tool is not ours to check), naming a near spelling or else what it takes."""
    if known is None:
        return None
    unknown = [a for a in arguments if a not in known]
    if not unknown:
        return None
    first = unknown[0]
    near = near_spelling(first, [k for k in known if k not in arguments])
    hint = f"did you mean {near!r}?" if near else f"it takes {', '.join(known) or 'none'}"
    more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
    return f"unknown argument {first!r}{more}: {hint}"


class BearerAuth:
    """ASGI middleware: every request needs ``Authorization: Bearer <token>``, else 401."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self._app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or ()).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                body = json.dumps(UNAUTHORIZED).encode()
                headers = [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", BEARER_CHALLENGE.encode()),
                    (b"content-length", str(len(body)).encode()),
                ]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self._app(scope, receive, send)


async def serve_stdio(tools: MemoryTools) -> None:
    """Serve the tools on stdin/stdout until stdin closes."""
    try:
        await build_server(tools).run_stdio_async()
    finally:
        await tools.close()


async def serve_http(tools: MemoryTools, *, host: str, port: int, token: str) -> None:
    """Serve the tools over streamable HTTP at ``http://host:port/mcp`` until interrupted."""
    app: ASGIApp = build_server(tools).streamable_http_app(host=host)
    if token:
        app = BearerAuth(app, token)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
    serving = asyncio.ensure_future(server.serve())
    try:
        # Said once the port is bound: a port already taken ends the serve before it starts.
        while not server.started and not serving.done():
            await asyncio.wait({serving}, timeout=0.05)
        if server.started:
            log.info("mcp.http_started", url=f"http://{host}:{port}/mcp", auth=bool(token))
        await serving
    finally:
        await tools.close()
