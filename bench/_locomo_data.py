"""LoCoMo's data and metric for the benchmarks: the dialogue's turns and the questions with
their evidence, as ``bench/locomo.py`` documents reading them, a question put in the first or
second person, and ``recall_acc``."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

KS = (5, 10, 25, 50)
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")


@dataclass(frozen=True, slots=True)
class Turn:
    """One dialogue turn as the benchmark publishes it."""

    agent_id: str
    session_id: str
    turn: int
    role: str
    content: str
    timestamp: datetime

    @property
    def key(self) -> str:
        return f"{self.session_id}/{self.turn}"


@dataclass(frozen=True, slots=True)
class Question:
    """A question with the turns (``session_<N>/<turn>`` keys) that hold its answer."""

    agent_id: str
    text: str
    category: int
    evidence: frozenset[str]
    #: The conversation's two speakers: the first published with role user, the second assistant.
    speakers: tuple[str, str] = ("", "")


def session_time(text: str) -> datetime | None:
    """``"1:56 pm on 8 May, 2023"`` as an aware UTC datetime; None where it is not in that form."""
    try:
        return datetime.strptime(str(text).strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
    except ValueError:
        return None


def evidence_keys(raw: Sequence[str]) -> frozenset[str]:
    """Evidence ids (``D<session>:<turn>``, malformed ones included) as ``session_<N>/<turn>`` keys."""
    return frozenset(f"session_{int(s)}/{int(t)}" for item in raw for s, t in _EVIDENCE.findall(str(item)))


def turn_content(turn: dict[str, Any]) -> str:
    """A turn as a person would write it in a transcript: the speaker's name, then the words."""
    content = f"{turn.get('speaker', 'someone')}: {turn.get('text', '')}"
    if turn.get("blip_caption"):
        content += f" [shares {turn['blip_caption']}]"
    return content


def _sessions(c: dict[str, Any]) -> list[int]:
    """The session numbers of a conversation, in order: every ``session_<N>`` that holds turns,
    whatever numbers are missing between them."""
    found = (re.fullmatch(r"session_(\d+)", k) for k, v in c.items() if isinstance(v, list))
    return sorted(int(m.group(1)) for m in found if m)


def load(path: Path, conversations: int = 0) -> tuple[list[Turn], list[Question]]:
    """Turns and questions of the first ``conversations`` conversations (0: all).

    Survives what a LoCoMo file may hold besides the README's quirks: a gap in the session
    numbers, a ``dia_id`` with no turn number (the turn's place in its session is used) or one
    another turn of its session already has (the next free number), a session date in another
    form (the previous session's is used). What it repaired is printed.
    """
    data = json.loads(path.read_text())
    if conversations:
        data = data[:conversations]
    turns: list[Turn] = []
    questions: list[Question] = []
    repaired: list[str] = []
    for conv in data:
        agent = conv["sample_id"]
        c = conv["conversation"]
        speakers = {c.get("speaker_a"): "user", c.get("speaker_b"): "assistant"}
        when = datetime(2023, 1, 1, tzinfo=UTC)
        for n in _sessions(c):
            parsed = session_time(c.get(f"session_{n}_date_time", ""))
            if parsed is None:
                repaired.append(f"{agent} session_{n}: date {c.get(f'session_{n}_date_time')!r}")
            when = parsed or when
            taken: set[int] = set()
            for place, t in enumerate(c[f"session_{n}"], start=1):
                ids = _EVIDENCE.findall(str(t.get("dia_id", "")))
                number = int(ids[0][1]) if ids else place
                if not ids or number in taken:  # never one turn over another: the next free number
                    number = number if number not in taken else max(taken) + 1
                    repaired.append(f"{agent} session_{n}: dia_id {t.get('dia_id')!r} read as turn {number}")
                taken.add(number)
                role = speakers.get(t.get("speaker"), "user")
                turns.append(Turn(agent, f"session_{n}", number, role, turn_content(t), when))
        for qa in conv.get("qa", ()):
            ev = evidence_keys(qa.get("evidence") or [])
            if ev and qa.get("question"):
                pair = (str(c.get("speaker_a", "")), str(c.get("speaker_b", "")))
                questions.append(Question(agent, qa["question"], int(qa.get("category", 0)), ev, pair))
    if repaired:
        print(f"{len(repaired)} repairs while loading {path.name}: {repaired[:5]}", flush=True)
    return turns, questions


#: Words after which a speaker's name is an object ("gave Caroline", "with Melanie").
_OBJECT_AFTER = frozenset(
    "to with for about from give gave gives tell told help helped by at of inspire inspired make made "
    "motivate motivated remind reminds support supports encourage encouraged".split()
)
#: Grammar a pronoun put in a name's place needs ("I is" -> "I am").
_AGREEMENT = (
    (" I is", " I am"),
    (" I has", " I have"),
    (" I does", " I do"),
    (" you is", " you are"),
    (" you was", " you were"),
    (" you has", " you have"),
    (" you does", " you do"),
    ("does you", "do you"),
    ("does I", "do I"),
    ("Does you", "Do you"),
    ("Does I", "Do I"),
)


def in_person(q: Question) -> tuple[str, int] | None:
    """``q`` asked by one of its speakers, as a user asks an assistant: a question naming only
    the first speaker (role user) in the first person ("When did I go to ..."), one naming only
    the second (role assistant) in the second ("What did you paint?"), and which; None for a
    question naming neither or both (pure)."""
    first, second = (bool(name) and re.search(rf"\b{re.escape(name)}\b", q.text) is not None for name in q.speakers)
    if first == second:
        return None
    person = 1 if first else 2
    subject, obj, own = ("I", "me", "my") if person == 1 else ("you", "you", "your")

    def pronoun(m: re.Match[str]) -> str:
        before = q.text[: m.start()].split()
        if m.group(2):
            return own
        return obj if before and before[-1].lower().strip(",") in _OBJECT_AFTER else subject

    text = re.sub(rf"\b({re.escape(q.speakers[person - 1])})('s|\u2019s)?\b", pronoun, q.text)
    for wrong, right in _AGREEMENT:
        text = text.replace(wrong, right)
    return text[:1].upper() + text[1:], person


def recall_at(ranked: Sequence[str], evidence: frozenset[str], k: int) -> float:
    """LoCoMo's recall_acc for one question: evidence turns found in the top k, over all of them."""
    return len(evidence & set(ranked[:k])) / len(evidence)


def scores(ranked: dict[int, list[str]], questions: Sequence[Question]) -> dict[str, dict[str, float]]:
    """Mean recall@k over all categories and over categories 1-4."""
    out: dict[str, dict[str, float]] = {}
    for label, keep in (("all", lambda q: True), ("cat1-4", lambda q: q.category != 5)):
        idx = [i for i, q in enumerate(questions) if keep(q)]
        out[label] = {
            f"R@{k}": sum(recall_at(ranked[i], questions[i].evidence, k) for i in idx) / max(len(idx), 1) for k in KS
        }
    return out
