"""Pure helpers of the `agentmemd` command line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import typer

from consumers.config import ConsumerConfig
from daemon.cli._client import _tenant_target
from daemon.cli.query import _when
from daemon.cli.servers import EMBEDDED_SESSION_MS, _embedded_session
from daemon.settings import Settings


@pytest.mark.parametrize(
    ("tenancy", "tenant", "want"),
    [
        ("single", None, None),
        ("single", "default", None),  # single mode's only tenant: the bare requests topic
        ("topic", "acme", "acme"),
        ("topic", "default", "default"),  # a tenant like any other there
    ],
)
def test_tenant_target(tenancy: str, tenant: str | None, want: str | None) -> None:
    """`agentmemd query --tenant` names a tenant's requests topic only in topic tenancy."""
    assert _tenant_target(tenancy, tenant) == want


@pytest.mark.parametrize(
    ("tenancy", "tenant", "why"),
    [
        ("single", "acme", "--tenant acme needs AGENTMEM_CONSUMER__TENANCY=topic"),
        ("topic", None, "name the tenant with --tenant"),
    ],
)
def test_tenant_target_refused(tenancy: str, tenant: str | None, why: str) -> None:
    """A tenant in single mode, or none in topic tenancy, is a usage error (never a timeout)."""
    with pytest.raises(typer.BadParameter, match=why):
        _tenant_target(tenancy, tenant)


def test_since_and_until_take_an_iso_time_or_an_age() -> None:
    """`--since 24h` is a day ago; an ISO time is taken as written; anything else is refused."""
    assert _when(None, "--since") is None
    assert _when("2026-11-01T08:00:00+00:00", "--since") == datetime(2026, 11, 1, 8, tzinfo=UTC)
    ago = _when("24h", "--since")
    assert ago is not None and abs(datetime.now(UTC) - timedelta(hours=24) - ago) < timedelta(seconds=5)
    week = _when("2w", "--until")
    assert week is not None and abs(datetime.now(UTC) - timedelta(weeks=2) - week) < timedelta(seconds=5)
    with pytest.raises(typer.BadParameter, match="--since"):
        _when("last tuesday", "--since")


def test_up_uses_a_shorter_session_unless_one_is_configured() -> None:
    """`agentmemd up` (one machine, tansu) takes Apache Kafka's smallest session, 6 s, for a
    faster first join; a configured session, or a heartbeat that would not fit, is kept."""
    assert _embedded_session(Settings()).consumer.session_timeout_ms == EMBEDDED_SESSION_MS == 6000
    assert _embedded_session(Settings()).consumer.heartbeat_ms == 2000
    kept = Settings(consumer=ConsumerConfig(session_timeout_ms=20_000))
    assert _embedded_session(kept).consumer.session_timeout_ms == 20_000
    slow_heartbeat = Settings(consumer=ConsumerConfig(heartbeat_interval_ms=3000, group_id="g"))
    out = _embedded_session(slow_heartbeat).consumer
    assert (out.session_timeout_ms, out.heartbeat_interval_ms, out.group_id) == (10_000, 3000, "g")
    assert _embedded_session(Settings(consumer=ConsumerConfig(group_id="g"))).consumer.group_id == "g"


def test_query_results_show_their_text_in_an_80_column_terminal() -> None:
    """The results table leaves the text column room on a narrow terminal (below ~160 columns)."""
    from rich.console import Console

    from consumers.requests import QueryReply, ResultItem
    from daemon.cli.query import results_view

    text = "Restarted pgbouncer; the 504s stopped. " + "The pool drained after the deploy of billing. " * 10
    reply = QueryReply(
        query_id="q",
        total_retrieved=1,
        took_ms=12.3,
        results=[
            ResultItem(
                chunk_id="observation:planner-7/incident-4411/12_p0-with-a-long-id-" + "x" * 60,
                rrf_score=0.0325,
                text=text,
                source="planner-7/incident-4411",
                doc_id="transcript:planner-7/incident-4411/12",
                kind="transcript",
                metadata={},
                ranks={"dense": 1, "sparse": 2},
                timestamp="2026-11-29T18:03:00+00:00",
            )
        ],
    )
    console = Console(width=80, record=True, color_system=None)
    console.print(results_view(reply))
    shown = console.export_text()
    lines = shown.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert lines[0] == "1 result in 12.3 ms"
    # Score, ranks and time first; the long chunk id is what the edge cuts.
    assert lines[1].startswith(" 1. 0.0325  dense:1 sparse:2  2026-11-29 18:03 UTC  observation:planner-7")
    assert lines[1].endswith("…")
    body = " ".join(line.strip() for line in lines[2:])
    assert body.startswith("Restarted pgbouncer; the 504s stopped. The pool drained")
    assert body.endswith("…") and len(body) <= 240  # a snippet, not the whole chunk


def test_index_schema_names_the_generation_it_prints() -> None:
    """After a reindex the active generation is no longer 1: the output says whose names it
    shows, and --generation picks another, still valid YAML."""
    import yaml
    from typer.testing import CliRunner

    from daemon.cli import app

    res = CliRunner().invoke(app, ["config", "index-schema", "--generation", "3"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("# generation 3's names")
    assert yaml.safe_load(res.output)["index"]["name"].endswith("-g3")


def test_tenant_topics_are_refused_in_single_tenancy(monkeypatch: pytest.MonkeyPatch) -> None:
    """In single mode the daemon never reads a tenant's topics: creating them is refused, with
    the setting that would make them read, before anything connects."""
    from typer.testing import CliRunner

    from daemon.cli import app

    monkeypatch.setenv("AGENTMEM_CONSUMER__TENANCY", "single")
    monkeypatch.setenv("AGENTMEM_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # nothing listens: never reached
    # Logging set up on CliRunner's stream would outlive it: later tests' logs would hit a closed file.
    monkeypatch.setattr("daemon.cli._app.configure_logging", lambda *_: None)
    res = CliRunner().invoke(app, ["topics", "--tenant", "acme"])
    assert res.exit_code == 1
    assert "AGENTMEM_CONSUMER__TENANCY=topic" in " ".join(res.output.split())


@pytest.mark.parametrize("kind", [["observation", "--agent-id", "a", "--session-id", "s", "hi"], ["doc", "."]])
def test_a_metadata_key_given_twice_is_refused_by_its_name(monkeypatch: pytest.MonkeyPatch, kind: list[str]) -> None:
    """``--meta n=5 --meta n=6`` says the key was given twice (it read "metadata['n'] is an
    array", of an array nobody wrote), before anything connects."""
    from typer.testing import CliRunner

    from daemon.cli import app

    monkeypatch.setenv("AGENTMEM_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # nothing listens: never reached
    monkeypatch.setattr("daemon.cli._app.configure_logging", lambda *_: None)
    res = CliRunner().invoke(app, ["publish", *kind, "--meta", "n=5", "--meta", "n=6"])
    assert res.exit_code == 2, res.output
    assert "--meta n given more than once" in " ".join(res.output.split())


def test_a_generated_config_file_leaves_one_shot_commands_quiet(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`config toml` writes every key, ``log_level = "info"`` too: that is no one asking for
    the info lines (a reindex printed 702 of them); the variable, or another level, is."""
    import os

    from daemon.cli import _app

    for key in [k for k in os.environ if k.startswith("AGENTMEM_")]:
        monkeypatch.delenv(key)
    levels: list[str] = []
    monkeypatch.setattr(_app, "configure_logging", lambda level, _fmt: levels.append(level))
    monkeypatch.setenv("AGENTMEM_CONFIG_FILE", str(Path(__file__).parents[2] / "config" / "agentmemd.toml"))
    _app._settings(quiet=True)
    monkeypatch.setenv("AGENTMEM_LOG_LEVEL", "info")
    _app._settings(quiet=True)
    _app._settings(quiet=False)
    assert levels == ["warning", "info", "info"]
    # Named in .env, as any setting may be: asked for too.
    monkeypatch.delenv("AGENTMEM_LOG_LEVEL")
    (tmp_path / ".env").write_text("AGENTMEM_LOG_LEVEL=info\n")
    monkeypatch.chdir(tmp_path)
    _app._settings(quiet=True)
    assert levels[-1] == "info"


def test_commands_are_listed_in_their_usual_order() -> None:
    """`agentmemd --help` lists the commands, then the groups, in one fixed order, whichever
    module of the cli package registers them."""
    import typer.main

    from daemon.cli import app

    assert list(typer.main.get_command(app).commands) == [  # type: ignore[attr-defined]
        "up",
        "run",
        "servers",
        "query",
        "recent",
        "get",
        "doctor",
        "topics",
        "tenants",
        "erase-tenant",
        "stale",
        "communities",
        "drop-generation",
        "reindex",
        "mcp",
        "publish",
        "dlq",
        "config",
        "docs",
        "graph",
    ]


def rendered(width: int, **result: Any) -> str:
    """The CLI's text for a reply of one result (a turn of ``a/s`` unless ``result`` says otherwise)."""
    from rich.console import Console

    from consumers.requests import QueryReply, ResultItem
    from daemon.cli.query import results_view

    fields: dict[str, Any] = {
        "chunk_id": "transcript:a/s/2_p0",
        "rrf_score": 0.03,
        "source": "a/s",
        "doc_id": "transcript:a/s/2",
        "kind": "transcript",
        "metadata": {"role": "assistant"},
        "ranks": {"sparse": 1},
    }
    console = Console(width=width, record=True, color_system=None)
    hit = ResultItem(**{**fields, **result})
    console.print(results_view(QueryReply(query_id="q", total_retrieved=1, took_ms=1.0, results=[hit])))
    return console.export_text()


def test_query_results_show_the_turns_around_a_turn() -> None:
    """--context-turns: each conversation turn is shown with the exchange around it."""
    from consumers.requests import ContextTurn

    context = [
        ContextTurn(doc_id="transcript:a/s/1", turn=1, role="user", text="Did you finish the pottery class?"),
        ContextTurn(doc_id="transcript:a/s/3", turn=3, role="user", text="Congrats!"),
    ]
    lines = [line.strip() for line in rendered(80, text="Yes, yesterday!", context=context).splitlines()]
    said = [
        "turn 1 (user): Did you finish the pottery class?",
        "» turn 2 (assistant): Yes, yesterday!",
        "turn 3 (user): Congrats!",
    ]
    assert lines[2:] == said  # the turn in its place in the exchange, marked as the match


def test_piped_query_results_keep_whole_lines() -> None:
    """Piped, nothing is cut at the console's width: not the chunk id (the only thing naming
    what matched), not the text; and no line is padded with spaces."""
    from rich.console import Console

    from consumers.requests import ContextTurn, QueryReply, ResultItem
    from daemon.cli.query import results_view

    long_id = "transcript:planner-7/incident-4411/12_p0" + "-x" * 40
    text = "Restarted pgbouncer; the 504s stopped. " + "The pool drained after the deploy of billing. " * 4
    hit = ResultItem(
        chunk_id=long_id,
        rrf_score=0.03,
        text=text.strip(),
        source="planner-7/incident-4411",
        doc_id="transcript:planner-7/incident-4411/12",
        kind="transcript",
        metadata={"role": "assistant"},
        ranks={"dense": 1, "sparse": 2},
        context=[ContextTurn(doc_id="transcript:planner-7/incident-4411/13", turn=13, role="user", text=text)],
    )
    console = Console(width=80, record=True, color_system=None, soft_wrap=True)
    reply = QueryReply(query_id="q", total_retrieved=1, took_ms=1.0, results=[hit])
    console.print(results_view(reply, whole_lines=True))
    lines = console.export_text().splitlines()
    assert lines[1].endswith(long_id) and all(line == line.rstrip() for line in lines)
    assert lines[2:] == ["    » turn 12 (assistant): " + text.strip(), "    turn 13 (user): " + text.strip()]


def test_a_community_summary_says_it_is_one_and_whether_it_is_stale() -> None:
    from consumers.requests import CommunityInfo

    said = rendered(
        120,
        chunk_id="community:c1-a88d_p0",
        text="Entities: billing-service, pgbouncer.",
        source="community",
        doc_id="community:c1-a88d",
        kind="community",
        metadata={},
        community=CommunityInfo(community_id="c1-a88d", level=1, member_count=7, stale=True),
    )
    assert (
        "(community summary, level 1, 7 members, stale: marked to be written again (`agentmemd stale` says why))"
        in said
    )


@pytest.mark.parametrize("command", [["doctor"], ["config", "show"]])
def test_a_filter_key_list_that_is_not_json_is_named_with_the_form_it_takes(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`AGENTMEM_INDEX__EXTRA_FILTER_KEYS=team,role` is no JSON list: the command fails with
    the form the variable takes, not pydantic-settings' traceback."""
    from typer.testing import CliRunner

    from daemon.cli import app

    monkeypatch.setenv("AGENTMEM_INDEX__EXTRA_FILTER_KEYS", "team,role")
    res = CliRunner().invoke(app, command)
    assert res.exit_code == 1 and (res.exception is None or isinstance(res.exception, SystemExit)), res.exception
    said = " ".join(res.output.split())
    assert "invalid settings" in said and """AGENTMEM_INDEX__EXTRA_FILTER_KEYS='["team", "role"]'""" in said, said


def test_text_with_tabs_form_feeds_and_colours_is_text_and_a_nul_or_control_soup_is_not() -> None:
    from daemon.cli._files import binary_at

    assert binary_at("# Title\n\n\tindented\r\n\f\x1b[31mred\x1b[0m " * 50) is None
    assert binary_at("one stray \x07 bell in a long text" + " and more words" * 20) is None  # under 1 %
    assert binary_at("text\x00more") == 4
    assert binary_at("%PDF-1.4\n" + "".join(map(chr, range(1, 32))) * 4) == 9


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["publish", "doc", "{path}", "--doc-id", ""], "--doc-id is empty"),
        (["publish", "doc", "{path}", "--wait", "--timeout", "0"], "--timeout"),
        (["publish", "doc", "{path}", "--timeout", "60"], "give --wait too"),
        (["query", "x", "--filter", "env"], "key=value or key!=value"),
        (["query", "x", "--filter", "env=a", "--filter", "env!=b"], "both = and !="),
    ],
)
def test_bad_options_are_refused_before_anything_connects(
    args: list[str], said: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An empty doc id is not the path in disguise, a wait needs some time, and a filter is
    key=value or key!=value on each key: refused with a usage error, nothing sent."""
    from typer.testing import CliRunner

    from daemon.cli import app

    doc = tmp_path / "a.md"
    doc.write_text("A note.")
    monkeypatch.setenv("AGENTMEM_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # nothing listens: never reached
    monkeypatch.setattr("daemon.cli._app.configure_logging", lambda *_: None)
    res = CliRunner().invoke(app, [a.format(path=doc) for a in args])
    assert res.exit_code == 2, res.output
    assert said in " ".join(res.output.split()), res.output


def test_a_stale_communitys_summary_state_says_failing_why_and_when_again() -> None:
    from graph.stale_queue import StaleItem

    base = StaleItem("c1", 0, 10.0, 20.0, 1, [])
    assert base.state(100.0) == "waiting"
    held = StaleItem("c1", 0, 10.0, 20.0, 1, [], claimed=True)
    assert held.state(100.0).startswith("being written (or held by a worker that died")
    failing = StaleItem("c1", 0, 10.0, 20.0, 1, [], attempts=3, last_error="LlmFailed: timeout", retry_at=130.0)
    assert failing.state(100.0) == "failed 3x, again in 30s: LlmFailed: timeout"


def test_metadata_under_a_memorys_own_filter_key_is_kept_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    """``--meta kind=runbook`` is stored, but the filter key ``kind`` reads the memory's own kind."""
    from daemon.cli.publish import _metadata

    assert _metadata(["kind=runbook", "team=ops"]) == {"kind": "runbook", "team": "ops"}
    said = " ".join(capsys.readouterr().err.split())
    assert "--meta kind is kept" in said and "doc_kind" in said, said
    assert _metadata(["team=ops"]) == {"team": "ops"} and capsys.readouterr().err == ""


def test_a_long_result_shows_the_part_that_holds_the_question() -> None:
    """A chunk whose match is at its end shows that part, marked cut on both sides; one whose
    start holds the question's words (or that the question names nothing of) its start."""
    from daemon.cli.query import _snippet

    text = "split [<local-commit>] [<repository>]:: Extract a new, synthetic project history. " * 12
    text += "The subtree ticket SUBT-4410 was closed after the rewrite."
    shown = _snippet(text, 120, "SUBT-4410 subtree")
    assert shown.startswith("…") and "SUBT-4410" in shown and len(shown) <= 120, shown
    assert _snippet(text, 120, "extract synthetic history").startswith("split [<local-commit>]")
    assert _snippet(text, 120, "").startswith("split") and _snippet(text, 120, "").endswith("…")
    assert _snippet("short text", 120, "text") == "short text"


def test_repeats_within_one_long_turn_are_named_by_their_chunks() -> None:
    """A long turn's chunks that say the same thing share its doc id: the fold names their
    chunk ids, not one doc id three times; repeats in other memories keep their doc ids."""
    from rich.console import Console

    from consumers.requests import QueryReply, Repeat, ResultItem
    from daemon.cli.query import results_view

    doc = "transcript:coder-2/s-long/0"

    def reply(repeats: list[Repeat]) -> str:
        item = ResultItem(
            chunk_id=f"{doc}_p0",
            rrf_score=0.03,
            text="PASS test_io",
            source="",
            doc_id=doc,
            kind="transcript",
            metadata={},
            ranks={"sparse": 1},
            repeats=repeats,
            repeat_count=len(repeats),
        )
        console = Console(width=200, record=True, color_system=None)
        console.print(results_view(QueryReply(query_id="q", total_retrieved=1, took_ms=1.0, results=[item])))
        return console.export_text()

    same = reply([Repeat(doc_id=doc, chunk_id=f"{doc}_p{n}") for n in (1, 2, 3, 4)])
    assert f"the same text in 4 more: {doc}_p1, {doc}_p2, {doc}_p3, …" in same
    others = reply(
        [Repeat(doc_id=f"transcript:coder-2/s{n}/0", chunk_id=f"transcript:coder-2/s{n}/0_p0") for n in (1, 2)]
    )
    assert "the same text in 2 more: transcript:coder-2/s1/0, transcript:coder-2/s2/0)" in others


def test_recent_cuts_a_long_turn_and_says_how_much_is_left() -> None:
    """`recent` prints a turn of a pasted 200 KB log as its first characters and the count of
    the rest; a short turn whole."""
    from consumers.requests import GetItem
    from daemon.cli.query import RECENT_TURN_CHARS, turn_view

    meta = {"session_id": "s", "turn": 4, "role": "tool"}
    long = GetItem(doc_id="transcript:a/s/4", status="found", content="x" * 200_000, metadata=meta)
    parts = [p.plain for p in turn_view(long)]
    assert parts[0] == "?  s/4 tool:" and parts[1] == "x" * RECENT_TURN_CHARS
    assert parts[2] == f"… ({200_000 - RECENT_TURN_CHARS:,} more characters: `--json` shows them)"
    short = GetItem(doc_id="transcript:a/s/5", status="found", content="done", metadata=meta)
    assert [p.plain for p in turn_view(short)][1:] == ["done"]


def test_a_result_under_headings_shows_its_section_above_its_text() -> None:
    """`query` prints a document chunk's section on its own line, before the chunk's text."""
    from rich.console import Console

    from consumers.requests import QueryReply
    from daemon.cli.query import results_view
    from tests.helpers.results import result_item

    item = result_item(section="Runbook > Failover")
    console = Console(width=120, record=True, color_system=None)
    console.print(results_view(QueryReply(query_id="q", total_retrieved=1, took_ms=1.0, results=[item])))
    lines = [line.strip() for line in console.export_text().splitlines()]
    assert lines[2:4] == ["§ Runbook > Failover", "Then repoint the clients."]


def test_a_stored_texts_escape_sequences_are_shown_never_sent_to_the_terminal() -> None:
    """A memory holding terminal escape sequences (clear the screen, retitle the window, an
    8-bit CSI) is printed by `query`, `recent`, errors and tables with ``␛`` in their place:
    what a memory holds is shown, never obeyed."""
    import io

    from rich.table import Table

    from consumers.requests import GetItem, QueryReply
    from daemon.cli._app import _SafeConsole
    from daemon.cli.query import results_view, turn_view
    from tests.helpers.results import result_item

    buf = io.StringIO()
    console = _SafeConsole(file=buf, force_terminal=True, width=200, color_system=None)
    evil = "\x1b[31mRED\x1b[0m \x1b]0;PWNED\x07 \x9b2J"
    item = result_item(chunk_id="d_p0\x1b[2J", text=evil, section="Runbook\x1b[2J")
    console.print(results_view(QueryReply(query_id="q", total_retrieved=1, took_ms=1.0, results=[item])))
    console.print(*turn_view(GetItem(doc_id="t", status="found", content=evil, metadata={})))
    console.print(f"[red]error:[/red] {evil}")
    table = Table("community", "entities")  # `graph communities` lists stored names in a table
    table.add_row("c0", evil)
    console.print(table)
    shown = buf.getvalue()
    assert "\x1b" not in shown and "\x9b" not in shown and "\x07" not in shown
    assert "␛[31mRED␛[0m" in shown and "d_p0␛[2J" in shown and "§ Runbook␛[2J" in shown


def test_json_output_escapes_the_controls_a_terminal_may_obey() -> None:
    """`--json` output writes C1 controls and DEL as JSON escapes (pydantic writes them raw, and
    a UTF-8 terminal may act on U+009B): the same JSON to a parser, unicode text left as it is."""
    import json

    from consumers.requests import QueryReply
    from daemon.control_pictures import json_for_terminal
    from tests.helpers.results import result_item

    reply = QueryReply(query_id="q", total_retrieved=1, took_ms=1.0, results=[result_item(text="a\x9b2J\x7f é")])
    shown = json_for_terminal(reply.model_dump_json(indent=2))
    assert "\x9b" not in shown and "\x7f" not in shown and "é" in shown
    assert json.loads(shown) == json.loads(reply.model_dump_json())


def test_get_names_the_ids_a_reply_left_off_and_exits_3(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply cut to one record answers only its first ids: the rest are named, and the exit
    code is 3 as for an id not found (0 would read as every id shown)."""
    from typer.testing import CliRunner

    from consumers.requests import GetItem, GetReply
    from daemon.cli import app

    reply = GetReply(
        query_id="g",
        items=[GetItem(doc_id="big", status="found", version=1, content="x" * 50, content_truncated=True)],
        took_ms=1.0,
        truncated=True,
    )
    monkeypatch.setattr("daemon.cli._app.configure_logging", lambda *_: None)
    monkeypatch.setattr("daemon.cli.get._with_client", lambda *_a, **_k: (reply, None))
    res = CliRunner().invoke(app, ["get", "big", "nope", "small", "big"])
    assert res.exit_code == 3, res.output
    assert "left off to fit one Kafka record: nope, small; get them on their own" in " ".join(res.output.split())
    whole = reply.model_copy(update={"truncated": False})
    monkeypatch.setattr("daemon.cli.get._with_client", lambda *_a, **_k: (whole, None))
    assert CliRunner().invoke(app, ["get", "big"]).exit_code == 0


def test_get_raw_prints_the_content_alone_and_version_reads_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """--raw writes the content byte for byte (no header, no newline added, carriage returns
    and tabs kept); a document being written exits 3 like one not found; --version with two
    ids or with --history is refused before anything is asked; a version not kept says which is."""
    from typer.testing import CliRunner

    from consumers.requests import GetItem, GetReply
    from daemon.cli import app

    text = "\tline one\r\nline two é"
    reply = GetReply(query_id="g", items=[GetItem(doc_id="d", status="found", version=2, content=text)], took_ms=1.0)
    monkeypatch.setattr("daemon.cli._app.configure_logging", lambda *_: None)
    monkeypatch.setattr("daemon.cli.get._with_client", lambda *_a, **_k: (reply, None))
    res = CliRunner().invoke(app, ["get", "d", "--raw"])
    assert (res.exit_code, res.stdout_bytes) == (0, text.encode())
    for args, says in (
        (["d", "e", "--version", "1"], "name one id"),
        (["d", "--version", "1", "--history"], "leave out --history"),
        (["d", "e", "--raw"], "--raw prints one content alone"),
    ):
        res = CliRunner().invoke(app, ["get", *args])
        assert res.exit_code == 2 and says in " ".join(res.output.replace("│", " ").split()), res.output
    writing = GetReply(query_id="g", items=[GetItem(doc_id="d", status="writing")], took_ms=1.0)
    monkeypatch.setattr("daemon.cli.get._with_client", lambda *_a, **_k: (writing, None))
    assert CliRunner().invoke(app, ["get", "d"]).exit_code == 3
    gone = GetReply(query_id="g", items=[GetItem(doc_id="d", status="not_found")], took_ms=1.0)
    monkeypatch.setattr("daemon.cli.get._with_client", lambda *_a, **_k: (gone, 9))
    res = CliRunner().invoke(app, ["get", "d", "--version", "3"])
    assert res.exit_code == 3 and "version 3 is not kept; the current version is 9" in " ".join(res.output.split())
