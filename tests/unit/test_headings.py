"""The headings a document's chunks fall under (memory.headings)."""

from __future__ import annotations

import pytest

from memory.headings import (
    MAX_PATH_CHARS,
    Heading,
    has_headings,
    heading_paths,
    headings,
    open_fences,
    prose,
    read_alone,
)

MARKDOWN = """# Runbook

Intro.

## Failover

Step one.

### Manual

Step two.

## Backups

Nightly.
"""


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (MARKDOWN, [(1, "Runbook"), (2, "Failover"), (3, "Manual"), (2, "Backups")]),
        ("## Closed ##\n\nx\n", [(2, "Closed")]),
        ("#hashtag, not a heading\n", []),
        ("    # indented code\n", []),
        ("```python\n# a comment\nx = 1\n```\n\n# After\n", [(1, "After")]),
        ("~~~~\n# a comment\n~~~\n# still code\n~~~~\n", []),
        ("# Md\n\nTitle\n=====\n\nSub\n---\n", [(1, "Md"), (1, "Title"), (2, "Sub")]),
        ("Title\n*****\n\nSection\n=======\n\nMore\n-------\n", [(1, "Title"), (2, "Section"), (3, "More")]),
        ("=====\nOver\n=====\n\nUnder\n=====\n", [(1, "Over"), (2, "Under")]),
        ("# Md\n\nTitle\n~~~~~\n", [(1, "Md")]),
        ("A paragraph that goes on\nand ends here\n---\n", []),
        ("- item\n---\n", []),
        ("| a | b |\n---\n", []),
        ("---\ntitle: x\n---\n\nBody\n", []),
        ("Body\n\n----\n", []),
        ("# **Bold** `max_per_doc` title\n", [(1, "Bold max_per_doc title")]),
        ("# " + "x" * 200 + "\n", []),
        ("# ---\n", []),
        ("# C#\n\n## Title ##\n\n### Ends with a hash# \n", [(1, "C#"), (2, "Title"), (3, "Ends with a hash#")]),
        ("#\n##\n", []),
        (
            "Title\n=====\n\nSection\n-------\n\nExample::\n\n   # compute the total\n   x = 1\n\nSub\n^^^\n",
            [(1, "Title"), (2, "Section"), (3, "Sub")],
        ),
        ("Title\n=====\n\n```\n# not markdown\n```\n\nSub\n^^^\n", [(1, "Title"), (2, "Sub")]),
    ],
)
def test_headings_are_found_with_their_depths(text: str, want: list[tuple[int, str]]) -> None:
    """Markdown's and reStructuredText's headings are found, code and rules are not."""
    assert [(h.level, h.title) for h in headings(text)] == want


def test_a_heading_starts_at_its_line_or_its_overline() -> None:
    """Where a heading starts is where its first line does (the overline of an overlined title)."""
    text = "intro\n\n=====\nOver\n=====\n"
    assert headings(text) == [Heading(text.index("====="), 1, "Over")]


def test_each_chunk_is_under_the_headings_in_force_where_it_starts() -> None:
    """A chunk inside a section is under its whole path; one that opens with a heading is under
    that heading's parents; one before any heading is under none."""
    at = MARKDOWN.index
    starts = [0, at("Intro."), at("## Failover"), at("Step one."), at("### Manual"), at("Step two."), at("Nightly.")]
    assert heading_paths(MARKDOWN, starts) == [
        "",
        "Runbook",
        "Runbook",
        "Runbook > Failover",
        "Runbook > Failover",
        "Runbook > Failover > Manual",
        "Runbook > Backups",
    ]
    assert heading_paths("no headings here", [0, 3]) == ["", ""]


def test_a_long_path_keeps_its_innermost_headings() -> None:
    """A path longer than MAX_PATH_CHARS drops its outermost headings first."""
    titles = [f"{'Section' * 10} {n}" for n in range(1, 7)]
    text = "".join(f"{'#' * n} {t}\n\nbody {n}\n\n" for n, t in enumerate(titles, start=1))
    path = heading_paths(text, [text.index("body 6")])[0]
    assert len(path) <= MAX_PATH_CHARS and path.endswith(titles[-1]) and titles[0] not in path


@pytest.mark.parametrize(
    ("names", "want"),
    [
        (("wiki/runbook.md",), True),
        (("notes/db outage", ""), True),
        (("scripts/deploy.sh", ""), False),
        (("doc-1", "config/app.YAML"), False),
        (("src/main.py",), False),
        (("Dockerfile",), False),
    ],
)
def test_files_whose_hash_opens_a_comment_have_no_headings(names: tuple[str, ...], want: bool) -> None:
    """A document named as a file of a language with ``#`` comments is not read for headings."""
    assert has_headings(*names) is want


def test_a_heading_line_of_many_spaces_is_read_in_one_pass() -> None:
    """A ``#`` line holding 100,000 spaces (a pasted log, a generated file) is no heading and
    costs one pass: a pattern that backtracked over it took minutes, holding its partition."""
    text = "# a" + " " * 100_000 + "b\n\n# Next\n"
    assert [h.title for h in headings(text)] == ["Next"]


def test_every_chunk_of_a_long_section_is_under_its_heading() -> None:
    """20,000 chunks of one long section, none starting at its heading, are all under it."""
    text = "# Top\n\n" + "word " * 200_000
    starts = list(range(10, len(text), 50))
    assert set(heading_paths(text, starts)) == {"Top"}


def test_a_chunk_cut_from_inside_fenced_code_knows_its_fence() -> None:
    """A chunk that starts inside a fenced block gets the block's fence; one that starts on or
    after its closing line gets none; a chunk starting inside an opening fence line is past it."""
    text = "# Notes\n\nIntro.\n\n```python\nimport x\nfrom y import z\n```\n\nProse after.\n~~~~\ncode\n~~~~\nEnd."
    starts = [0, text.index("import"), text.index("from"), text.index("```\n\nProse"), text.index("Prose")]
    starts += [text.index("code"), text.index("End"), text.index("python")]
    assert open_fences(text, starts) == ["", "```", "```", "```", "", "~~~~", "", "```"]
    assert open_fences("No code here.", [0, 3]) == ["", ""]
    # In a nested list item a fence is indented further, and a longer fence holds a shorter one.
    nested = "- step:\n\n      ````\n      ```\n      inner\n      ```\n      ````\n\nAfter."
    assert open_fences(nested, [nested.index("inner"), nested.index("After")]) == ["````", ""]


def test_a_restructuredtext_title_underlined_with_tildes_opens_no_fence() -> None:
    """reStructuredText underlines (and overlines) titles with ``~`` too: a section's prose is
    no code, and its title is a heading."""
    text = "Guide\n=====\n\nIntro prose.\n\nPart A\n~~~~~~\n\nProse of A is here.\n\n"
    text += "~~~~~~\nPart B\n~~~~~~\n\nProse of B."
    assert open_fences(text, [text.index("Prose of A"), text.index("Prose of B")]) == ["", ""]
    assert [h.title for h in headings(text)] == ["Guide", "Part A", "Part B"]


def test_prose_leaves_out_fenced_code_and_a_chunk_cut_inside_reads_as_code() -> None:
    text = "Alice runs it.\n```text\nGlobex Tokyo\n```\nBob reviews it.\n~~~\nAcme\n~~~\n"
    assert prose(text) == "Alice runs it.\n\n\n\nBob reviews it.\n\n\n"
    # Cut from inside a block: read after its fence, its code stays out, the prose after it in.
    cut = "Globex Tokyo\n```\nBob reviews it."
    assert prose(cut) == "Globex Tokyo\n\n"  # alone, its code is prose and its closing fence opens a block
    assert prose(read_alone(cut, "```")).splitlines() == ["", "", "", "Bob reviews it."]
    # A reStructuredText title's underline of "~" is no fence.
    assert prose("Setup\n~~~~~\nAlice runs it.") == "Setup\n~~~~~\nAlice runs it."
    assert read_alone("text", "") == "text"
