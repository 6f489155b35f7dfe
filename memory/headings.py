"""The headings a document's chunks fall under (pure).

A section longer than one chunk is cut into several, and only the first holds its heading:
"Retries" under "Kafka consumer" under "Configuration" is, in its second chunk, a paragraph
about retries of nothing in particular. Each chunk is read with the headings it falls under
(``ChunkRecord.context_vec`` and its BM25 terms), as a reader of the page would read it.

Headings are Markdown's (``## Title``, and a title underlined with ``===`` or ``---``) and
reStructuredText's (a title underlined, and maybe overlined, with a run of one punctuation
character), outside fenced code. A source file in a language whose comments start with
``#`` has no headings: its comments are not titles.

A chunk cut from inside fenced code is marked with its fence (:func:`open_fences`), so that
what reads it alone (a community summary) knows its opening lines for code.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

#: What joins the headings of a path, outermost first.
PATH_SEPARATOR = " > "
#: Longest heading kept, in characters (a longer "heading" is a paragraph set as one).
MAX_HEADING_CHARS = 120
#: Longest path kept, in characters; the outermost headings go first.
MAX_PATH_CHARS = 300

#: The opening of a ``#`` heading line; its title is cut out by :func:`_atx_title`, not by a
#: pattern: one with a lazy title and an optional closing run backtracks without end on a
#: line of many spaces.
_ATX = re.compile(r" {0,3}(#{1,6})[ \t]")
#: A ``#`` heading with no indent: a document with one outside fenced code is Markdown.
_MARKDOWN_ATX = re.compile(r"#{1,6}[ \t]")
_BLANK = re.compile(r"\s*")
_UNDERLINE = re.compile(r"^([=\-~^*+#])\1{2,}[ \t]*$")
#: A line that opens a list item, a table row or a quote: Markdown never underlines one into a title.
_NOT_TITLE = re.compile(r"^\s*(?:[-*+][ \t]|\d{1,9}[.)][ \t]|[|>])")
#: A fence line, at any indent (a fenced block in a nested list item is indented further), as
#: the summarizer reads one (``graph.summaries``).
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
#: File name endings of languages (and formats) where a line opening with ``#`` is a comment.
_HASH_COMMENTED = (
    ".py", ".pyi", ".sh", ".bash", ".zsh", ".rb", ".pl", ".r", ".yaml", ".yml", ".toml", ".ini",
    ".cfg", ".conf", ".env", ".tf", ".nix", ".ps1", ".cmake", ".dockerfile", "dockerfile", "makefile",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Heading:
    """A heading: where its line starts in the text, its depth (1 outermost) and its title."""

    start: int
    level: int
    title: str


def has_headings(*names: str) -> bool:
    """Whether a document named so (its id, its source) can hold headings: not a file of a
    language whose ``#`` opens a comment."""
    return not any(n.lower().endswith(_HASH_COMMENTED) for n in names if n)


def headings(text: str) -> list[Heading]:
    """The headings of ``text`` in order (see the module's docstring).

    A document is Markdown when a line outside fenced code opens with ``#`` and a space, with
    no indent: then ``#`` lines are headings (up to three spaces in, as Markdown allows), a
    title underlined with ``===`` is at depth 1 and one with ``---`` at 2. Elsewhere no ``#``
    line is one (a comment in an indented code block of reStructuredText), and underlined
    titles take their depths in the order their styles first appear (reStructuredText's rule).
    """
    out: list[Heading] = []
    lines, starts = _lines(text)
    markdown, open_at_start, open_at_end = _fences(lines)
    coded = _coded(open_at_start, open_at_end)
    styles: dict[str, int] = {"=": 1, "-": 2} if markdown else {}
    for i, line in enumerate(lines):
        if coded[i]:
            continue
        if markdown and (m := _ATX.match(line)) and (title := _title(_atx_title(line[m.end() :]))):
            out.append(Heading(starts[i], len(m.group(1)), title))
            continue
        if not (m := _UNDERLINE.match(line)) or i == 0:
            continue
        title = _title(lines[i - 1])
        above = lines[i - 2] if i >= 2 else ""
        overlined = bool(_UNDERLINE.match(above)) and above.strip()[0] == m.group(1)
        if overlined:
            before = lines[i - 3] if i >= 3 else ""
            if i == 2 and m.group(1) == "-":
                continue  # front matter of one line (``---`` / ``title: x`` / ``---``)
        else:
            before = lines[i - 2] if i >= 2 else ""
        if not title or _NOT_TITLE.match(lines[i - 1]) or _UNDERLINE.match(lines[i - 1].strip()) or before.strip():
            continue  # no title, or the last line of a paragraph, whose underline is a rule
        style = ("over" if overlined else "") + m.group(1)
        if markdown and style not in styles:
            continue  # Markdown underlines with "=" and "-" alone
        level = styles.setdefault(style, len(styles) + 1)
        start = starts[i - 2] if overlined else starts[i - 1]
        out.append(Heading(start, level, title))
    return out


def _may_fence(text: str) -> bool:
    """Whether ``text`` holds a run that could open a fence: else no line of it is code."""
    return "```" in text or "~~~" in text


def _lines(text: str) -> tuple[list[str], list[int]]:
    """``text``'s lines without their ends, and where each starts (one more: the text's end)."""
    raws = text.splitlines(keepends=True)
    starts = [0]
    for raw in raws:
        starts.append(starts[-1] + len(raw))
    return [raw.rstrip("\r\n") for raw in raws], starts


def _fence_states(lines: Sequence[str], *, rst: bool) -> tuple[list[str], list[str]]:
    """The fence open where each line starts, and where it ends ("" outside fenced code)."""
    before: list[str] = []
    after: list[str] = []
    fence = ""
    for i, line in enumerate(lines):
        before.append(fence)
        if fence:
            if line.strip().startswith(fence) and set(line.strip()) == {fence[0]}:
                fence = ""
        else:
            fence = _opens(lines, i, rst=rst)
        after.append(fence)
    return before, after


def _opens(lines: Sequence[str], i: int, *, rst: bool) -> str:
    """The fence line ``i`` opens, or "". In reStructuredText (``rst``) a run of ``~`` as long
    as the title above it, or around it, is that title's underline or overline, no fence."""
    if not (m := _FENCE.match(lines[i])):
        return ""
    run = lines[i].strip()
    if rst and set(run) == {"~"}:
        above = lines[i - 1].strip() if i else ""
        below = lines[i + 1].strip() if i + 1 < len(lines) else ""
        after = lines[i + 2].strip() if i + 2 < len(lines) else ""
        if (above and len(above) <= len(run)) or (below and after == run and len(below) <= len(run)):
            return ""
    return m.group(1)


def _fences(lines: Sequence[str]) -> tuple[bool, list[str], list[str]]:
    """Whether the text is Markdown (a ``#`` heading line outside fenced code), and the fence
    open where each line starts and where it ends, read as that kind of text (see :func:`_opens`)."""
    before, after = _fence_states(lines, rst=False)
    if any(not (before[i] or after[i]) and _MARKDOWN_ATX.match(line) for i, line in enumerate(lines)):
        return True, before, after
    return False, *_fence_states(lines, rst=True)


def _coded(before: Sequence[str], after: Sequence[str]) -> list[bool]:
    """Whether each line is fenced code (the fences' own lines too)."""
    return [bool(b or a) for b, a in zip(before, after, strict=True)]


def open_fences(text: str, chunk_starts: Sequence[int]) -> list[str]:
    """For each chunk (by where it starts in ``text``), the fence of the code block it starts
    inside (its opening run: ```` ``` ````, ``~~~~``), or "" outside one.

    A chunk cut from inside a block holds no opening fence: read alone, its code would pass
    for prose, and its closing fence would open a block of the prose after it. A chunk that
    starts inside a fence line is taken as past it.
    """
    if not _may_fence(text):
        return [""] * len(chunk_starts)
    lines, starts = _lines(text)
    _, before, after = _fences(lines)
    out = []
    for offset in chunk_starts:
        i = bisect_right(starts, offset) - 1
        if i >= len(lines):
            out.append(after[-1] if after else "")
        else:
            out.append(before[i] if offset == starts[i] else after[i])
    return out


def read_alone(text: str, fence: str) -> str:
    """A chunk's text as read on its own: after the fence open where it starts
    (:func:`open_fences`), so that its code reads as code."""
    return f"{fence}\n{text}" if fence else text


def prose(text: str) -> str:
    """``text`` with each line of fenced code (the fences' own lines too) left empty: what
    names are read from. A diagram or a program's strings in a code block read as names
    ("Return 429 Error Allow Request") that no sentence says anything of."""
    if not _may_fence(text):
        return text
    lines, _ = _lines(text)
    _, before, after = _fences(lines)
    return "\n".join("" if coded else line for line, coded in zip(lines, _coded(before, after), strict=True))


def heading_paths(text: str, chunk_starts: Sequence[int]) -> list[str]:
    """For each chunk (by where it starts in ``text``), the headings it falls under, outermost
    first, joined by :data:`PATH_SEPARATOR`; empty for a chunk under none.

    A chunk's own headings are its text, not its context: one that opens with a heading is
    under that heading's parents, and one with a heading further in is under the headings in
    force where it starts.
    """
    found = headings(text)
    if not found:
        return [""] * len(chunk_starts)
    # The path in force after each heading: the headings above it at shallower depths.
    paths: list[list[Heading]] = []
    current: list[Heading] = []
    for h in found:
        current = [*(c for c in current if c.level < h.level), h]
        paths.append(current)
    at = [h.start for h in found]
    out: list[str] = []
    for start in chunk_starts:
        k = bisect_right(at, start) - 1  # the last heading starting at or before the chunk
        if k < 0:
            out.append("")
            continue
        blank = _BLANK.match(text, at[k], start)  # nothing but space before the chunk: it opens with it
        opens = blank is not None and blank.end() == start
        out.append(_joined([h.title for h in (paths[k][:-1] if opens else paths[k])]))
    return out


def _atx_title(rest: str) -> str:
    """A ``#`` heading's title from what follows its opening: without a closing run of ``#``
    (``## Title ##``) that space sets apart."""
    rest = rest.strip(" \t")
    bare = rest.rstrip("#")
    if bare != rest and (not bare or bare[-1] in " \t"):
        return bare.rstrip(" \t")
    return rest


def _title(line: str) -> str:
    """A heading line's title: trimmed, without Markdown's emphasis and code marks, at most
    :data:`MAX_HEADING_CHARS` (empty when it holds no word)."""
    title = line.replace("*", "").replace("`", "").strip().strip("_").strip()
    if len(title) > MAX_HEADING_CHARS or not any(ch.isalnum() for ch in title):
        return ""
    return title


def _joined(titles: list[str]) -> str:
    """Titles joined, the outermost dropped until the path fits :data:`MAX_PATH_CHARS`."""
    while len(titles) > 1 and len(PATH_SEPARATOR.join(titles)) > MAX_PATH_CHARS:
        titles = titles[1:]
    return PATH_SEPARATOR.join(titles)
