"""The embedding model as the worker process runs it (``memory.embed_child``).

Loading (local files only, bf16 weights where the CPU computes bf16), length-sorted
batching (``memory.length_batches``), ``encode``, and the fast paths of
``memory.embed_fast_paths`` verified at load against the library's own ``encode()``: the
bare transformer mean-pooled there (``direct``), for queries that transformer traced and
frozen with TorchScript (``traced``), and texts pooled in context (``in_context``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import structlog

from memory.config import EmbeddingConfig
from memory.conversation import CONTEXT_MARK
from memory.embed_fast_paths import (
    TRACE_FAILED,
    context_cut_to_fit,
    is_mean_pooled_text_model,
    mean_pooled,
    pooled_in_context,
    trace_encoder,
)
from memory.length_batches import length_batches
from memory.loaded_model import LoadedModel

log = structlog.get_logger()


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (emulated bf16 is slower than float32)."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, p, lambda: False)()) for p in probes)


def use_bf16(cfg: EmbeddingConfig) -> bool:
    """Whether encode() runs under bfloat16 autocast with these settings on this machine."""
    if cfg.precision == "auto":
        return cfg.device == "cpu" and native_bf16()
    return cfg.precision == "bfloat16"


def _load_model(path: str, cfg: EmbeddingConfig) -> Any:
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    model = SentenceTransformer(path, device=cfg.device, local_files_only=True)
    if use_bf16(cfg):
        # Autocast runs Linear layers in bf16 and casts their float32 weights on every call
        # (22 MB, ~1.5-2 ms per encode() here); weights stored in bf16 give the same vectors
        # bit for bit and skip that. LayerNorm and the rest stay float32 as autocast keeps them.
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.to(torch.bfloat16)
    return model


def load_tokenizer(path: str) -> Any:
    """The model's tokenizer, from its local folder only (never a download).

    The daemon and the worker each load their own: a fast tokenizer carries padding state
    that ``encode()`` switches on and off, so one instance is never shared across users.
    """
    from memory.imports import HEAVY_IMPORTS

    with HEAVY_IMPORTS:
        import transformers

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


# How far the fast paths may be from the path they replace (max abs difference per component).
_SAME_WITHIN = 1e-5


def _differs(ours: np.ndarray, theirs: np.ndarray, event: str) -> bool:
    """Whether two encodings of the same texts differ by ``_SAME_WITHIN`` or more (logged)."""
    diff = float(np.abs(ours - theirs).max()) if ours.shape == theirs.shape else float("inf")
    if diff >= _SAME_WITHIN:
        log.warning(event, max_abs_diff=diff)
        return True
    return False


def _trace_encoder(w: LoadedModel, tok: Any) -> Any:
    """The transformer traced and frozen with TorchScript (``trace_encoder``), or None where
    that fails or differs: verified against the eager path on texts of several lengths
    before it is used."""
    try:
        module = trace_encoder(w, tok, list(_DIRECT_CHECK[:2]))
        traced = dataclasses.replace(w, traced=module)
        texts = list(_DIRECT_CHECK)
        for batch in (texts, texts[:2], texts[1:2], _QUERY_CHECK):
            ours = encode(traced, tok, batch, traced=True)
            if TRACE_FAILED.is_set() or _differs(ours, encode(w, tok, batch), "embed.trace_rejected"):
                return None
        return module
    except Exception as exc:
        log.warning("embed.trace_failed", error=f"{type(exc).__name__}: {exc}")
        return None


def encode(
    w: LoadedModel, tok: Any, texts: Sequence[str], *, direct: bool | None = None, traced: bool = False
) -> np.ndarray:
    """Embed ``texts`` with the calling channel's own tokenizer ``tok`` (see load_tokenizer);
    ``traced``: through the traced transformer where there is one (the query channel)."""
    import torch

    texts = list(texts)
    direct = w.direct if direct is None else direct
    in_context = [i for i, t in enumerate(texts) if isinstance(t, str) and CONTEXT_MARK in t]
    if in_context and not (direct and w.in_context):
        fitted = dict(zip(in_context, context_cut_to_fit(w, tok, [texts[i] for i in in_context]), strict=True))
        texts = [fitted.get(i, t) for i, t in enumerate(texts)]
    elif in_context:
        marked = set(in_context)
        plain = [i for i in range(len(texts)) if i not in marked]
        merged = np.zeros((len(texts), w.dims()), dtype=np.float32)
        merged[in_context] = pooled_in_context(w, tok, [texts[i] for i in in_context])
        if plain:
            merged[plain] = encode(w, tok, [texts[i] for i in plain], direct=direct, traced=traced)
        return merged
    # Not model.tokenizer: transformers switches a fast tokenizer's padding on and off per
    # call, and the other channel's encode() may be using it (with padding) right now.
    lengths = [len(ids) for ids in w.probe(texts, truncation=True, max_length=w.model.max_seq_length)["input_ids"]]
    out: np.ndarray | None = None
    # Autocast state is per thread: this runs in the thread that encodes.
    # No cast cache: the Linear weights are bf16 already, and a traced graph wants none.
    with torch.autocast(w.cfg.device.split(":")[0], dtype=torch.bfloat16, enabled=w.bf16, cache_enabled=False):
        for batch in length_batches(lengths, w.cfg.batch_size):
            chunk = [texts[i] for i in batch]
            if direct:
                rows = mean_pooled(w, tok, chunk, traced=traced)
            else:
                rows = w.model.encode(
                    chunk,
                    batch_size=len(batch),
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
            if out is None:
                out = np.zeros((len(texts), rows.shape[1]), dtype=np.float32)
            out[batch] = rows
    return out if out is not None else np.zeros((0, 0), dtype=np.float32)


# Texts of different lengths, cases and scripts (an empty one, spaces only, non-ASCII), so
# padding, masking, truncation and the tokenizer's edge cases are all exercised.
_DIRECT_CHECK = (
    "Connection refused: SQLSTATE 08006 after failover",
    "why",
    "The deploy of build 4411 failed twice on the EU cluster while the cache was being warmed, "
    "and the on-call engineer rolled it back after the error budget alarm fired. " * 12,
    "",
    "   ",
    "  Köln → Zürich: ¿qué pasó? 東京のデプロイは失敗した  ",
)
# A query micro-batch as the daemon sends them: several texts of mixed short lengths.
_QUERY_CHECK = (
    "pool timeout",
    "ERR_CONN_RESET_4F2A on db-01",
    "how do I rotate the TLS certificate of the ingress controller",
    "why",
    "deadlock detected SQLSTATE 40P01 in the billing service",
    "latency",
)


def _direct_matches(w: LoadedModel, tok: Any) -> bool:
    """Whether the direct path gives the pipeline's vectors on this model (else it is not used)."""
    if not is_mean_pooled_text_model(w.model):
        return False
    try:
        ours = encode(w, tok, _DIRECT_CHECK, direct=True)
    except Exception as exc:
        log.warning("embed.direct_path_failed", error=f"{type(exc).__name__}: {exc}")
        return False
    return not _differs(ours, encode(w, tok, _DIRECT_CHECK, direct=False), "embed.direct_path_rejected")


def load(path: str, cfg: EmbeddingConfig, channels: Sequence[str]) -> tuple[LoadedModel, dict[str, Any]]:
    """Load the model, its length probe and one tokenizer per channel, and pick its fast paths.

    The direct path (mean_pooled) is taken only where it gives the pipeline's vectors, and
    the traced transformer (_trace_encoder) only on top of it; both are checked with the
    ``"query"`` channel's tokenizer (``channels`` must name it).

    Returns:
        The loaded model, and each channel's own tokenizer (see load_tokenizer).
    """
    model = _load_model(path, cfg)
    probe = load_tokenizer(path)
    # Set the probe's truncation once, here: both channel threads use it, and two first
    # calls at once could both try to switch it ("Already borrowed").
    probe(["warm"], truncation=True, max_length=model.max_seq_length)
    toks = {name: load_tokenizer(path) for name in channels}  # one per channel (padding state)
    loaded = LoadedModel(model, probe, cfg, use_bf16(cfg), direct=False)
    loaded = dataclasses.replace(loaded, direct=_direct_matches(loaded, toks["query"]))
    if loaded.direct:
        loaded = dataclasses.replace(loaded, traced=_trace_encoder(loaded, toks["query"]))
        loaded = dataclasses.replace(loaded, in_context=_in_context_works(loaded, toks["docs"]))
    return loaded, toks


def _in_context_works(w: LoadedModel, tok: Any) -> bool:
    """Whether marked texts can be pooled over their own tokens on this model (else each is
    embedded whole, the mark read as a line break)."""
    sample = [f"did you go?{CONTEXT_MARK}yes, yesterday", f"{CONTEXT_MARK} ", f"context{CONTEXT_MARK}" + "word " * 300]
    try:
        rows = pooled_in_context(w, tok, sample)
    except Exception as exc:
        log.warning("embed.in_context_failed", error=f"{type(exc).__name__}: {exc}")
        return False
    return rows.shape[0] == len(sample) and bool(np.isfinite(rows).all())
