"""Which spaCy components NER needs (pure)."""

from __future__ import annotations

import pytest

from graph.ner import ner_pipes

SM = ["tok2vec", "tagger", "parser", "attribute_ruler", "lemmatizer", "ner"]


@pytest.mark.parametrize(
    ("pipes", "listeners", "keep"),
    [
        (SM, {"tok2vec": ["tagger", "parser"]}, ["ner"]),  # en_core_web_sm: ner has its own tok2vec
        (SM, {"tok2vec": ["tagger", "parser", "ner"]}, ["tok2vec", "ner"]),  # a shared tok2vec is kept
        (["transformer", "ner"], {"transformer": ["ner"]}, ["transformer", "ner"]),  # in pipeline order
        (["ner"], {}, ["ner"]),
        (["tok2vec", "tagger"], {"tok2vec": ["tagger"]}, []),  # no ner at all
    ],
)
def test_only_ner_and_what_it_listens_to_are_kept(
    pipes: list[str], listeners: dict[str, list[str]], keep: list[str]
) -> None:
    """Tagger, parser, attribute ruler and lemmatizer never run for NER; a tok2vec it listens to does."""
    assert ner_pipes(pipes, listeners) == keep
