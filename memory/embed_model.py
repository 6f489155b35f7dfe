"""The embedding model as the worker process runs it (``memory.embed_child``).

Loading (local files only, bf16 weights where the CPU computes bf16), length-sorted
batching, and two fast paths verified at load against the library's own ``encode()``: the
bare transformer mean-pooled here (``direct``), and for queries that transformer traced and
frozen with TorchScript (``traced``).

A text holding :data:`memory.conversation.CONTEXT_MARK` is embedded *in context*: the model
reads what comes before the mark and the text after it in one sequence, and the vector pools
only the text's own tokens (so the context shapes their meaning without diluting the vector;
the context is cut from its start when both do not fit). Without the direct path such a text
is embedded whole, the mark read as a line break.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from memory.config import EmbeddingConfig
from memory.conversation import CONTEXT_MARK

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


def length_batches(
    lengths: Sequence[int], batch_size: int, max_waste: float = 0.1, min_slack: int = 16
) -> list[list[int]]:
    """Indices of ``lengths`` cut into model batches of similar length (pure).

    Every sequence of a batch is padded to the batch's longest, and the padding is
    computed like real tokens. sentence-transformers sorts one ``encode()`` call's texts
    and cuts them every ``batch_size``; when a call holds a streaming batch of a few
    hundred chunks of mixed length, those cuts span wide length ranges (measured on the
    ingest benchmark's chunks: 13% padding in 128-doc groups, 3% over the whole corpus
    sorted at once). Here a batch also ends where the next text is more than
    ``max_waste`` (and more than ``min_slack`` tokens) shorter than the batch's first
    (longest) one, so little is padded whatever the call's size. Short texts (queries)
    stay together: for them a batch's fixed cost (a few ms of Python) outweighs padding.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches:
            cur = batches[-1]
            head = lengths[cur[0]]
            if len(cur) < batch_size and head - lengths[i] <= max(max_waste * head, min_slack):
                cur.append(i)
                continue
        batches.append([i])
    return batches


@dataclass(frozen=True)
class LoadedModel:
    """A loaded model with the fast paths that load() found it can take."""

    model: Any
    probe: Any  # a tokenizer of its own for length probes (see encode)
    cfg: EmbeddingConfig
    bf16: bool
    direct: bool  # whether _mean_pooled computes what the model's pipeline computes
    traced: Any = None  # the transformer traced for the query channel (see _trace_encoder), if any
    in_context: bool = False  # whether marked texts are pooled over their own tokens (_in_context)

    def dims(self) -> int:
        """The length of the model's vectors."""
        dim_of = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(dim_of())


def _is_mean_pooled_text_model(model: Any) -> bool:
    """Whether the pipeline is Transformer -> mean Pooling [-> Normalize], nothing else.

    That is all-MiniLM-L6-v2's, and most sentence-transformers text models'. Anything else
    (CLS pooling, a Dense head, a lowercasing module, a prompt excluded from pooling) takes
    the library's own encode().
    """
    names = [type(m).__name__ for m in model]
    if names not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return False
    transformer, pooling = model[0], model[1]
    return (
        getattr(pooling, "pooling_mode", None) == "mean"
        and getattr(pooling, "include_prompt", True)
        and not getattr(transformer, "do_lower_case", False)
        and getattr(transformer, "auto_model", None) is not None
    )


def _mean_pooled(w: LoadedModel, tok: Any, texts: list[str], *, traced: bool = False) -> np.ndarray:
    """One batch through the bare transformer, mean-pooled and normalized (runs under autocast).

    What the pipeline's encode() computes (equal within 1e-5, checked at load; bit-identical
    on this model here), minus its per-call glue: ~1.5 ms of a 9 ms single-query call, ~4 ms
    of a 16-query one, measured here. Queries are encoded one small batch at a time, so that
    glue is most of what batching cannot amortize. ``traced`` runs the traced transformer
    instead of the eager one (the query channel's; see _trace_encoder); should it ever fail
    on a batch, that batch and every later one run eagerly.
    """
    import torch

    enc = _model_inputs(w, tok, texts)
    with torch.inference_mode():
        hidden = None
        if traced and w.traced is not None and not _TRACE_FAILED.is_set():
            try:
                hidden = w.traced(*(enc[k] for k in _encoder_inputs(enc)))
            except Exception as exc:  # a shape the load-time check did not cover
                _TRACE_FAILED.set()
                log.error("embed.trace_failed_at_run_time", error=f"{type(exc).__name__}: {exc}")
        if hidden is None:
            hidden = w.model[0].auto_model(**enc).last_hidden_state
        # Sums in float32 whatever the hidden states' dtype, as sentence-transformers pools.
        mask = enc["attention_mask"].unsqueeze(-1).expand(hidden.size()).to(hidden.dtype)
        summed = (hidden * mask).sum(1, dtype=torch.float32)
        pooled = summed / mask.sum(1, dtype=torch.float32).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1).cpu().numpy()


# Set once the traced transformer has failed on a batch: the worker then stays eager.
_TRACE_FAILED = threading.Event()


def _model_inputs(w: LoadedModel, tok: Any, texts: list[str]) -> Any:
    """``texts`` tokenized for the bare transformer: padded, truncated, on the model's device."""
    enc = tok(texts, padding=True, truncation=True, max_length=w.model.max_seq_length, return_tensors="pt")
    return enc.to(w.cfg.device)


def _encoder_inputs(enc: Any) -> list[str]:
    return [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]


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
    """The transformer traced and frozen with TorchScript, or None where that fails or differs.

    Why: at query sizes (a few short texts) the eager forward pass is mostly per-op dispatch,
    not arithmetic. Traced and frozen, the same ops (the autocast casts recorded into the
    graph) run ~25% faster per call at 1-5 queries and ~10-15% at 16, measured on this
    machine, with the same vectors (bit-identical here). For documents (long batches) it measured no faster,
    so only the query channel uses it. The trace is taken on a padded batch: the attention
    mask's code path is recorded, and a batch without padding computes the same through it.
    Verified against the eager path on texts of several lengths before it is used.
    """
    import warnings

    import torch

    class _Hidden(torch.nn.Module):
        def __init__(self, model: Any, keys: list[str]) -> None:
            super().__init__()
            self.model, self.keys = model, keys

        def forward(self, *inputs: Any) -> Any:
            return self.model(**dict(zip(self.keys, inputs, strict=True))).last_hidden_state

    try:
        enc = _model_inputs(w, tok, list(_DIRECT_CHECK[:2]))
        keys = _encoder_inputs(enc)
        device = w.cfg.device.split(":")[0]
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")  # TracerWarnings on shape checks the check below covers
            with torch.autocast(device, dtype=torch.bfloat16, enabled=w.bf16, cache_enabled=False):
                module = torch.jit.trace(  # type: ignore[no-untyped-call]
                    _Hidden(w.model[0].auto_model, keys).eval(), tuple(enc[k] for k in keys), check_trace=False
                )
            module = torch.jit.freeze(module.eval())
        traced = dataclasses.replace(w, traced=module)
        texts = list(_DIRECT_CHECK)
        for batch in (texts, texts[:2], texts[1:2], _QUERY_CHECK):
            ours = encode(traced, tok, batch, traced=True)
            if _TRACE_FAILED.is_set() or _differs(ours, encode(w, tok, batch), "embed.trace_differs"):
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
        texts = [t.replace(CONTEXT_MARK, "\n") if isinstance(t, str) else t for t in texts]
    elif in_context:
        marked = set(in_context)
        plain = [i for i in range(len(texts)) if i not in marked]
        merged = np.zeros((len(texts), w.dims()), dtype=np.float32)
        merged[in_context] = _in_context(w, tok, [texts[i] for i in in_context])
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
                rows = _mean_pooled(w, tok, chunk, traced=traced)
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


def _specials(tok: Any) -> tuple[list[int], list[int]]:
    """The special token ids the tokenizer puts before and after one segment."""
    whole = list(tok("memory")["input_ids"])
    inner = list(tok("memory", add_special_tokens=False)["input_ids"])
    at = next(i for i in range(len(whole) - len(inner) + 1) if whole[i : i + len(inner)] == inner)
    return whole[:at], whole[at + len(inner) :]


def _in_context(w: LoadedModel, tok: Any, texts: Sequence[str]) -> np.ndarray:
    """Texts marked with ``CONTEXT_MARK``, each read with its context and pooled over its own
    tokens only (see the module's docstring), normalized."""
    import torch

    # The model's own special tokens around one segment ([CLS] … [SEP] for BERT-like models).
    head, tail = _specials(tok)
    limit = w.model.max_seq_length - len(head) - len(tail)
    contexts, owns = zip(*(t.split(CONTEXT_MARK, 1) for t in texts), strict=True)
    own_ids = tok(list(owns), add_special_tokens=False, truncation=True, max_length=limit)["input_ids"]
    ctx_ids = tok(list(contexts), add_special_tokens=False)["input_ids"]
    seqs: list[tuple[list[int], int]] = []  # the whole sequence, and where the text's own tokens start
    for ctx, own in zip(ctx_ids, own_ids, strict=True):
        room = limit - len(own)
        ctx = ctx[len(ctx) - room :] if room > 0 else []
        seqs.append(([*head, *ctx, *own, *tail], len(head) + len(ctx)))
    out = np.zeros((len(texts), w.dims()), dtype=np.float32)
    device = w.cfg.device.split(":")[0]
    with torch.autocast(device, dtype=torch.bfloat16, enabled=w.bf16, cache_enabled=False), torch.inference_mode():
        for batch in length_batches([len(s) for s, _ in seqs], w.cfg.batch_size):
            width = max(len(seqs[i][0]) for i in batch)
            ids = torch.full((len(batch), width), tok.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            own = torch.zeros((len(batch), width), dtype=torch.float32)
            for row, i in enumerate(batch):
                seq, start = seqs[i]
                ids[row, : len(seq)] = torch.tensor(seq)
                mask[row, : len(seq)] = 1
                end = len(seq) - len(tail)
                if end > start:
                    own[row, start:end] = 1
                else:  # a text with no token of its own (only spaces) is pooled whole
                    own[row, : len(seq)] = 1
            enc = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
            enc = {k: v for k, v in enc.items() if k in tok.model_input_names}
            hidden = w.model[0].auto_model(**{k: v.to(w.cfg.device) for k, v in enc.items()}).last_hidden_state
            weights = own.to(w.cfg.device).unsqueeze(-1)
            summed = (hidden.to(torch.float32) * weights).sum(1)
            pooled = torch.nn.functional.normalize(summed / weights.sum(1).clamp(min=1e-9), p=2, dim=1)
            out[batch] = pooled.cpu().numpy()
    return out


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
    if not _is_mean_pooled_text_model(w.model):
        return False
    try:
        ours = encode(w, tok, _DIRECT_CHECK, direct=True)
    except Exception as exc:
        log.warning("embed.direct_path_failed", error=f"{type(exc).__name__}: {exc}")
        return False
    return not _differs(ours, encode(w, tok, _DIRECT_CHECK, direct=False), "embed.direct_path_differs")


def load(path: str, cfg: EmbeddingConfig, channels: Sequence[str]) -> tuple[LoadedModel, dict[str, Any]]:
    """Load the model, its length probe and one tokenizer per channel, and pick its fast paths.

    The direct path (_mean_pooled) is taken only where it gives the pipeline's vectors, and
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
        rows = _in_context(w, tok, sample)
    except Exception as exc:
        log.warning("embed.in_context_failed", error=f"{type(exc).__name__}: {exc}")
        return False
    return rows.shape[0] == len(sample) and bool(np.isfinite(rows).all())
