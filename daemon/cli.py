"""The ``agentmemd`` command line."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console, Group
from rich.padding import Padding
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from consumers.client import MemoryClient, QueryFailed
from consumers.decoding import validation_reason
from consumers.models import QueryReply
from daemon.app import run_until_stopped
from daemon.connections import kafka_options, redis_client
from daemon.launcher import embedded_servers
from daemon.logging import configure_logging
from daemon.settings import Settings, render_markdown, render_toml
from memory.errors import InvalidEvent, MemdError
from memory.records import DEFAULT_TENANT

T = TypeVar("T")

app = typer.Typer(no_args_is_help=True, add_completion=False, help="agent-memory-daemon: long-term memory for agents.")
publish_app = typer.Typer(no_args_is_help=True, help="Publish documents, deletes and observations.")
config_app = typer.Typer(no_args_is_help=True, help="Show configuration.")
app.add_typer(publish_app, name="publish")
app.add_typer(config_app, name="config")

out = Console()
err = Console(stderr=True)


def _load_settings() -> Settings:
    """The settings, or a clean failure naming each invalid one (not a traceback)."""
    try:
        return Settings()
    except ValidationError as exc:
        problems = validation_reason(exc, root="settings")
        raise _fail(ValueError(f"invalid settings ({exc.error_count()}): {problems}")) from None


def _settings() -> Settings:
    settings = _load_settings()
    configure_logging(settings.log_level, settings.log_format)
    return settings


def _run_with_signals(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    asyncio.run(runner())


def _fail(exc: Exception) -> typer.Exit:
    err.print(f"[red]error:[/red] {exc}")
    return typer.Exit(code=1)


def _embedded(settings: Settings) -> Any:
    """The embedded servers as the settings describe them (`up`, `servers`)."""
    if settings.redis_username not in ("", "default"):
        raise MemdError(
            f"the embedded Redis has only the default user, not {settings.redis_username!r}: unset "
            "AGENTMEM_REDIS_USERNAME (AGENTMEM_REDIS_PASSWORD still applies), or run `agentmemd run` against your Redis"
        )
    password = settings.redis_password.get_secret_value() or None
    return embedded_servers(settings.kafka_bootstrap, settings.redis_url, settings.data_dir, redis_password=password)


@app.command()
def up() -> None:
    """Start the embedded broker and Redis, then the daemon, in the foreground (Ctrl-C stops all)."""
    settings = _embedded_session(_settings())
    try:
        with _embedded(settings):
            _run_with_signals(lambda stop: run_until_stopped(settings, stop))
    except MemdError as exc:
        raise _fail(exc) from exc


#: The embedded default's consumer session unless one is configured: Apache Kafka's smallest
#: (6 s). tansu holds a group's first join for half of it, so `up` is ready 2 s sooner than
#: with the 10 s default, and a daemon killed on this one machine gives its partitions up sooner.
EMBEDDED_SESSION_MS = 6_000


def _embedded_session(settings: Settings) -> Settings:
    try:
        consumer = settings.consumer.with_default_session(EMBEDDED_SESSION_MS)
    except ValidationError:  # a heartbeat set alone that does not fit it: the default session
        return settings
    return settings.model_copy(update={"consumer": consumer})


@app.command()
def run() -> None:
    """Run only the daemon, against the configured Kafka and Redis (production)."""
    settings = _settings()
    try:
        _run_with_signals(lambda stop: run_until_stopped(settings, stop))
    except MemdError as exc:
        raise _fail(exc) from exc


@app.command()
def servers() -> None:
    """Start only the embedded broker (tansu, in-memory log) and Redis with search (AOF)."""
    settings = _settings()

    async def wait(stop: asyncio.Event) -> None:
        print(
            f"servers ready: kafka {settings.kafka_bootstrap}, redis {settings.redis_url} (Ctrl-C stops)",
            flush=True,
        )
        await stop.wait()

    try:
        with _embedded(settings):
            _run_with_signals(wait)
    except MemdError as exc:
        raise _fail(exc) from exc


def _pairs(values: list[str] | None, what: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for raw in values or []:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{what} must look like key=value, got {raw!r}")
        if key in result:
            prev = result[key]
            result[key] = [*prev, value] if isinstance(prev, list) else [prev, value]
        else:
            result[key] = value
    return result


_AGO = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def _when(value: str | None, what: str) -> datetime | None:
    """``--since``/``--until``: an ISO 8601 time (UTC without a zone) or an age (``90m``, ``24h``, ``7d``)."""
    if value is None:
        return None
    ago = _AGO.fullmatch(value.strip())
    if ago:
        return datetime.now(UTC) - timedelta(**{_UNITS[ago.group(2)]: int(ago.group(1))})
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"{what} takes an ISO 8601 time or an age such as 24h or 7d, got {value!r}") from None


def _with_client(
    fn: Callable[[MemoryClient], Awaitable[T]], settings: Settings | None = None, tenant: str | None = None
) -> T:
    """Run ``fn`` with a client of ``tenant`` (see ``_tenant_target``), failing as the CLI does."""
    settings = _settings() if settings is None else settings

    async def main() -> T:
        async with MemoryClient(
            bootstrap=settings.kafka_bootstrap,
            topics=settings.topics,
            # A tenant's client reads the tenant's own reply topic, as the daemon's default for
            # it: never the shared one, which every tenant reads and topic ACLs may not grant.
            tenant=tenant,
            kafka_options=kafka_options(settings),
            max_content_bytes=settings.ingest.max_content_bytes,
        ) as client:
            return await fn(client)

    try:
        return asyncio.run(main())
    except QueryFailed as exc:
        raise _fail(exc) from exc
    except (MemdError, TimeoutError) as exc:
        raise _fail(exc if str(exc) else TimeoutError("no reply in time")) from exc


def _tenant_target(tenancy: str, tenant: str | None) -> str | None:
    """The tenant whose topics ``--tenant`` names under ``tenancy`` (None: the bare topics).

    Raises:
        typer.BadParameter: topic tenancy without a tenant (nobody reads the bare topics there:
            a query would only time out, a publish would be lost), or another tenant than the
            default one in single mode.
    """
    if tenancy == "topic":
        if tenant is None:
            raise typer.BadParameter(
                "the daemon runs in topic tenancy (AGENTMEM_CONSUMER__TENANCY=topic): name the tenant with --tenant"
            )
        return tenant
    if tenant not in (None, DEFAULT_TENANT):
        raise typer.BadParameter(
            f"--tenant {tenant} needs AGENTMEM_CONSUMER__TENANCY=topic; in single mode every query is the "
            f"{DEFAULT_TENANT!r} tenant's"
        )
    return None


@app.command()
def query(
    text: Annotated[str, typer.Argument(help="What to search for.")],
    top_k: Annotated[int, typer.Option("--top-k", help="Results wanted (1..100).")] = 5,
    filters: Annotated[list[str] | None, typer.Option("--filter", help="key=value; repeat a key for any-of.")] = None,
    dense_weight: Annotated[float | None, typer.Option("--dense-weight")] = None,
    sparse_weight: Annotated[float | None, typer.Option("--sparse-weight")] = None,
    identifier_weight: Annotated[float | None, typer.Option("--identifier-weight")] = None,
    recency_weight: Annotated[
        float | None, typer.Option("--recency-weight", help="Weight of newest-first among the candidates (0: off).")
    ] = None,
    rrf_k: Annotated[int | None, typer.Option("--rrf-k")] = None,
    scope: Annotated[
        Literal["chunks", "communities", "all"] | None,
        typer.Option("--scope", help="chunks (default), communities (graph summaries) or all (both, fused)."),
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(
            "--tenant",
            help="Whose memory (topic tenancy): asks on <requests topic>.<tenant>, reads <replies topic>.<tenant>.",
        ),
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only memories from this time on: ISO 8601, or an age (24h, 7d).")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Only memories up to this time: ISO 8601, or an age.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw reply.")] = False,
) -> None:
    """Ask the memory a question over Kafka request/reply."""
    flt = _pairs(filters, "--filter")
    start, end = _when(since, "--since"), _when(until, "--until")
    settings = _settings()
    target = _tenant_target(settings.consumer.tenancy, tenant)

    async def ask(c: MemoryClient) -> QueryReply:
        try:
            return await c.query(
                text,
                top_k=top_k,
                metadata_filter=flt or None,
                dense_weight=dense_weight,
                sparse_weight=sparse_weight,
                identifier_weight=identifier_weight,
                recency_weight=recency_weight,
                rrf_k=rrf_k,
                scope=scope,
                since=start,
                until=end,
            )
        except QueryFailed as exc:
            if as_json:  # the raw reply, error replies too, for scripts to parse
                print(exc.reply.model_dump_json(indent=2))
            raise

    reply = _with_client(
        ask,
        settings,
        target,
    )
    if as_json:
        print(reply.model_dump_json(indent=2))
        return
    out.print(results_view(reply))


def results_view(reply: QueryReply, snippet_chars: int = 240) -> Group:
    """A reply for a terminal of any width: per result, one line of facts (cut at the edge)
    and the text below it, wrapped. A table with the text as one column of six left it no
    room below ~160 columns (found by a new user: nothing of the text showed at 80)."""
    n = reply.total_retrieved
    lines: list[Any] = [Text(f"{n} result{'' if n == 1 else 's'} in {reply.took_ms:.1f} ms", style="bold")]
    if reply.truncated:
        lines.append(Text("(truncated: more results did not fit one Kafka record)", style="yellow"))
    for i, r in enumerate(reply.results, 1):
        ranks = " ".join(f"{k}:{v}" for k, v in sorted(r.ranks.items()))
        when = (r.timestamp or "")[:16].replace("T", " ")
        head = Text(no_wrap=True, overflow="ellipsis")
        head.append(f"{i:>2}. ", style="bold")
        head.append(f"{r.rrf_score:.4f}  ", style="cyan")
        head.append(r.chunk_id, style="green")
        head.append(f"  {when} UTC" if when else "")
        head.append(f"  {ranks}", style="dim")
        text = " ".join(r.text.split())
        snippet = text if len(text) <= snippet_chars else text[: snippet_chars - 1] + "…"
        lines += [head, Padding(Text(snippet), (0, 0, 0, 4))]
    return Group(*lines)


PublishTenantOpt = Annotated[
    str | None,
    typer.Option("--tenant", help="Whose memory (topic tenancy): publishes on <topic>.<tenant>."),
]


def _read_text(path: Path) -> str:
    """A file's text, or an error that names the file (never a traceback).

    Raises:
        InvalidEvent: not UTF-8 text, or unreadable.
    """
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidEvent(f"{path} is not UTF-8 text (byte {exc.start}): only text files can be published") from exc
    except OSError as exc:
        raise InvalidEvent(f"{path} cannot be read: {exc.strerror or exc}") from exc


@publish_app.command("doc")
def publish_doc(
    paths: Annotated[list[Path], typer.Argument(help="Files to publish (UTF-8 text).", exists=True, dir_okay=False)],
    doc_id: Annotated[str | None, typer.Option("--doc-id", help="Only with one path; default: the path.")] = None,
    meta: Annotated[list[str] | None, typer.Option("--meta", help="key=value metadata.")] = None,
    version: Annotated[int | None, typer.Option("--version", help="Default: wall-clock microseconds.")] = None,
    tenant: PublishTenantOpt = None,
) -> None:
    """Upsert documents from files."""
    settings = _settings()
    target = _tenant_target(settings.consumer.tenancy, tenant)
    if doc_id and len(paths) != 1:
        raise typer.BadParameter("--doc-id needs exactly one path")
    metadata = _pairs(meta, "--meta")
    if any(isinstance(v, list) for v in metadata.values()):
        raise typer.BadParameter("--meta keys must be unique")

    async def send(client: MemoryClient) -> int:
        # Every file is read and checked before the first is sent: one bad file among many
        # must not leave the others half published, nor go to the dead letters unseen.
        for path in paths:
            try:
                client.document_event(doc_id or str(path), _read_text(path), version=version, metadata=metadata)
            except InvalidEvent as exc:
                raise InvalidEvent(f"{path}: {exc}" if str(path) not in str(exc) else str(exc)) from exc
        with Progress(console=err, transient=True, disable=len(paths) < 2) as progress:
            task = progress.add_task("publishing", total=len(paths))
            for path in paths:
                await client.publish_document(doc_id or str(path), _read_text(path), version=version, metadata=metadata)
                progress.advance(task)
        return len(paths)

    n = _with_client(send, settings, target)
    out.print(f"published {n} document(s)")


@publish_app.command("delete")
def publish_delete(
    doc_id: Annotated[str, typer.Argument()],
    version: Annotated[int | None, typer.Option("--version")] = None,
    tenant: PublishTenantOpt = None,
) -> None:
    """Delete a document (every chunk of it)."""
    settings = _settings()
    target = _tenant_target(settings.consumer.tenancy, tenant)
    v = _with_client(lambda c: c.delete_document(doc_id, version=version), settings, target)
    out.print(f"delete of {doc_id} published at version {v}")


@publish_app.command("observation")
def publish_observation(
    text: Annotated[str, typer.Argument()],
    agent_id: Annotated[str, typer.Option("--agent-id")],
    session_id: Annotated[str, typer.Option("--session-id")],
    turn: Annotated[int, typer.Option("--turn")],
    role: Annotated[str, typer.Option("--role")] = "assistant",
    meta: Annotated[list[str] | None, typer.Option("--meta", help="key=value metadata.")] = None,
    tenant: PublishTenantOpt = None,
) -> None:
    """Record one transcript turn or observation of an agent."""
    metadata = _pairs(meta, "--meta")
    settings = _settings()
    target = _tenant_target(settings.consumer.tenancy, tenant)
    _with_client(
        lambda c: c.publish_observation(
            agent_id=agent_id, session_id=session_id, turn=turn, content=text, role=role, metadata=metadata
        ),
        settings,
        target,
    )
    out.print("observation published")


@publish_app.command("forget")
def publish_forget(
    agent_id: Annotated[str, typer.Option("--agent-id")],
    session_id: Annotated[str | None, typer.Option("--session-id", help="The session to forget.")] = None,
    all_sessions: Annotated[
        bool, typer.Option("--all-sessions", help="Forget every session of the agent instead.")
    ] = False,
    tenant: PublishTenantOpt = None,
) -> None:
    """Forget an agent's session (every turn of it), or with --all-sessions every session of the agent."""
    if (session_id is None) == (not all_sessions):
        raise typer.BadParameter("give --session-id or --all-sessions (not both)")
    settings = _settings()
    target = _tenant_target(settings.consumer.tenancy, tenant)
    _with_client(
        lambda c: c.forget(agent_id=agent_id, session_id=session_id, all_sessions=all_sessions), settings, target
    )
    what = f"session {session_id} of agent {agent_id}" if session_id else f"every session of agent {agent_id}"
    out.print(f"forget of {what} published")


@app.command()
def doctor() -> None:
    """Check settings, Redis, the index schema, Kafka, topics and consumer groups; exit 0 only when healthy."""
    from pydantic import ValidationError

    from daemon.doctor import diagnose

    try:
        settings = Settings()
    except ValidationError as exc:
        err.print(f"[red]✗ settings[/red]: {exc}")
        raise typer.Exit(code=1) from exc
    configure_logging("error", settings.log_format)
    findings = asyncio.run(diagnose(settings))
    for f in findings:
        mark = "[green]✓[/green]" if f.ok else "[red]✗[/red]"
        out.print(f"{mark} {f.check}: {f.detail}")
        if not f.ok and f.fix:
            out.print(f"    fix: {f.fix}")
    if not all(f.ok for f in findings):
        raise typer.Exit(code=1)


docs_app = typer.Typer(no_args_is_help=True, help="Generated documentation.")
app.add_typer(docs_app, name="docs")


@docs_app.command("asyncapi")
def docs_asyncapi(
    out_path: Annotated[Path | None, typer.Option("--out", help="Write here instead of stdout.")] = None,
    as_yaml: Annotated[bool, typer.Option("--yaml")] = False,
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


graph_app = typer.Typer(no_args_is_help=True, help="The entity graph and its communities.")
app.add_typer(graph_app, name="graph")


TenantOpt = Annotated[str, typer.Option("--tenant", help="Whose graph (topic tenancy); 'default' otherwise.")]


def _with_redis(fn: Callable[[Settings, Any], Awaitable[T]]) -> T:
    """Run ``fn(settings, redis client)`` to the end; a MemdError becomes a clean CLI failure."""
    settings = _settings()

    async def main() -> T:
        client = redis_client(settings)
        try:
            return await fn(settings, client)
        finally:
            await client.aclose()

    try:
        return asyncio.run(main())
    except MemdError as exc:
        raise _fail(exc) from exc


async def _active_index(settings: Settings, client: Any) -> Any:
    """The index as the active generation was built, for commands that load no model.

    A placeholder spec (no model, 0 dims) fails the settings check of every write, so a
    `graph rebuild` that removed a community failed deleting its summary chunk, after its
    communities were already committed.
    """
    from memory.generations import GenerationRegistry
    from memory.index import ChunkIndex, translate_errors

    async with translate_errors("generation read"):
        state = await GenerationRegistry(client, settings.index.name).state()
    dims = state.spec.dims if state.spec is not None else 0
    return ChunkIndex(client=client, cfg=settings.index, dims=dims, spec=state.spec)


def _with_graph(fn: Callable[[Any], Awaitable[T]], tenant: str = "default") -> T:
    from graph.service import GraphService
    from graph.store import GraphStore

    async def run(settings: Settings, client: Any) -> T:
        store = GraphStore(client=client, name=settings.index.name, tenant=tenant)
        index = await _active_index(settings, client)
        return await fn(GraphService(store=store, index=index, embedder=None, ner=None, cfg=settings.graph))

    return _with_redis(run)


@app.command()
def stale(
    as_json: Annotated[bool, typer.Option("--json")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1)] = 20,
    tenant: TenantOpt = "default",
) -> None:
    """The stale-summary queue: depth, oldest age, and the oldest communities with why."""
    import time

    depth, items = _with_graph(lambda g: g.store.stale(limit=limit), tenant)
    now = time.time()
    oldest = max((now - i.first_marked_at for i in items), default=0.0)
    if as_json:
        print(
            json.dumps(
                {
                    "depth": depth,
                    "oldest_age_s": round(oldest, 3),
                    "items": [
                        {
                            "community_id": i.community_id,
                            "level": i.level,
                            "first_marked_at": i.first_marked_at,
                            "last_marked_at": i.last_marked_at,
                            "change_count": i.change_count,
                            "doc_ids": i.doc_ids,
                        }
                        for i in items
                    ],
                },
                indent=2,
            )
        )
        return
    table = Table(title=f"stale summaries: {depth} queued, oldest {oldest:.1f}s")
    for col in ("community", "level", "age s", "changes", "caused by"):
        table.add_column(col, overflow="fold")
    for i in items:
        table.add_row(
            i.community_id,
            str(i.level),
            f"{now - i.first_marked_at:.1f}",
            str(i.change_count),
            ", ".join(i.doc_ids[:5]),
        )
    out.print(table)


@app.command()
def communities(as_json: Annotated[bool, typer.Option("--json")] = False, tenant: TenantOpt = "default") -> None:
    """Communities: ids, levels, sizes and whether their summaries are fresh."""

    async def read(g: Any) -> list[dict[str, Any]]:
        comms = await g.store.communities()
        stale_map = await g.store.is_stale([c.id for c in comms])
        rows = []
        for c in comms:
            summary = await g.store.summary(c.id)
            rows.append(
                {
                    "community_id": c.id,
                    "level": c.level,
                    "size": len(c.members),
                    "parent": c.parent,
                    "stale": stale_map.get(c.id, False),
                    "summarized": summary is not None,
                    "members": sorted(c.members)[:10],
                }
            )
        return rows

    rows = _with_graph(read, tenant)
    if as_json:
        print(json.dumps({"communities": rows}, indent=2))
        return
    table = Table(title=f"{len(rows)} communities")
    for col in ("community", "level", "size", "fresh", "members"):
        table.add_column(col, overflow="fold")
    for r in rows:
        fresh = "stale" if r["stale"] else ("fresh" if r["summarized"] else "none")
        table.add_row(r["community_id"], str(r["level"]), str(r["size"]), fresh, ", ".join(r["members"]))
    out.print(table)


@graph_app.command("rebuild")
def graph_rebuild(tenant: TenantOpt = "default") -> None:
    """Recompute communities now (ids stay stable; changed ones are marked stale)."""
    report = _with_graph(lambda g: g.recompute(force=True), tenant)
    if report is None:
        raise _fail(MemdError("another daemon holds the recompute lock; try again shortly"))
    out.print(
        f"{report.communities} communities on {report.levels} level(s); {len(report.changed)} new or changed "
        f"(marked stale), {len(report.removed)} removed, {len(report.events)} merges/splits, {report.took_ms:.0f} ms"
    )


@graph_app.command("repoint")
def graph_repoint() -> None:
    """Re-extract every graph doc of every tenant from the active index's chunks, so entities
    cite the chunks that hold them now (`reindex` does it after a chunking change)."""
    from daemon.reindex import repoint_graph

    async def run(settings: Settings, client: Any) -> int:
        return await repoint_graph(settings, client, await _active_index(settings, client))

    done = _with_redis(run)
    out.print(f"{done} graph docs re-pointed to the active index's chunks")


def _since_ms(value: str | None) -> int | None:
    """``--since``: Unix milliseconds, or an ISO 8601 time (UTC when it names no zone)."""
    if value is None:
        return None
    if value.isdigit():
        return int(value)
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(value)
    except ValueError as exc:
        raise typer.BadParameter(f"{value!r} is neither Unix milliseconds nor an ISO 8601 time") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


@app.command("drop-generation")
def drop_generation(
    generation: Annotated[int, typer.Argument(help="The generation to drop (doctor lists those kept).")],
    force: Annotated[
        bool, typer.Option("--force", help="Drop even one a reindex kept because the live one lacks some of its docs.")
    ] = False,
) -> None:
    """Drop an index generation kept beside the active one: its index and keys. Never the
    active one, nor one a running reindex is building."""
    from daemon.reindex import drop_generation as run_drop

    keys = _with_redis(lambda settings, client: run_drop(settings, client, generation, force=force))
    out.print(f"generation {generation} dropped ({keys} keys)")


@app.command()
def reindex(
    since: Annotated[
        str | None, typer.Option(help="Replay from this time (ISO 8601 or Unix ms) instead of the earliest offset.")
    ] = None,
    keep_old: Annotated[bool, typer.Option("--keep-old", help="Keep the old generation after the switch.")] = False,
    allow_losses: Annotated[
        bool,
        typer.Option("--allow-losses", help="Switch even if docs the live generation serves failed in the new build."),
    ] = False,
) -> None:
    """Rebuild the index from Kafka with the current settings into a new generation, then switch
    queries to it atomically. The old generation serves queries until the switch."""
    from daemon.reindex import ReindexProgress
    from daemon.reindex import reindex as run_reindex

    settings = _settings()
    with Progress(console=err, transient=False) as bar:
        task = bar.add_task("starting", total=None)

        def show(p: ReindexProgress) -> None:
            bar.update(
                task,
                description=f"generation {p.generation}: {p.phase}",
                total=p.total or None,
                completed=p.done,
            )

        try:
            rep = asyncio.run(
                run_reindex(
                    settings, since_ms=_since_ms(since), keep_old=keep_old, allow_losses=allow_losses, on_progress=show
                )
            )
        except MemdError as exc:
            raise _fail(exc) from exc
    p = rep.progress
    out.print(
        f"generation {rep.new_generation} is live (was {rep.old_generation}): {p.done} records replayed, "
        f"{p.applied} applied, {p.skipped} superseded, {p.invalid} invalid, {p.failed} failed, "
        f"{p.communities} summaries copied, {rep.chunks} chunks, {rep.took_s:.1f}s"
        + (f", {p.carried} docs carried over from the old generation" if p.carried else "")
        + (f", {p.graph_docs} graph docs re-pointed to the new chunks" if p.graph_docs else "")
        + ("" if rep.old_dropped else f"; generation {rep.old_generation} kept")
    )
    for e in rep.errors:
        err.print(f"[yellow]warning:[/yellow] {e}")
    if rep.errors:
        # Live, but not finished as asked (a catch-up, a drop or the graph left to redo):
        # scripts must not read this as a clean success.
        raise typer.Exit(code=2)


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
    dims: Annotated[int, typer.Option(help="Vector dimensions of the model.")] = 384,
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


def main() -> None:
    """Console-script entry point."""
    app()
