"""``publish``: documents, deletes, observations and forgets, over Kafka."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress

from consumers.client import MemoryClient, Receipt, SessionHint
from consumers.client_core import DEFAULT_TIMEOUT_S
from consumers.times import when
from daemon.cli._app import _settings, app, err, out
from daemon.cli._client import _pairs, _tenant_target, _with_client, ack_said, refused
from daemon.cli._files import expand, read_text
from memory.errors import InvalidEvent, InvalidRequest
from memory.filters import OWN_TAG_KEYS

publish_app = typer.Typer(no_args_is_help=True, help="Publish documents, deletes and observations.")
app.add_typer(publish_app, name="publish")


PublishTenantOpt = Annotated[
    str | None,
    typer.Option("--tenant", help="Whose memory (topic tenancy): publishes on <topic>.<tenant>."),
]


WaitOpt = Annotated[
    bool,
    typer.Option(
        "--wait",
        metavar="",
        help="Wait for the daemon's acknowledgement: once it returns, a query finds the write "
        "(exit 1 if it was dead-lettered or refused, with the reason).",
    ),
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        min=0.1,
        help="With --wait: seconds to wait for each acknowledgement (default 30; a large document takes minutes).",
    ),
]


StampOpt = Annotated[
    str | None,
    typer.Option(
        "--timestamp",
        help="When it was written or said: ISO 8601 (UTC without a zone) or an age (90m, 7d); default now. "
        "For imports: it dates the memory, and --since/--until select on it (the version orders edits).",
    ),
]


def _metadata(meta: list[str] | None) -> dict[str, Any]:
    """``--meta`` pairs as metadata.

    Raises:
        typer.BadParameter: a pair not ``key=value``, or a key given twice (a metadata key holds
            one value).
    """
    metadata = _pairs(meta, "--meta")
    if twice := sorted(k for k, v in metadata.items() if isinstance(v, list)):
        raise typer.BadParameter(f"--meta {', '.join(twice)} given more than once: a metadata key holds one value")
    for key in sorted(OWN_TAG_KEYS & set(metadata)):
        err.print(
            f"[yellow]warning:[/yellow] --meta {key} is kept with the memory, but the filter key {key!r} reads the "
            f"memory's own {key} (not this value): name it otherwise (doc_{key}, say) to filter by it"
        )
    return metadata


def _stamp(value: str | None) -> datetime | None:
    try:
        return when(value, "--timestamp")
    except InvalidRequest as exc:
        raise typer.BadParameter(str(exc)) from None


def _check_timeout(wait: bool, timeout: float | None) -> None:
    if timeout is not None and not wait:
        raise typer.BadParameter("--timeout is how long --wait waits: give --wait too")


def _said(receipt: Receipt) -> str:
    """What a waited-for write's ack says, for a person."""
    return "published" if receipt.ack is None else ack_said(receipt.ack)


def _exit_if_refused(*receipts: Receipt) -> None:
    if any(refused(r.ack) for r in receipts):
        raise typer.Exit(1)


#: Documents a bulk publish keeps in flight (sent, their acks awaited) at once, and the most
#: bytes of files among them (a larger document goes alone). The daemon acks a batch once all
#: of it is embedded, so the bytes bound the wait for the first ack: 64 KiB is about 8 s on 2
#: cores, well inside the 30 s --timeout (256 KiB would take about 30).
PUBLISH_IN_FLIGHT = 16
PUBLISH_IN_FLIGHT_BYTES = 64 * 1024
#: A bulk publish's bound on one ack: none in effect, as --timeout bounds the wait for any ack.
BULK_ACK_BOUND_S = 7 * 24 * 3600.0


class InFlight:
    """Room for documents in flight: at most ``most`` of them and ``size`` bytes together, but
    always room for one."""

    def __init__(self, most: int, size: int) -> None:
        self._most, self._size = most, size
        self._n = self._used = 0
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def taken(self, size: int) -> AsyncIterator[None]:
        """Hold room for a document of ``size`` bytes while it is in flight."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._n == 0 or (self._n < self._most and self._used + size <= self._size)
            )
            self._n, self._used = self._n + 1, self._used + size
        try:
            yield
        finally:
            async with self._changed:
                self._n, self._used = self._n - 1, self._used - size
                self._changed.notify_all()


@publish_app.command("doc")
def publish_doc(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Files to publish (UTF-8 text), or directories: their text files, hidden ones left out.",
            exists=True,
        ),
    ],
    doc_id: Annotated[
        str | None,
        typer.Option(
            "--doc-id",
            help="Only with one path; default: the path as typed (another spelling of it names another document).",
        ),
    ] = None,
    meta: Annotated[list[str] | None, typer.Option("--meta", help="key=value metadata.")] = None,
    version: Annotated[int | None, typer.Option("--version", help="Default: wall-clock microseconds.")] = None,
    timestamp: StampOpt = None,
    tenant: PublishTenantOpt = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Upsert documents from files."""
    _check_timeout(wait, timeout)
    stamp = _stamp(timestamp)
    settings = _settings()
    target = _tenant_target(settings.consumer.tenancy, tenant)
    if doc_id is not None and not doc_id.strip():
        raise typer.BadParameter("--doc-id is empty: name the document, or leave it out for the path")
    paths, skipped = expand(paths)
    if doc_id and len(paths) != 1:
        raise typer.BadParameter("--doc-id needs exactly one file")
    if skipped:
        shown = ", ".join(f"{p} ({why})" for p, why in skipped[:5]) + (", ..." if len(skipped) > 5 else "")
        err.print(f"skipped {len(skipped)} file(s) holding no text: {shown}")
    if not paths:
        raise typer.BadParameter("no text file to publish in the paths given")
    sizes = {path: path.stat().st_size for path in paths}
    metadata = _metadata(meta)

    async def send(client: MemoryClient) -> list[Receipt]:
        # Every file is read and checked before the first is sent: one bad file among many
        # must not leave the others half published, nor go to the dead letters unseen.
        for path in paths:
            try:
                client.document_event(
                    doc_id or str(path), read_text(path), version=version, metadata=metadata, timestamp=stamp
                )
            except InvalidEvent as exc:
                raise InvalidEvent(f"{path}: {exc}" if str(path) not in str(exc) else str(exc)) from exc
        # Several in flight: each document is its own key, so their order does not matter, and
        # a bulk load of small files does not wait for each ack in turn. Bounded in bytes too,
        # as the daemon embeds what is in flight one after another.
        room = InFlight(PUBLISH_IN_FLIGHT, PUBLISH_IN_FLIGHT_BYTES)
        receipts: dict[Path, Receipt] = {}
        sent: set[Path] = set()
        # Many documents in flight wait for each other's embedding: an ack's own wait says
        # nothing, so --timeout bounds the time without any ack instead (one document: its ack).
        bulk = wait and len(paths) > 1
        stall_s = timeout if timeout is not None else DEFAULT_TIMEOUT_S
        last = time.monotonic()

        async def one(path: Path) -> None:
            nonlocal last
            async with room.taken(sizes[path]):  # read once there is room: not all at once
                sent.add(path)
                receipts[path] = await client.publish_document(
                    doc_id or str(path),
                    read_text(path),
                    version=version,
                    metadata=metadata,
                    timestamp=stamp,
                    wait=wait,
                    timeout_s=BULK_ACK_BOUND_S if bulk else timeout,
                )
                last = time.monotonic()
            progress.advance(task)

        async def watch() -> None:
            while True:
                await asyncio.sleep(min(1.0, stall_s / 4))
                if time.monotonic() - last > stall_s:
                    break
            raise TimeoutError(
                f"no acknowledgement from the memory daemon for {stall_s:g} s (--timeout): is it running "
                "and reading the documents topic (`agentmemd doctor`)? A large document takes minutes: "
                "give a longer --timeout"
            )

        with Progress(console=err, transient=True, disable=len(paths) < 2) as progress:
            task = progress.add_task("publishing", total=len(paths))
            tasks = [asyncio.create_task(one(path)) for path in paths]
            jobs = [*tasks, *([asyncio.create_task(watch())] if bulk else [])]
            pending: set[asyncio.Task[None]] = set(jobs)
            try:
                while not all(t.done() for t in tasks):
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for t in done:
                        t.result()  # the first failure ends the command: what was not sent never is
            except BaseException:
                if len(paths) > 1:
                    unacked = len(sent) - len(receipts)
                    err.print(
                        f"{len(receipts)} of {len(paths)} document(s) published"
                        + (f" ({unacked} more sent, and may still be applied)" if unacked else "")
                        + " before this failure"
                    )
                raise
            finally:
                for t in jobs:
                    t.cancel()
                await asyncio.gather(*jobs, return_exceptions=True)
        return [receipts[p] for p in paths]

    receipts = _with_client(send, settings, target)
    if not wait:
        out.print(f"published {len(receipts)} document(s)")
        return
    for r in receipts:
        out.print(f"{r.doc_id} v{r.version}: {_said(r)}")
    ignored = sum(r.ack is not None and r.ack.status == "ignored" for r in receipts)
    turned_down = sum(refused(r.ack) for r in receipts)
    retried = ignored - turned_down
    out.print(
        f"published {len(receipts)} document(s): {len(receipts) - ignored} indexed"
        + (f", {retried} ignored (an older or equal version than the one stored)" if retried else "")
        + (f", {turned_down} refused (see above)" if turned_down else "")
    )
    _exit_if_refused(*receipts)


@publish_app.command("delete")
def publish_delete(
    doc_id: Annotated[str, typer.Argument()],
    version: Annotated[int | None, typer.Option("--version")] = None,
    tenant: PublishTenantOpt = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Delete a document (every chunk of it)."""
    _check_timeout(wait, timeout)
    settings = _settings()
    target = _tenant_target(settings.consumer.tenancy, tenant)

    async def send(c: MemoryClient) -> tuple[Receipt, str | None]:
        r = await c.delete_document(doc_id, version=version, wait=wait, timeout_s=timeout)
        if r.ack is None or r.ack.removed != 0:
            return r, None
        # Nothing was stored under that id, a misspelt one most likely: say which is.
        return r, await c.doc_hint(doc_id)

    r, near = _with_client(send, settings, target)
    if wait and r.ack is not None and r.ack.status == "indexed" and r.ack.removed == 0:
        # A misspelt doc id deletes nothing and is acked all the same: say so.
        out.print(f"nothing stored for {doc_id}: nothing removed (its version {r.version} is kept as deleted)")
        if near:
            out.print(f"did you mean {near}?")
        return
    out.print(f"delete of {doc_id} published at version {r.version}" + (f": {_said(r)}" if wait else ""))
    _exit_if_refused(r)


@publish_app.command("observation")
def publish_observation(
    text: Annotated[str, typer.Argument()],
    agent_id: Annotated[str, typer.Option("--agent-id")],
    session_id: Annotated[str, typer.Option("--session-id")],
    turn: Annotated[
        int | None,
        typer.Option("--turn", min=0, help="Its number in the session; without it, the one after the last stored."),
    ] = None,
    role: Annotated[str, typer.Option("--role")] = "assistant",
    meta: Annotated[list[str] | None, typer.Option("--meta", help="key=value metadata.")] = None,
    timestamp: StampOpt = None,
    tenant: PublishTenantOpt = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Record one transcript turn or observation of an agent."""
    _check_timeout(wait, timeout)
    stamp = _stamp(timestamp)
    metadata = _metadata(meta)
    settings = _settings()
    target = _tenant_target(settings.consumer.tenancy, tenant)
    r = _with_client(
        lambda c: c.publish_observation(
            agent_id=agent_id,
            session_id=session_id,
            turn=turn,
            content=text,
            role=role,
            metadata=metadata,
            timestamp=stamp,
            wait=wait,
            timeout_s=timeout,
        ),
        settings,
        target,
    )
    out.print(f"observation published as turn {r.turn}" + (f": {_said(r)}" if wait else ""))
    _exit_if_refused(r)


def _sessions_said(agent_id: str, hint: SessionHint) -> str:
    """What the agent's latest sessions say of a session id that held nothing."""
    if not hint.latest:
        return f"agent {agent_id} has no turns stored"
    listed = ", ".join(hint.latest[:8]) + (", ..." if len(hint.latest) > 8 else "")
    return (f"did you mean {hint.near}? " if hint.near else "") + f"agent {agent_id}'s latest sessions: {listed}"


@publish_app.command("forget")
def publish_forget(
    agent_id: Annotated[str, typer.Option("--agent-id")],
    session_id: Annotated[str | None, typer.Option("--session-id", help="The session to forget.")] = None,
    all_sessions: Annotated[
        bool, typer.Option("--all-sessions", metavar="", help="Forget every session of the agent instead.")
    ] = False,
    turn: Annotated[int | None, typer.Option("--turn", min=0, help="Forget only this turn of the session.")] = None,
    tenant: PublishTenantOpt = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Forget an agent's session (every turn of it), one turn of it (--turn), or with
    --all-sessions every session of the agent."""
    _check_timeout(wait, timeout)
    if session_id is not None and all_sessions:
        raise typer.BadParameter("give --session-id or --all-sessions, not both")
    if session_id is None and not all_sessions:
        raise typer.BadParameter("give --session-id, or --all-sessions to forget every session of the agent")
    if turn is not None and session_id is None:
        raise typer.BadParameter("--turn forgets one turn of the session --session-id names")
    settings = _settings()
    target = _tenant_target(settings.consumer.tenancy, tenant)

    async def send(c: MemoryClient) -> tuple[Receipt, SessionHint | None]:
        r = await c.forget(
            agent_id=agent_id, session_id=session_id, all_sessions=all_sessions, turn=turn, wait=wait, timeout_s=timeout
        )
        if session_id is None or r.ack is None or r.ack.forgotten != 0:
            return r, None
        # Nothing was stored there, a misspelt id most likely: the agent's latest sessions say.
        return r, await c.session_hint(agent_id, session_id)

    r, hint = _with_client(send, settings, target)
    what = f"session {session_id} of agent {agent_id}" if session_id else f"every session of agent {agent_id}"
    what = f"turn {turn} of {what}" if turn is not None else what
    if wait and r.ack is not None and r.ack.status == "indexed" and r.ack.forgotten is not None:
        # A misspelt session id forgets nothing and is acked all the same: say so (a daemon of
        # an earlier release says no count).
        n = r.ack.forgotten
        out.print(f"forgot {what}: {n} turn(s) removed" if n else f"nothing stored for {what}: nothing removed")
        if hint is not None:
            out.print(_sessions_said(agent_id, hint))
        return
    out.print(f"forget of {what} published" + (f": {_said(r)}" if wait else ""))
    _exit_if_refused(r)
