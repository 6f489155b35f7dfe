"""``publish``: documents, deletes, observations and forgets, over Kafka."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress

from consumers.client import MemoryClient, Receipt
from consumers.times import when
from daemon.cli._app import _settings, app, err, out
from daemon.cli._client import _pairs, _tenant_target, _with_client, ack_said
from memory.errors import InvalidEvent, InvalidRequest

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
        "(exit 1 if it was dead-lettered, with the reason).",
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


def _read_text(path: Path) -> str:
    """A file's text, or an error that names the file (never a traceback).

    Raises:
        InvalidEvent: not UTF-8 text, or unreadable.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidEvent(f"{path} is not UTF-8 text (byte {exc.start}): only text files can be published") from exc
    except OSError as exc:
        raise InvalidEvent(f"{path} cannot be read: {exc.strerror or exc}") from exc
    if (at := binary_at(text)) is not None:
        raise InvalidEvent(f"{path} looks binary (a control character at {at}): only text files can be published")
    return text


#: Control characters that text files hold: tab, line feed, form feed, carriage return (and ESC, of ANSI colours).
_TEXT_CONTROLS = frozenset("\t\n\f\r\x1b")


def binary_at(text: str) -> int | None:
    """Where a NUL, or the first of the control characters making up over 1 % of the first
    8,192 characters, sits: what valid UTF-8 that is no text file holds (a PDF, an archive)."""
    if (nul := text.find("\x00")) >= 0:
        return nul
    head = text[:8192]
    odd = [i for i, c in enumerate(head) if c < " " and c not in _TEXT_CONTROLS]
    return odd[0] if odd and len(odd) * 100 > len(head) else None


#: Documents a bulk publish keeps in flight (sent, their acks awaited) at once.
PUBLISH_IN_FLIGHT = 16


def expand(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """The files of ``paths`` (each file as given, a directory's files under it in path order,
    hidden ones and those under hidden directories left out), each once; and the directories'
    files left out as holding no text (empty, binary, not UTF-8)."""
    files: list[Path] = []
    skipped: list[Path] = []
    for path in paths:
        if not path.is_dir():
            files.append(path)
            continue
        for found in sorted(path.rglob("*")):
            if not found.is_file() or any(part.startswith(".") for part in found.relative_to(path).parts):
                continue
            try:
                text = _read_text(found)
            except InvalidEvent:
                text = ""
            (files if text.strip() else skipped).append(found)
    return list(dict.fromkeys(files)), skipped


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
    settings = _settings(client=True)
    target = _tenant_target(settings.consumer.tenancy, tenant)
    if doc_id is not None and not doc_id.strip():
        raise typer.BadParameter("--doc-id is empty: name the document, or leave it out for the path")
    paths, skipped = expand(paths)
    if doc_id and len(paths) != 1:
        raise typer.BadParameter("--doc-id needs exactly one file")
    if skipped:
        shown = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
        err.print(f"skipped {len(skipped)} file(s) holding no text (empty, binary or not UTF-8): {shown}")
    if not paths:
        raise typer.BadParameter("no text file to publish in the paths given")
    metadata = _pairs(meta, "--meta")
    if any(isinstance(v, list) for v in metadata.values()):
        raise typer.BadParameter("--meta keys must be unique")

    async def send(client: MemoryClient) -> list[Receipt]:
        # Every file is read and checked before the first is sent: one bad file among many
        # must not leave the others half published, nor go to the dead letters unseen.
        for path in paths:
            try:
                client.document_event(
                    doc_id or str(path), _read_text(path), version=version, metadata=metadata, timestamp=stamp
                )
            except InvalidEvent as exc:
                raise InvalidEvent(f"{path}: {exc}" if str(path) not in str(exc) else str(exc)) from exc
        # Several in flight: each document is its own key, so their order does not matter, and
        # a bulk load waits for the slowest ack of each group, not for every ack in turn.
        room = asyncio.Semaphore(PUBLISH_IN_FLIGHT)
        with Progress(console=err, transient=True, disable=len(paths) < 2) as progress:
            task = progress.add_task("publishing", total=len(paths))

            async def one(path: Path) -> Receipt:
                async with room:
                    receipt = await client.publish_document(
                        doc_id or str(path),
                        _read_text(path),
                        version=version,
                        metadata=metadata,
                        timestamp=stamp,
                        wait=wait,
                        timeout_s=timeout,
                    )
                progress.advance(task)
                return receipt

            done = await asyncio.gather(*(one(path) for path in paths), return_exceptions=True)
        # Every write was sent and its ack awaited; the first failure is the command's.
        if failed := next((r for r in done if isinstance(r, BaseException)), None):
            raise failed
        return [r for r in done if isinstance(r, Receipt)]

    receipts = _with_client(send, settings, target)
    if not wait:
        out.print(f"published {len(receipts)} document(s)")
        return
    for r in receipts:
        out.print(f"{r.doc_id} v{r.version}: {_said(r)}")
    ignored = sum(r.ack is not None and r.ack.status == "ignored" for r in receipts)
    out.print(
        f"published {len(receipts)} document(s): {len(receipts) - ignored} indexed"
        + (f", {ignored} ignored (an older or equal version than the one stored)" if ignored else "")
    )


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
    settings = _settings(client=True)
    target = _tenant_target(settings.consumer.tenancy, tenant)
    r = _with_client(
        lambda c: c.delete_document(doc_id, version=version, wait=wait, timeout_s=timeout), settings, target
    )
    if wait and r.ack is not None and r.ack.status == "indexed" and r.ack.removed == 0:
        # A misspelt doc id deletes nothing and is acked all the same: say so.
        out.print(f"nothing stored for {doc_id}: nothing removed (its version {r.version} is kept as deleted)")
        return
    out.print(f"delete of {doc_id} published at version {r.version}" + (f": {_said(r)}" if wait else ""))


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
    metadata = _pairs(meta, "--meta")
    settings = _settings(client=True)
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
    settings = _settings(client=True)
    target = _tenant_target(settings.consumer.tenancy, tenant)
    r = _with_client(
        lambda c: c.forget(
            agent_id=agent_id, session_id=session_id, all_sessions=all_sessions, turn=turn, wait=wait, timeout_s=timeout
        ),
        settings,
        target,
    )
    what = f"session {session_id} of agent {agent_id}" if session_id else f"every session of agent {agent_id}"
    what = f"turn {turn} of {what}" if turn is not None else what
    if wait and r.ack is not None and r.ack.status == "indexed" and r.ack.forgotten is not None:
        # A misspelt session id forgets nothing and is acked all the same: say so (a daemon of
        # an earlier release says no count).
        n = r.ack.forgotten
        out.print(f"forgot {what}: {n} turn(s) removed" if n else f"nothing stored for {what}: nothing removed")
        return
    out.print(f"forget of {what} published" + (f": {_said(r)}" if wait else ""))
