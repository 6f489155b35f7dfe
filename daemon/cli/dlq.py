"""``dlq``: the dead letters, listed, and sent again once their cause is fixed."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.text import Text

from consumers.client import MemoryClient
from consumers.errors import WriteRejected
from daemon.cli._app import _fail, _settings, _with_redis, app, err, out
from daemon.cli._client import _with_client, ack_said, check_tenant_known, refused
from daemon.connections import redis_client
from daemon.control_pictures import json_for_terminal
from daemon.dlq_marks import ReplayMark, mark_of, mark_replayed, read_marks
from daemon.dlq_replay import (
    Replay,
    corrected,
    destination,
    original_of,
    parse_position,
    read_dead_letters,
    replay_of,
)
from daemon.explore.dlq import DeadLetter, dead_letter, erased_letter, recent_dead_letters, tenant_of
from daemon.settings import Settings
from memory.errors import InvalidRequest, MemdError, NotFound
from memory.records import DEFAULT_TENANT
from memory.tenants import Erasure, TenantRegistry
from memory.tenants import refused as refused_after_erasure

T = TypeVar("T")
V = TypeVar("V")

dlq_app = typer.Typer(no_args_is_help=True, help="The dead letters: list them, send them again.")
app.add_typer(dlq_app, name="dlq")


#: Longest a command waits for the DLQ's records.
READ_WAIT_S = 10.0


def _reader(s: Settings) -> dict[str, Any]:
    """Where and how both commands read the DLQ."""
    return {
        "bootstrap": s.kafka_bootstrap,
        "topic": s.topics.dlq,
        "options": s.kafka_security.aiokafka_kwargs(),
        "wait_s": READ_WAIT_S,
    }


@dlq_app.command("list")
def dlq_list(
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="Latest records of each DLQ partition.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", metavar="", help="One JSON object per record.")] = False,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Only the dead letters of this tenant's events (topic tenancy).")
    ] = None,
) -> None:
    """The latest dead letters, newest first: where each sits (PARTITION:OFFSET, what `dlq
    replay` takes), why it was refused, and where it came from (in topic tenancy, whose)."""
    s = _settings(quiet=True)
    t = s.topics
    if tenant not in (None, DEFAULT_TENANT) and s.consumer.tenancy != "topic":
        raise _fail(
            ValueError(
                f"--tenant {tenant} needs AGENTMEM_CONSUMER__TENANCY=topic: in single mode every dead letter is the "
                "'default' tenant's (list them without --tenant)"
            )
        )
    try:
        letters = asyncio.run(
            recent_dead_letters(
                **_reader(s), limit=limit, bases=(t.documents, t.transcripts), tenancy=s.consumer.tenancy
            )
        )
    except MemdError as exc:
        raise _fail(exc) from exc
    if tenant is not None and s.consumer.tenancy == "topic":

        async def known(settings: Settings, client: Any) -> None:
            await check_tenant_known(settings, client, tenant)

        _with_redis(known)
    if tenant is not None:  # of the latest `limit` of each partition: a tenant's older ones need a larger --limit
        letters = [d for d in letters if d.tenant == tenant]
    erased = _erased(s, strict=False)
    kept = [d for d in letters if not erased_letter(d, erased)]
    hidden, letters = len(letters) - len(kept), kept
    if hidden:
        err.print(f"{hidden} dead letters of erased tenants not shown (agentmemd erase-tenant)")
    marks = _marks(s, strict=False) if letters else {}
    if as_json:
        for d in letters:
            mark = mark_of(d, t.dlq, marks)
            row = {**dataclasses.asdict(d), "replayed": None if mark is None else _mark_json(mark)}
            print(json_for_terminal(json.dumps(row, ensure_ascii=False)))
        return
    if not letters:
        out.print(f"no dead letters{f' of tenant {tenant}' if tenant else ''} in {t.dlq}")
    for d in letters:
        whose = f" (tenant {d.tenant})" if s.consumer.tenancy == "topic" and d.tenant else ""
        origin = f"{d.topic} {d.original_partition}:{d.original_offset}{whose}"
        out.print(Text(f"{d.partition}:{d.offset}  {d.failed_at[:19]}  {d.code}  from {origin}", style="bold"))
        out.print(Text(f"    {d.reason}"))
        first = d.preview.splitlines()[0] if d.preview else ""
        if d.preview_kind == "hex":  # bytes that are no text: their first line of hex
            shown = f"(bytes, not text) {first}{'…' if d.cut or len(d.preview.splitlines()) > 1 else ''}"
        elif d.preview_kind == "text":
            shown = first[:160] + ("…" if len(first) > 160 or d.cut else "")
        else:
            shown = "(original left out: too large to keep)"
        out.print(Text(f"    {shown}" if shown else "    (empty)", style="dim"))
        if (mark := mark_of(d, t.dlq, marks)) is not None:
            out.print(Text(f"    replayed {mark.when} to {mark.to}: {mark.said}", style="green"))


@dlq_app.command("replay")
def dlq_replay(
    positions: Annotated[list[str], typer.Argument(help="Dead letters as PARTITION:OFFSET (see `dlq list`).")],
    wait: Annotated[
        bool, typer.Option("--wait", metavar="", help="Wait for each event's ack (exit 1 if refused again).")
    ] = False,
    timeout: Annotated[float | None, typer.Option("--timeout", min=0.1, help="With --wait: seconds per ack.")] = None,
    fixed: Annotated[
        Path | None,
        typer.Option(
            "--with",
            exists=True,
            dir_okay=False,
            help="Send this file's bytes instead of the original (one dead letter: its event, corrected; "
            "see `dlq original`).",
        ),
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(
            "--tenant",
            help="Topic tenancy: send to this tenant's topic an event that was published on a bare topic "
            "(which names no tenant).",
        ),
    ] = None,
    again: Annotated[
        bool,
        typer.Option("--again", metavar="", help="Send dead letters that were sent again before once more."),
    ] = False,
) -> None:
    """Send dead letters again, each as it was: the original bytes, to the topic they came from,
    under their key. Fix the cause first: the daemon judges them as any event. An event that was
    itself wrong: `dlq original` writes it out, and `--with` sends the corrected file in its place;
    one published on a bare topic in topic tenancy: `--tenant` sends it to its tenant's topic.
    Each one sent is marked (`dlq list` shows when, where to, and what its ack said), and is
    not sent a second time without `--again`: a forget sent again would remove the turns
    written since."""
    try:
        wanted = [parse_position(p) for p in positions]
    except InvalidRequest as exc:
        raise typer.BadParameter(str(exc)) from exc
    if fixed is not None and len(set(wanted)) != 1:
        raise typer.BadParameter("--with replaces one dead letter's event: name one PARTITION:OFFSET")
    s = _settings(quiet=True)
    try:
        records = asyncio.run(read_dead_letters(**_reader(s), positions=wanted))
    except MemdError as exc:
        raise _fail(exc) from exc
    erased = _erased(s, strict=True)
    marks = _marks(s, strict=True)
    inputs = (s.topics.documents, s.topics.transcripts)
    failed = False
    for p in dict.fromkeys(wanted):
        name = f"{p[0]}:{p[1]}"
        try:
            letter, replay = _replay_at(p, records, s, erased, kept=fixed is None)
            # A send whose ack refused it applied nothing: sending the letter (or a fix) again undoes nothing.
            if not again and (mark := mark_of(letter, s.topics.dlq, marks)) is not None and not mark.refused:
                raise InvalidRequest(
                    f"sent again already, {mark.when} to {mark.to} ({mark.said}): `--again` sends it once more"
                )
            if fixed is not None:
                replay = corrected(replay, fixed.read_bytes())
            replay = destination(replay, tenant, inputs, s.consumer.tenancy)
            # Sent now: refused only by an erasure its topics were not created again after.
            if tenant is not None and refused_after_erasure(erased, tenant, int(time.time() * 1000)):
                raise InvalidRequest(f"tenant {tenant} was erased (agentmemd erase-tenant)")
        except NotFound as exc:
            out.print(Text(f"{name}: {exc}", style="yellow"))
            failed = True
            continue
        except InvalidRequest as exc:
            out.print(Text(f"{name}: not sent: {exc}", style="yellow"))
            failed = True
            continue
        said = _send(replay, s, wait=wait, timeout_s=timeout)
        not_applied = said.startswith(_NOT_APPLIED)
        failed |= not_applied or said.startswith("no ack")
        out.print(f"{name}: sent to {replay.topic} under key {replay.key!r}" + (f": {said}" if said else ""))
        _mark(s, letter, to=replay.topic, said=said or "sent, its ack not waited for", refused=not_applied)
    if failed:
        raise typer.Exit(1)


@dlq_app.command("original")
def dlq_original(
    position: Annotated[str, typer.Argument(help="A dead letter as PARTITION:OFFSET (see `dlq list`).")],
) -> None:
    """Write a dead letter's original event, byte for byte, to stdout: to correct an event that
    was itself wrong and send it in its place (`dlq replay PARTITION:OFFSET --with FILE`)."""
    try:
        wanted = parse_position(position)
    except InvalidRequest as exc:
        raise typer.BadParameter(str(exc)) from exc
    s = _settings(quiet=True)
    try:
        records = asyncio.run(read_dead_letters(**_reader(s), positions=[wanted]))
        _letter_at(wanted, records, s, _erased(s, strict=True))
        original = original_of(records[wanted][0])
    except MemdError as exc:
        raise _fail(exc) from exc
    sys.stdout.buffer.write(original)
    sys.stdout.buffer.flush()


def _replay_at(
    p: tuple[int, int],
    records: Mapping[tuple[int, int], tuple[bytes | None, bytes | None]],
    settings: Settings,
    erased: Mapping[str, Erasure],
    *,
    kept: bool = True,
) -> tuple[DeadLetter, Replay]:
    """The dead letter at ``p`` (of ``records``, as read), and what it sends again; ``kept``
    as for ``replay_of``.

    Raises:
        NotFound: there is no such record.
        InvalidRequest: its tenant was erased, or it cannot be sent again (``replay_of`` says why).
    """
    t = settings.topics
    letter = _letter_at(p, records, settings, erased)
    return letter, replay_of(*records[p], inputs=(t.documents, t.transcripts), kept=kept)


def _letter_at(
    p: tuple[int, int],
    records: Mapping[tuple[int, int], tuple[bytes | None, bytes | None]],
    settings: Settings,
    erased: Mapping[str, Erasure],
) -> DeadLetter:
    """The dead letter at ``p`` (of ``records``, as read).

    Raises:
        NotFound: there is no such record.
        InvalidRequest: its tenant was erased.
    """
    t = settings.topics
    if p not in records:
        raise NotFound(f"no such record in {t.dlq} (see `agentmemd dlq list`)")
    letter = dead_letter(*p, records[p][0], bases=(t.documents, t.transcripts), tenancy=settings.consumer.tenancy)
    if erased_letter(letter, erased):
        raise InvalidRequest(f"tenant {letter.tenant} was erased since (agentmemd erase-tenant)")
    return letter


def _erased(settings: Settings, *, strict: bool) -> Mapping[str, Erasure]:
    """In topic tenancy, the erased tenants (whose dead letters are neither shown nor sent
    again). With Redis out of reach: ``strict`` (a replay) fails, since it would send an
    erased tenant's events again; else none, and a warning says so."""
    if settings.consumer.tenancy != "topic":
        return {}

    async def read(client: Any) -> Mapping[str, Erasure]:
        return await TenantRegistry(client=client, name=settings.index.name).erased()

    return _read_redis(
        settings, read, strict=strict, unread="could not read the erased tenants ({}): their dead letters may show"
    )


def _marks(settings: Settings, *, strict: bool) -> Mapping[str, ReplayMark]:
    """The marks of the dead letters sent again. With Redis out of reach: ``strict`` (a replay)
    fails, since it could send one a second time; else none, and a warning says so."""

    async def read(client: Any) -> Mapping[str, ReplayMark]:
        return await read_marks(client, settings.index.name)

    return _read_redis(settings, read, strict=strict, unread="could not read which dead letters were sent again ({})")


def _read_redis(
    settings: Settings, read: Callable[[Any], Awaitable[Mapping[str, V]]], *, strict: bool, unread: str
) -> Mapping[str, V]:
    """What ``read`` reads from Redis; when it cannot: ``strict`` fails the command, else none,
    with the warning ``unread`` (``{}``: the error)."""
    try:
        return asyncio.run(_in_redis(settings, read))
    except MemdError as exc:
        if strict:
            raise _fail(exc) from exc
        err.print(f"[yellow]warning:[/yellow] {unread.format(exc)}")
        return {}


def _mark(settings: Settings, letter: DeadLetter, *, to: str, said: str, refused: bool) -> None:
    """Mark ``letter`` sent again; a failure is a warning (it was sent: the next are sent too)."""

    async def write(client: Any) -> None:
        await mark_replayed(client, settings.index.name, settings.topics.dlq, letter, to=to, said=said, refused=refused)

    try:
        asyncio.run(_in_redis(settings, write))
    except MemdError as exc:
        err.print(f"[yellow]warning:[/yellow] sent, but not marked as sent ({exc}): `dlq list` will not say so")


async def _in_redis(settings: Settings, fn: Callable[[Any], Awaitable[T]]) -> T:
    """``fn(client)`` with a Redis client of ``settings``, closed after."""
    client = redis_client(settings)
    try:
        return await fn(client)
    finally:
        await client.aclose()


def _mark_json(mark: ReplayMark) -> dict[str, Any]:
    return {"at": mark.when, "to": mark.to, "said": mark.said}


#: How ``_send`` begins what it says of an ack that applied nothing.
_NOT_APPLIED = ("dead-lettered", "refused")


def _send(replay: Replay, settings: Settings, *, wait: bool, timeout_s: float | None) -> str:
    """Publish one replay; with ``wait``, what its ack said."""
    t = settings.topics
    tenant = tenant_of(replay.topic, (t.documents, t.transcripts), settings.consumer.tenancy)

    async def send(c: MemoryClient) -> str:
        try:
            ack = await c.republish(replay.topic, replay.value, replay.key, wait=wait, timeout_s=timeout_s)
        except WriteRejected as exc:  # an answer here, not a failure of the command
            return f"dead-lettered again: {exc.ack.reason}"
        except TimeoutError:  # sent: the next ones are sent all the same
            return "no ack in time (it was sent, and may still be applied)"
        if ack is not None and refused(ack):
            return f"refused: {ack.reason}"
        return "" if ack is None else ack_said(ack)

    return _with_client(send, settings, tenant if settings.consumer.tenancy == "topic" else None)
