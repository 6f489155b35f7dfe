"""The contract's field names told in a caller's own words (pure): an error the daemon or the
client words with ``metadata_filter`` reaches an MCP tool's caller as ``filters`` and a
command line's as ``--filter``."""

from __future__ import annotations

import re
from collections.abc import Mapping

#: The contract's fields that the command line names with options (the query's, and the reads').
CLI_NAMES: Mapping[str, str] = {
    "search_text": "the question",
    "metadata_filter": "--filter",
    "time_range.since": "--since",
    "time_range.until": "--until",
    "top_k": "--top-k",
    "context_turns": "--context-turns",
    "max_per_doc": "--max-per-doc",
    "hybrid_params.dense_weight": "--dense-weight",
    "hybrid_params.sparse_weight": "--sparse-weight",
    "hybrid_params.identifier_weight": "--identifier-weight",
    "hybrid_params.recency_weight": "--recency-weight",
    "hybrid_params.speaker_weight": "--speaker-weight",
    "hybrid_params.min_similarity": "--min-similarity",
    "hybrid_params.rrf_k": "--rrf-k",
}


def in_words(message: str, names: Mapping[str, str]) -> str:
    """``message`` with each field of ``names`` replaced by the name its caller knows it by; a
    name inside quotes (a value, a metadata key) is left alone."""
    for field, argument in names.items():
        message = re.sub(rf"(?<![\w.'\"]){re.escape(field)}(?![\w'\"])", argument, message)
    return message
