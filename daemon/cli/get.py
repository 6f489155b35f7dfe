"""``get``: memories by id, as stored now, and with ``--history`` a document's earlier versions."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.text import Text

from consumers.client import MemoryClient
from consumers.encoding import ClientFilter
from consumers.errors import VersionGone
from consumers.fields import MAX_VERSION
from consumers.requests import GetItem, GetReply
from daemon.cli._app import _settings, app, err, out
from daemon.cli._client import _filter, _tenant_target, _with_client
from daemon.cli.query import FilterOpt, JsonOpt, ReadTenantOpt, ReadTimeoutOpt, shown_time
from daemon.control_pictures import json_for_terminal
from daemon.explore.html import pairs
from memory.errors import MemdError

#: The exit code when an id is not found: apart from a failure's 1 and a usage error's 2, so
#: a script can tell "not there" from "could not ask".
NOT_FOUND_EXIT = 3


@app.command()
def get(
    doc_ids: Annotated[list[str], typer.Argument(help="Document ids (a turn's: transcript:<agent>/<session>/<turn>).")],
    history: Annotated[
        bool, typer.Option("--history", metavar="", help="Also each document's earlier versions, newest first.")
    ] = False,
    version: Annotated[
        int | None,
        typer.Option(
            "--version", min=0, max=MAX_VERSION, help="This version of one document, current or kept in its history."
        ),
    ] = None,
    raw: Annotated[
        bool, typer.Option("--raw", metavar="", help="Print only the content of one id, exactly as stored.")
    ] = False,
    filters: FilterOpt = None,
    tenant: ReadTenantOpt = None,
    as_json: JsonOpt = False,
    timeout: ReadTimeoutOpt = None,
) -> None:
    """Show memories by id: each one's current version and content, whole (exit 3 if one is
    not found, is being written, or did not fit the reply)."""
    flt = _filter(filters)
    settings = _settings()
    target = _tenant_target(settings.consumer.tenancy, tenant)
    one = len(set(doc_ids)) == 1
    if version is not None and not one:
        raise typer.BadParameter("--version reads one document: name one id", param_hint="--version")
    if version is not None and history:
        raise typer.BadParameter("--version reads one version alone: leave out --history", param_hint="--version")
    if raw and (not one or history or as_json):
        raise typer.BadParameter("--raw prints one content alone: one id, without --history or --json")

    async def read(c: MemoryClient) -> tuple[GetReply, int | None]:
        reply = await c.get(doc_ids, metadata_filter=flt or None, history=history, version=version)
        if not reply.items:
            raise MemdError("the reply held none of the ids asked for: the first one's metadata alone fills it")
        # A content cut to fit the reply is read on, a reply at a time, in the version shown.
        items = [await _whole(c, i, flt or None, pinned=version is not None, history=history) for i in reply.items]
        current = None
        if version is not None and items[0].status == "not_found":
            # Say whether the document or only that version is missing.
            now = (await c.get(doc_ids[0], metadata_filter=flt or None)).items
            current = now[0].version if now and now[0].status == "found" else None
        return reply.model_copy(update={"items": items}), current

    reply, current = _with_client(read, settings, target, timeout_s=timeout)
    answered = {i.doc_id for i in reply.items}
    left_off = [d for d in dict.fromkeys(doc_ids) if d not in answered]
    if raw and reply.items and reply.items[0].status == "found":
        # Bytes, not text: the terminal's encoding and newline handling would change them.
        sys.stdout.buffer.write((reply.items[0].content or "").encode("utf-8", "surrogatepass"))
        sys.stdout.buffer.flush()
    elif raw:
        for item in reply.items:
            err.print(Text(f"{item.doc_id}: {item.status.replace('_', ' ')}", style="yellow"))
    elif as_json:
        print(json_for_terminal(reply.model_dump_json(indent=2)))
    else:
        alone = len(reply.items) == 1  # then its versions were left off for its own size
        for item in reply.items:
            _show(item, alone=alone)
        if left_off:
            ids = ", ".join(left_off)
            out.print(Text(f"(left off to fit one Kafka record: {ids}; get them on their own)", style="yellow"))
    if current is not None:
        kept = f"version {version} is not kept; the current version is {current}"
        err.print(Text(f"({kept}: --history lists the versions kept)", style="yellow"))
    if left_off or any(i.status != "found" for i in reply.items):
        raise typer.Exit(NOT_FOUND_EXIT)


async def _whole(c: MemoryClient, item: GetItem, flt: ClientFilter | None, *, pinned: bool, history: bool) -> GetItem:
    """``item`` read on to its end; the current version replaced meanwhile is read again whole,
    with its history if asked (``MemoryClient.read``)."""
    try:
        return await c.read_on(item, metadata_filter=flt)
    except VersionGone:
        if pinned:
            raise
        return await c.read(item.doc_id, metadata_filter=flt, history=history)


def _show(item: GetItem, *, alone: bool) -> None:
    if item.status != "found":
        out.print(Text(f"{item.doc_id}: {item.status.replace('_', ' ')}", style="yellow"))
        return
    version = f" version {item.version}" if item.version is not None else ""
    held = shown_time(item.timestamp) or "?"
    if item.until is not None:  # an earlier version, asked for by its number
        held += f" until {shown_time(item.until) or '?'} (replaced)"
    out.print(Text(f"{item.doc_id}{version}  {held}  ({item.source})", style="bold"))
    if item.metadata:
        out.print(Text(f"  metadata {pairs(item.metadata)}", style="dim"))
    parts = [Text(item.content or "")]
    if item.content_truncated:
        parts.append(Text("(cut: longer than one reply)", style="yellow"))
    out.print(*parts)
    if item.history is None:
        return
    if not item.history and not item.history_truncated:
        out.print(Text("  no earlier versions kept", style="dim"))
    after = item.metadata or {}
    for v in item.history:
        held = f"{shown_time(v.timestamp) or '?'} until {shown_time(v.until) or '?'}"
        out.print(Text(f"  version {v.version}  {held}", style="bold dim"))
        if v.metadata != after:  # what changed may be only its metadata
            out.print(Text(f"  metadata {pairs(v.metadata) if v.metadata else '(none)'}", style="dim"))
        after = v.metadata
        if v.content_truncated:
            read = f"agentmemd get {item.doc_id} --version {v.version}"
            out.print(Text(f"  (its content did not fit one Kafka record: {read})", style="yellow"))
        else:
            out.print(Text(v.content, style="dim"))
    if item.history_truncated and not item.history:  # versions left off, not only their contents
        why = "it does not fit one Kafka record with them" if alone else "get this id alone"
        out.print(Text(f"  (earlier versions left off to fit one Kafka record: {why})", style="yellow"))
