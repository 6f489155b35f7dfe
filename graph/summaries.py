"""Extractive community summaries (pure): the offline default, real and deterministic.

Sentences from the community's chunks are scored by which member entities they mention,
weighted by each member's degree in the community (central entities matter more).
Sentences are picked greedily by the weight of members they add that no earlier pick
covered, so the summary spans the community rather than repeating its hub.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from memory.chunking import chunk_doc
from memory.conversation import parse_turn

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(`])")
# A markdown heading ("## Notes"), not a sentence opening with "#" ("#4411 reopened").
_HEADING = re.compile(r"\s*#{1,6}\s")
# A fenced code block: from its fence to a line of that fence alone (as long or longer; an inner
# "```python" in a "````" block is code), or to the end of the text.
_FENCED = re.compile(r"^[ \t]*(`{3,}|~{3,}).*?(?:^[ \t]*\1[`~]*[ \t]*$|\Z)", re.MULTILINE | re.DOTALL)
# A table row, or a line of JSON, YAML flow or a program's braces.
_MARKUP = re.compile(r"\s*[|{}\[\]<]")


# A terminal's escape sequence (colours in a captured log or man page: "\x1b[0m"), and the
# control characters no reader sees as text.
_ESCAPES = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: a title or a hyperlink, to BEL or ST
    r"|\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves
    r"|\x1b[()*+]."  # a character set chosen (tput sgr0)
    r"|\x1b[@-_]"
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"
)

# A list item's first line ("- step", "* note", "3. then"): it starts a paragraph of its own.
_LIST_ITEM = re.compile(r"\s*(?:[-*+\u2022]|\d{1,3}[.)])\s")


def split_sentences(text: str) -> list[str]:
    """Sentences of a text (a light splitter; good enough for ops prose). Lines wrapped inside a
    paragraph are joined first (markdown is hard-wrapped: a sentence runs over lines). A
    markdown heading, code (fenced, or a line of braces, a table row or one dense with brackets
    and operators) is none: each names entities without saying anything of them."""
    return [
        s.strip()
        for paragraph in _paragraphs(_FENCED.sub("\n", _ESCAPES.sub("", text.replace("\r", "\n"))))
        for s in _SENTENCE.split(paragraph)
        if len(s.strip()) > 3 and not _HEADING.match(s) and not _MARKUP.match(s) and _prose(s)
    ]


#: Most words lines are joined into while no sentence ends among them.
MAX_SENTENCE_WORDS = 60
_SENTENCE_END = re.compile(r"[.!?](?:\s|$)")


def _open_words(paragraph: str) -> int:
    """Words of ``paragraph`` after the last sentence that ends in it."""
    return len(_SENTENCE_END.split(paragraph)[-1].split())


def _paragraphs(text: str) -> list[str]:
    """``text``'s paragraphs, each on one line: a line joins the one before it unless a blank
    line parts them, or either is a heading, a table row or code, or it starts a list item."""
    out: list[str] = []
    joinable = False
    for line in text.split("\n"):
        stripped = line.strip()
        if not stripped:
            joinable = False
            continue
        alone = bool(_HEADING.match(line) or _MARKUP.match(line)) or not _prose(stripped)
        item = _LIST_ITEM.match(line)
        # Lines that never close a sentence (log lines, a list without markers) stay apart past
        # a sentence's length: joined, one of them could fill the whole summary.
        if joinable and not alone and not item and _open_words(out[-1]) + len(stripped.split()) <= MAX_SENTENCE_WORDS:
            out[-1] += " " + stripped
        else:
            out.append(line[item.end() :].strip() if item else stripped)  # an item without its marker
        joinable = not alone
    return out


_CODE_CHARS = frozenset("{}[]();=<>|\\$")


def _prose(s: str) -> bool:
    """Whether ``s`` reads as prose: code and data are dense with brackets and operators (at
    least 4, and 1 character in 20), where a sentence has a parenthesis or two; a diagram's
    line (``+----+ --> +----+``) is mostly neither letters nor digits (4 characters in 5)."""
    symbols = sum(c in _CODE_CHARS for c in s)
    if symbols >= 4 and symbols * 20 >= len(s):
        return False
    shown = [c for c in s if not c.isspace()]
    return sum(c.isalnum() for c in shown) * 5 >= len(shown)


def mentions(sentence: str, names: Mapping[str, str]) -> set[str]:
    """Member keys whose key or display name occurs in the sentence (case-insensitive)."""
    low = sentence.lower()
    return {key for key, name in names.items() if key in low or name.lower() in low}


def community_sources(chunks: Mapping[str, Sequence[str]], limit: int = 5) -> tuple[list[str], int]:
    """The documents a community's members are named in, most mentions first (a conversation's
    turns as their session), at most ``limit`` of them, and how many there are in all.

    Args:
        chunks: each member's chunk ids.
    """
    counts: dict[str, int] = {}
    for ids in chunks.values():
        for cid in ids:
            doc = chunk_doc(cid)
            ref = parse_turn(doc)
            where = ref.session.rstrip("/") if ref is not None else doc
            counts[where] = counts.get(where, 0) + 1
    ranked = sorted(counts, key=lambda d: (-counts[d], d))
    return ranked[:limit], len(ranked)


def extractive_summary(
    texts: Sequence[str],
    names: Mapping[str, str],
    weights: Mapping[str, float],
    *,
    max_sentences: int = 5,
    word_budget: int = 1500,
    sources: tuple[Sequence[str], int] = ((), 0),
) -> str:
    """Pick up to ``max_sentences`` sentences that best cover the members.

    Args:
        texts: source chunk texts (deduplicated by the caller, in a stable order).
        names: member key -> display name.
        weights: member key -> importance (e.g. weighted degree).
        max_sentences: summary length.
        word_budget: words of source considered (bounds the work and mirrors an LLM's budget).
        sources: the documents named, and how many in all (``community_sources``).

    Returns:
        The summary: a header naming the top members, then the chosen sentences in source
        order, then the documents they come from. Never empty when there are members.
    """
    sentences: list[str] = []
    words = 0
    seen: set[str] = set()
    for text in texts:
        for s in split_sentences(text):
            if s in seen:
                continue
            seen.add(s)
            n = len(s.split())
            if words + n > word_budget:
                break
            sentences.append(s)
            words += n
    covered: set[str] = set()
    chosen: list[int] = []
    cover = [mentions(s, names) for s in sentences]
    for _ in range(max_sentences):
        best, best_gain = -1, 0.0
        for i, members in enumerate(cover):
            if i in chosen:
                continue
            gain = sum(weights.get(m, 1.0) for m in members - covered)
            if gain > best_gain:
                best, best_gain = i, gain
        if best < 0:
            break
        chosen.append(best)
        covered |= cover[best]
    top = sorted(names, key=lambda k: (-weights.get(k, 0.0), k))[:8]
    header = _listing("Entities", [names[k] for k in top], len(names))
    body = " ".join(sentences[i] for i in sorted(chosen))
    shown, of = sources
    tail = _listing("Sources", shown, of) if shown else ""
    return " ".join(p for p in (header, body, tail) if p)


def _listing(label: str, shown: Sequence[str], of: int) -> str:
    """``Label: a, b (+3 more).``: what is shown of ``of`` in all."""
    return f"{label}: " + ", ".join(shown) + (f" (+{of - len(shown)} more)." if of > len(shown) else ".")
