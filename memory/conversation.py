"""Conversation-aware indexing of transcript turns (pure): which neighbours a turn is matched with.

A turn alone ("Yes, yesterday!") is rarely findable, so each turn is *matched* with its session's
neighbouring turns while it is still *returned* as itself:

- its BM25 terms are its own terms, counted :data:`OWN_TERM_REPEAT` times, followed by the terms of
  the previous :data:`PREV_TERMS` and next :data:`NEXT_TERMS` turns of its session, once each;
- its vector is its own text read *in context*: the model reads the previous
  :data:`PREV_VECTOR` turns, then the turn, and pools only the turn's own tokens
  (:data:`CONTEXT_MARK`), so the exchange (the question a "Yes, yesterday!" answers) shapes the
  turn's meaning without its neighbours' words diluting the vector;
- its BM25 terms also hold the day it was said (:func:`date_words`), so "what did we decide on
  3 May 2023?" finds that day's turns.

The neighbours a turn is indexed with are a function of what its session stores: every stored
turn's ``context`` field holds exactly the neighbour texts of :func:`context_of` over the stored
turns, whatever order the turns arrived in. When a turn is written or forgotten, the turns whose
window holds it (:func:`dependents`) are re-indexed too; the vector only when its previous turns
changed (in a session written in order, never: a new turn changes only its predecessors' terms).

Context never crosses sessions, so forgetting a session leaves no copy of its words in any
other turn's index entry.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

#: Previous / next turns whose words join a turn's BM25 terms.
PREV_TERMS = 3
NEXT_TERMS = 2
#: Previous turns the vector reads before the turn's own text.
PREV_VECTOR = 2
#: A turn's own terms count this many times its neighbours' (its words matter most).
OWN_TERM_REPEAT = 3
#: A neighbour contributes at most this many characters (its end for a previous turn, its
#: start for a next one): bounded work, and the vector's own text stays inside the model's window.
NEIGHBOUR_CHARS = 400
#: Vector context only for chunks up to this many characters: a longer one would be cut by
#: the model's 256-token window, and it stands on its own.
VECTOR_CONTEXT_MAX_CHARS = 600
#: What separates turns in a context.
SEPARATOR = "\n"
#: Between a vector's context and the text it is the vector of (see memory.embed_fast_paths): an
#: ASCII record separator, taken out of every text a vector is embedded from.
CONTEXT_MARK = "\x1e"
#: Most turns a query may ask for around each transcript hit (``context_turns``), each side.
MAX_CONTEXT_TURNS = 10
#: Most turns one ``"op": "recent"`` request reads back.
MAX_RECENT_TURNS = 100
#: Doc id prefix of transcript turns: ``transcript:<agent>/<session>/<turn>``.
TURN_PREFIX = "transcript:"


@dataclass(frozen=True, slots=True, order=True)
class TurnRef:
    """Where a turn sits: its session (the doc id up to the turn number) and its number."""

    session: str
    turn: int

    @property
    def doc_id(self) -> str:
        """The turn's doc id (``transcript:<agent>/<session>/<turn>``)."""
        return f"{self.session}{self.turn}"

    def at(self, turn: int) -> TurnRef:
        """Another turn of the same session."""
        return TurnRef(self.session, turn)


_ENCODED = re.compile("%(25|2F)")


def id_part(value: str) -> str:
    """An agent or session id as a turn's doc id holds it: ``%`` and ``/`` percent-encoded, so
    that (``ops/east``, ``s1``) and (``ops``, ``east/s1``) stay two sessions."""
    return value.replace("%", "%25").replace("/", "%2F")


def turn_prefix(agent_id: str, session_id: str | None = None) -> str:
    """The doc id prefix every turn of an agent (or of one of its sessions) starts with."""
    prefix = f"{TURN_PREFIX}{id_part(agent_id)}/"
    return prefix if session_id is None else f"{prefix}{id_part(session_id)}/"


def session_source(agent_id: str, session_id: str) -> str:
    """A turn's ``source``: ``<agent>/<session>``, ids as :func:`id_part` holds them (two
    sessions whose ids join alike stay apart in a ``source`` filter too)."""
    return f"{id_part(agent_id)}/{id_part(session_id)}"


def turn_doc_id(agent_id: str, session_id: str, turn: int) -> str:
    """The doc id of a transcript turn: ``transcript:<agent>/<session>/<turn>``, ids as
    :func:`id_part` holds them."""
    return f"{turn_prefix(agent_id, session_id)}{turn}"


def agent_of(doc_id: str) -> str | None:
    """The agent id a turn's doc id names (:func:`id_part` undone), or None for any other doc."""
    if parse_turn(doc_id) is None:
        return None
    part = doc_id[len(TURN_PREFIX) :].partition("/")[0]
    return _ENCODED.sub(lambda m: "%" if m.group(1) == "25" else "/", part)


def parse_turn(doc_id: str) -> TurnRef | None:
    """The turn a doc id names (``transcript:a/s/12``), or None for any other doc."""
    if not doc_id.startswith(TURN_PREFIX):
        return None
    session, sep, number = doc_id.rpartition("/")
    if not sep or not number.isdigit() or "/" not in session:
        return None
    return TurnRef(session + "/", int(number))


@dataclass(frozen=True, slots=True)
class TurnContext:
    """The neighbour texts one turn is indexed with."""

    prev: tuple[str, ...]  # nearest first, at most PREV_TERMS
    next: tuple[str, ...]  # nearest first, at most NEXT_TERMS

    def stored(self) -> str:
        """The ``context`` hash field (what the BM25 terms add): every neighbour text, farthest
        previous first."""
        return SEPARATOR.join((*reversed(self.prev), *self.next))

    def vector_prefix(self) -> str:
        """The ``context_vec`` hash field: what the vector reads before the turn's own text."""
        return SEPARATOR.join(reversed(self.prev[:PREV_VECTOR]))


EMPTY = TurnContext((), ())


def _tail(text: str) -> str:
    if len(text) <= NEIGHBOUR_CHARS:
        return text
    cut = text[-NEIGHBOUR_CHARS:]
    space = cut.find(" ")
    return cut[space + 1 :] if 0 <= space < len(cut) - 1 else cut


def _head(text: str) -> str:
    if len(text) <= NEIGHBOUR_CHARS:
        return text
    cut = text[:NEIGHBOUR_CHARS]
    space = cut.rfind(" ")
    return cut[:space] if space > 0 else cut


def context_of(ref: TurnRef, text_of: Callable[[TurnRef], str | None]) -> TurnContext:
    """The neighbours of ``ref`` given each turn's text (its first chunk's; None if not stored).

    A missing turn leaves a gap: the window is by turn number, so a late turn changes only the
    windows it falls in (those of :func:`dependents`).
    """
    prev = tuple(_tail(t) for d in range(1, PREV_TERMS + 1) if (t := text_of(ref.at(ref.turn - d))) is not None)
    nxt = tuple(_head(t) for d in range(1, NEXT_TERMS + 1) if (t := text_of(ref.at(ref.turn + d))) is not None)
    return TurnContext(prev, nxt)


def window(ref: TurnRef) -> list[TurnRef]:
    """The turns ``context_of(ref)`` reads."""
    return [ref.at(ref.turn + d) for d in range(-PREV_TERMS, NEXT_TERMS + 1) if d != 0 and ref.turn + d >= 0]


def dependents(ref: TurnRef) -> list[TurnRef]:
    """The turns whose window holds ``ref``: they are re-indexed when it changes."""
    return [ref.at(ref.turn + d) for d in range(-NEXT_TERMS, PREV_TERMS + 1) if d != 0 and ref.turn + d >= 0]


def vector_text(text: str, prefix: str, *, max_chars: int | None = VECTOR_CONTEXT_MAX_CHARS) -> str:
    """What a chunk is embedded from: its own text, after its context (a turn's previous turns,
    ``TurnContext.vector_prefix``; a document chunk's headings) and :data:`CONTEXT_MARK` where
    it has one and the text is at most ``max_chars`` long (None: whatever its length)."""
    text = unmarked(text)
    if not prefix or (max_chars is not None and len(text) > max_chars):
        return text
    return unmarked(prefix) + CONTEXT_MARK + text


def unmarked(text: str) -> str:
    """``text`` with any :data:`CONTEXT_MARK` read as a space: only :func:`vector_text` puts one in."""
    return text.replace(CONTEXT_MARK, " ")


def matching_terms(own_terms: str, context_terms: Iterable[str]) -> str:
    """A turn's BM25 ``terms`` value: its own analyzed terms repeated, then its neighbours'."""
    parts = [own_terms] * OWN_TERM_REPEAT if own_terms else []
    parts.extend(t for t in context_terms if t)
    return " ".join(parts)


def date_words(timestamp: float) -> str:
    """The day a turn was said, as words a question would use (``Monday 8 May 2023``, UTC):
    "what did we promise on Tuesday?" matches the turns of Tuesdays. Empty when the turn has
    no time."""
    if timestamp <= 0:
        return ""
    try:
        day = datetime.fromtimestamp(timestamp, UTC)
    except (OverflowError, OSError, ValueError):
        return ""
    return f"{day:%A} {day.day} {day:%B} {day.year}"


def neighbourhood(refs: Iterable[TurnRef]) -> set[TurnRef]:
    """Every turn read to index ``refs`` and their dependents afresh."""
    out: set[TurnRef] = set()
    for ref in refs:
        out.add(ref)
        for dep in dependents(ref):
            out.add(dep)
            out.update(window(dep))
        out.update(window(ref))
    return out


def affected(changed: Iterable[TurnRef]) -> set[TurnRef]:
    """The changed turns and their dependents: every turn whose index entry may have to change."""
    out: set[TurnRef] = set()
    for ref in changed:
        out.add(ref)
        out.update(dependents(ref))
    return out


def texts_by_ref(texts: Mapping[str, str | None]) -> Callable[[TurnRef], str | None]:
    """A ``text_of`` for :func:`context_of` over texts keyed by doc id."""
    return lambda ref: texts.get(ref.doc_id)
