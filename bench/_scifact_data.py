"""A BEIR dataset's data (SciFact by default): corpus, queries and judgements (qrels), the docs of a
subset run, and the scores."""

from __future__ import annotations

import csv
import json
import math
import random
from collections import defaultdict
from pathlib import Path


def qrels_file(data: Path, split: str) -> Path:
    """The judgements of ``split`` (BEIR's ``qrels/<split>.tsv``).

    Raises:
        SystemExit: the dataset has no such file; the message names the splits it has.
    """
    path = data / "qrels" / f"{split}.tsv"
    if not path.exists():
        have = sorted(p.stem for p in (data / "qrels").glob("*.tsv"))
        raise SystemExit(f"{data} has no qrels/{split}.tsv; its splits: {', '.join(have) or 'none'} (--split)")
    return path


def load_data(data: Path, split: str = "test") -> tuple[dict[str, str], dict[str, str], dict[str, dict[str, int]]]:
    """corpus id -> content, query id -> text (in file order), qrels query id -> {doc id: grade}
    (of ``split``: MS MARCO, for one, has only ``dev``)."""
    corpus: dict[str, str] = {}
    with (data / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            corpus[str(d["_id"])] = f"{d.get('title') or ''} {d.get('text') or ''}".strip()
    queries: dict[str, str] = {}
    with (data / "queries.jsonl").open(encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            queries[str(d["_id"])] = d.get("text") or ""
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    with qrels_file(data, split).open(encoding="utf-8") as f:
        for row in csv.reader(f, delimiter="\t"):
            if len(row) < 3 or not row[2].strip().lstrip("-").isdigit():
                continue  # the header ("query-id corpus-id score") or a blank line
            qrels[row[0]][row[1]] = int(row[2])
    return corpus, queries, dict(qrels)


def ndcg_at(ranked: list[str], rels: dict[str, int], k: int = 10) -> float:
    """nDCG@k with linear gains (as pytrec_eval, which BEIR uses); a grade below 0 gains nothing."""
    dcg = sum(max(rels.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted((g for g in rels.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at(ranked: list[str], rels: dict[str, int], k: int = 100) -> float:
    relevant = {d for d, g in rels.items() if g > 0}
    return len(relevant & set(ranked[:k])) / len(relevant) if relevant else 0.0


def pick_docs(
    corpus: dict[str, str], qrels: dict[str, dict[str, int]], qids: list[str], limit: int, seed: int
) -> list[str]:
    """Every doc id (``limit`` 0), or the docs judged for ``qids`` plus random others up to ``limit``."""
    if not limit:
        return list(corpus)
    needed = list(dict.fromkeys(d for q in qids for d in qrels[q] if d in corpus))
    needed_set = set(needed)
    others = [d for d in corpus if d not in needed_set]
    random.Random(seed).shuffle(others)
    return needed + others[: max(0, limit - len(needed))]
