"""Who said a transcript turn, and the speaker list a query that names them adds (pure).

Agents ask "what did the planner say about Y?" and "what recipes has Nate made?": most of the
turns that answer are said by the one the question names. A turn's speakers are its ``role``,
the name its text opens with, as transcripts write it (``"Caroline: I went to ..."``), and the
agent's id for what the agent said itself, stored with the turn (:func:`speakers_field`).
When a query names a speaker of some of the candidates the legs found, those candidates form
one more RRF list, all at rank 1
(:func:`speaker_ranks`): a small lift among what the legs found, never a find of its own, as
the recency lift is. Measured on LoCoMo dev: docs/decisions/0039-turns-know-their-speakers.md.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping

from memory.text import ASKED_WORDS, ASKER_WORDS, tokenize

#: A transcript line's speaker label: up to four words, each opening with a letter, then a
#: colon and a space, or a full-width colon ("Caroline: ", "Dr. Lee: ", "planner-7: ").
_LABEL = re.compile(r"\s*([^\W\d_][\w'\u2019.-]*(?: [^\W\d_][\w'\u2019.-]*){0,3})\s*(?::\s|\uff1a)")
#: Only the start of a turn is read for its label (a turn may be megabytes long).
_LABEL_CHARS = 200
#: A Latin label this short is a marker ("A:", "Q:", "Re:"), not a name.
_MIN_LABEL_CHARS = 3
#: Between the speakers of a turn in its stored ``speaker`` field.
SEPARATOR = "|"
ASKER_ROLE, ASKED_ROLE = "user", "assistant"


def speakers_field(text: str, role: str, agent_id: str = "") -> str:
    """A turn's ``speaker`` field: its role, the name its text opens with, and for a turn the
    agent said itself (role ``assistant``) the agent's id, each as its lowercase tokens joined
    by spaces, joined by :data:`SEPARATOR` (``"user|caroline"``, ``"assistant|planner 7"``);
    empty where it has none."""
    label = _LABEL.match(unicodedata.normalize("NFC", text[:_LABEL_CHARS]))
    name = label.group(1) if label else ""
    if name.isascii() and len(name) < _MIN_LABEL_CHARS:
        name = ""
    agent = agent_id if role == "assistant" else ""
    return SEPARATOR.join(dict.fromkeys(n for n in (" ".join(tokenize(x)) for x in (role, name, agent)) if n))


def turn_speakers(text: str, metadata: Mapping[str, object]) -> str:
    """A turn's ``speaker`` field from its text and the metadata stored with it (its role and
    agent): the one rule of ingestion and of a reindex's carry-over."""
    return speakers_field(text, str(metadata.get("role", "")), str(metadata.get("agent_id", "")))


def named(field: str, query: str) -> bool:
    """Whether ``query`` (``" "``-joined lowercase tokens, padded with a space each side) names one
    of the speakers of a ``speaker`` field: all of a name's tokens, next to each other, in order."""
    return any(f" {name} " in query for name in field.split(SEPARATOR) if name)


def query_words(text: str) -> str:
    """A query as :func:`named` reads it: its words, and the role its pronouns name, if one
    does (:data:`ASKER_WORDS`, :data:`ASKED_WORDS`; both at once, "can you tell me …", name
    neither: the words say who asks, not whom the question is about)."""
    text = unicodedata.normalize("NFC", text)
    words = tokenize(text)
    # A phone's apostrophe ("I\u2019m") splits as a typed one does, for the pronouns alone:
    # names keep theirs ("O\u2019Brien"), as their turns' speaker fields do.
    said = set(tokenize(text.replace("\u2019", "'")))
    asker, asked = not said.isdisjoint(ASKER_WORDS), not said.isdisjoint(ASKED_WORDS)
    role = ASKER_ROLE if asker and not asked else ASKED_ROLE if asked and not asker else None
    # After a separator no name holds: "research" + "assistant" is no "Research Assistant".
    return f" {' '.join(words)} " + (f"{SEPARATOR} {role} " if role else "")


def speaker_ranks(text: str, hits: Iterable[tuple[str, str]]) -> dict[str, int]:
    """The speaker list of a query: each candidate (``(id, speaker field)``) said by someone the
    query names, at rank 1; empty where the query names none of them (or none has a speaker,
    and then the query is not even read)."""
    said = [(cid, field) for cid, field in hits if field]
    if not said:
        return {}
    words = query_words(text)
    return {cid: 1 for cid, field in said if named(field, words)}
