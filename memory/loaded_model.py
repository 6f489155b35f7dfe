"""The embedding model as the worker holds it once loaded: the model, its length probe, its
settings, and which fast paths (``memory.embed_fast_paths``) ``memory.embed_model.load``
found it can take."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memory.config import EmbeddingConfig


@dataclass(frozen=True)
class LoadedModel:
    """A loaded model with the fast paths that load() found it can take."""

    model: Any
    probe: Any  # a tokenizer of its own for length probes (see encode)
    cfg: EmbeddingConfig
    bf16: bool
    direct: bool  # whether mean_pooled computes what the model's pipeline computes
    traced: Any = None  # the transformer traced for the query channel (see trace_encoder), if any
    in_context: bool = False  # whether marked texts are pooled over their own tokens (pooled_in_context)

    def window(self) -> int:
        """The most tokens the model reads of a text, its special tokens included."""
        return int(self.model.max_seq_length)

    def dims(self) -> int:
        """The length of the model's vectors."""
        dim_of = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(dim_of())
