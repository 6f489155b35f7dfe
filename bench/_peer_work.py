"""The work every system ingests and is asked: SciFact docs and queries, LoCoMo turns and questions."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any


@dataclass
class Work:
    """What every system ingests and is asked."""

    docs: list[tuple[str, str]]  # SciFact (doc id, title + text)
    doc_queries: list[tuple[str, str]]  # (query id, text)
    qrels: dict[str, dict[str, int]]
    turns: list[Any]  # _locomo_data.Turn
    questions: list[Any]  # _locomo_data.Question


def load_work(args: argparse.Namespace) -> Work:
    import _locomo_data
    from _scifact_data import load_data, pick_docs

    corpus, queries, qrels = load_data(args.scifact)
    qids = [q for q in queries if q in qrels]
    if args.queries:
        qids = qids[: args.queries]
    wanted = pick_docs(corpus, qrels, qids, args.scifact_docs, seed=3)
    turns, questions = _locomo_data.load(args.locomo, args.conversations)
    if args.questions:
        questions = questions[: args.questions]
    return Work([(d, corpus[d]) for d in wanted], [(q, queries[q]) for q in qids], qrels, turns, questions)


def turn_id(t: Any) -> str:
    return f"{t.agent_id}/{t.key}"
