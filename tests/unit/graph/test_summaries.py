"""Extractive summaries and parsing of LLM extraction replies (pure)."""

from __future__ import annotations

import pytest

from graph.errors import LlmFailed
from graph.llm import parse_entities, summary_prompt
from graph.summaries import community_sources, extractive_summary, split_sentences

TEXTS = [
    "The billing-service returned HTTP 504 during the outage. Lunch was at noon.",
    "PgBouncer hit max_connections, so billing-service requests queued. Nothing else happened.",
    "Raising max_connections and restarting PgBouncer fixed the HTTP 504 errors.",
]
NAMES = {
    "billing-service": "billing-service",
    "http 504": "HTTP 504",
    "max_connections": "max_connections",
    "pgbouncer": "PgBouncer",
}


def test_summary_covers_members_and_skips_filler() -> None:
    """Chosen sentences cover the members; sentences naming none are left out."""
    s = extractive_summary(TEXTS, NAMES, {k: 1.0 for k in NAMES}, max_sentences=2)
    assert s.startswith("Entities: ")
    assert "Lunch" not in s and "Nothing else" not in s
    for name in NAMES.values():
        assert name.lower() in s.lower()


def test_summary_is_deterministic_and_bounded() -> None:
    """Same input, same summary; never more sentences than asked."""
    a = extractive_summary(TEXTS, NAMES, {"pgbouncer": 3.0}, max_sentences=1)
    assert a == extractive_summary(TEXTS, NAMES, {"pgbouncer": 3.0}, max_sentences=1)
    assert len(split_sentences(a.split(". ", 1)[1])) == 1


def test_summary_prompt_carries_members_and_excerpts() -> None:
    """The LLM prompt names every member and quotes the excerpts."""
    p = summary_prompt("c0-1", ["billing-service", "HTTP 504"], ["excerpt one"])
    assert "billing-service, HTTP 504" in p and "- excerpt one" in p and "c0-1" in p


@pytest.mark.parametrize(
    ("reply", "pairs"),
    [
        ('{"entities": [{"name": "billing-service", "type": "service"}]}', [("billing-service", "service")]),
        ('Sure! {"entities": [{"name": "X"}, {"name": ""}, 5]}', [("X", "concept")]),
    ],
)
def test_parse_entities(reply: str, pairs: list[tuple[str, str]]) -> None:
    """Entity JSON is read leniently: missing types default, junk items are skipped."""
    assert parse_entities(reply) == pairs


@pytest.mark.parametrize("reply", ["no json here", '{"things": []}', "{broken"])
def test_parse_entities_rejects_non_answers(reply: str) -> None:
    """A reply without the asked-for JSON is a retryable failure."""
    with pytest.raises(LlmFailed):
        parse_entities(reply)


def test_a_markdown_heading_is_no_sentence() -> None:
    text = "# Password Reset\n\nA password reset sends a link that expires in 15 minutes.\n## Notes\n#4411 reopened."
    assert split_sentences(text) == ["A password reset sends a link that expires in 15 minutes.", "#4411 reopened."]


def test_code_tables_and_data_are_no_sentences() -> None:
    """A summary of a technical page quotes its prose, not its JSON, tables or code."""
    text = (
        "The reply carries each hit's rrf_score and chunk_id.\n\n"
        '```json\n{"query_id": "mem_req_99214", "results": [{"chunk_id": "a_p0", "rrf_score": 0.03}]}\n'
        "The fence's text is code even where it reads as prose.\n```\n"
        "| field | type |\n|---|---|\n| rrf_score | float |\n"
        '{"doc_id": "runbooks/ledger.md"}\n'
        "x = f(a[0], b[1]); y = {k: v for k, v in z}\n"
        "Run `VACUUM FULL ledger_entries` monthly, then check rrf_score again.\n"
        "~~~\nunclosed fence to the end\n"
    )
    assert split_sentences(text) == [
        "The reply carries each hit's rrf_score and chunk_id.",
        "Run `VACUUM FULL ledger_entries` monthly, then check rrf_score again.",
    ]


def test_a_longer_fence_holds_a_shorter_one_and_an_indented_fence_is_one() -> None:
    """A block fenced with four backticks, showing one fenced with three, is code to its own
    closing line; a fenced block in a nested list item is indented further: neither block's
    lines are sentences."""
    text = (
        "Docs show fences like this.\n\n````\n```python\nx = 1\n```\nThis line is code too.\n````\n\n"
        "- Then:\n\n      ```\n      This line is code as well.\n      ```\n\nThe end is prose."
    )
    assert split_sentences(text) == ["Docs show fences like this.", "Then:", "The end is prose."]


def test_a_sentence_wrapped_over_lines_is_one_sentence() -> None:
    """Markdown is hard-wrapped: a sentence cut at each line break read as fragments in the
    summaries ("or time out with", "reduce max.poll.records to")."""
    text = (
        "Checkout updates wait and fail with SQLSTATE 40001 or time out with\n"
        "ERR_DB_TIMEOUT_91B. Seen in INC-4502.\n\n"
        "- reduce max.poll.records to\n  100 under load.\n"
        "- restart the consumer.\n"
        "## Notes\n"
        "| field | type |\n"
        "The table above lists the fields.\n"
        "x = f(a[0], b[1]); y = {k: v for k, v in z}\n"
        "Run it monthly.\n"
        "+---------+   --->   +--------+\n"
        "504s at 18:02, 19:10 and 20:45.\n"
    )
    assert split_sentences(text) == [
        "Checkout updates wait and fail with SQLSTATE 40001 or time out with ERR_DB_TIMEOUT_91B.",
        "Seen in INC-4502.",
        "reduce max.poll.records to 100 under load.",
        "restart the consumer.",
        "The table above lists the fields.",
        "Run it monthly.",
        "504s at 18:02, 19:10 and 20:45.",
    ]


def test_lines_that_close_no_sentence_are_joined_only_up_to_a_sentences_length() -> None:
    """Log lines or a list without markers: joined whole, one "sentence" could fill a summary."""
    lines = [f"worker-{i} restarted after OOMKilled on node pool-b at step {i}" for i in range(20)]
    said = split_sentences("\n".join(lines))
    assert len(said) > 1 and all(len(s.split()) <= 60 for s in said), said
    assert " ".join(said) == " ".join(lines)


def test_a_terminals_escapes_are_no_text() -> None:
    """A captured log or man page holds colour codes: they never reach a summary."""
    assert split_sentences("Stray cats\x1b[0m macros are gone. The \x1b[1mbold\x1b[22m flag\x07 works.") == [
        "Stray cats macros are gone.",
        "The bold flag works.",
    ]


def test_a_summary_names_the_documents_its_members_come_from() -> None:
    """Most mentions first; a conversation's turns count as their session."""
    chunks = {
        "pgbouncer": ["wiki/pool.md_p0", "wiki/pool.md_p1", "transcript:ops/s1/3_p0"],
        "billing-service": ["wiki/pool.md_p0", "transcript:ops/s1/4_p0", "wiki/billing.md_p0"],
    }
    assert community_sources(chunks) == (["wiki/pool.md", "transcript:ops/s1", "wiki/billing.md"], 3)
    assert community_sources(chunks, limit=1) == (["wiki/pool.md"], 3)
    text = extractive_summary(
        ["pgbouncer pools billing-service connections."],
        {"pgbouncer": "pgbouncer", "billing-service": "billing-service"},
        {},
        sources=community_sources(chunks, limit=2),
    )
    assert text.endswith("Sources: wiki/pool.md, transcript:ops/s1 (+1 more).")
    assert extractive_summary(["x"], {"a": "a"}, {}).endswith("Entities: a.")  # no sources: none said


def test_hyperlinks_character_sets_and_carriage_returns_leave_no_trace() -> None:
    text = "See \x1b]8;;https://x.org\x07the docs\x1b]8;;\x07 here.\rLine two ends\x1b(B\x1b[m well."
    assert split_sentences(text) == ["See the docs here.", "Line two ends well."]
