"""The embedding model's fast paths, each taken only where ``memory.embed_model.load`` found
it gives the library's own vectors: the bare transformer mean-pooled here (``direct``), that
transformer traced and frozen with TorchScript for queries (``traced``), and texts pooled in
context (``in_context``).

A text holding :data:`memory.conversation.CONTEXT_MARK` is embedded *in context*: the model
reads what comes before the mark and the text after it in one sequence, and the vector pools
only the text's own tokens (so the context shapes their meaning without diluting the vector;
the context is cut from its start when both do not fit). Without the direct path such a text
is embedded whole, the mark read as a line break and the context cut from its start as
there (:func:`context_cut_to_fit`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import structlog

from memory.conversation import CONTEXT_MARK
from memory.length_batches import length_batches
from memory.loaded_model import LoadedModel

log = structlog.get_logger()


def is_mean_pooled_text_model(model: Any) -> bool:
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


def mean_pooled(w: LoadedModel, tok: Any, texts: list[str], *, traced: bool = False) -> np.ndarray:
    """One batch through the bare transformer, mean-pooled and normalized (runs under autocast).

    What the pipeline's encode() computes (equal within 1e-5, checked at load; bit-identical
    on this model here), minus its per-call glue: ~1.5 ms of a 9 ms single-query call, ~4 ms
    of a 16-query one, measured here. Queries are encoded one small batch at a time, so that
    glue is most of what batching cannot amortize. ``traced`` runs the traced transformer
    instead of the eager one (the query channel's; see trace_encoder); should it ever fail
    on a batch, that batch and every later one run eagerly.
    """
    import torch

    enc = _model_inputs(w, tok, texts)
    with torch.inference_mode():
        hidden = None
        if traced and w.traced is not None and not TRACE_FAILED.is_set():
            try:
                hidden = w.traced(*(enc[k] for k in _encoder_inputs(enc)))
            except Exception as exc:  # a shape the load-time check did not cover
                TRACE_FAILED.set()
                log.error("embed.trace_failed_at_run_time", error=f"{type(exc).__name__}: {exc}")
        if hidden is None:
            hidden = w.model[0].auto_model(**enc).last_hidden_state
        # Sums in float32 whatever the hidden states' dtype, as sentence-transformers pools.
        mask = enc["attention_mask"].unsqueeze(-1).expand(hidden.size()).to(hidden.dtype)
        summed = (hidden * mask).sum(1, dtype=torch.float32)
        pooled = summed / mask.sum(1, dtype=torch.float32).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1).cpu().numpy()


# Set once the traced transformer has failed on a batch: the worker then stays eager.
TRACE_FAILED = threading.Event()


def _model_inputs(w: LoadedModel, tok: Any, texts: list[str]) -> Any:
    """``texts`` tokenized for the bare transformer: padded, truncated, on the model's device."""
    enc = tok(texts, padding=True, truncation=True, max_length=w.model.max_seq_length, return_tensors="pt")
    return enc.to(w.cfg.device)


def _encoder_inputs(enc: Any) -> list[str]:
    return [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]


def trace_encoder(w: LoadedModel, tok: Any, sample: list[str]) -> Any:
    """The transformer traced on ``sample`` and frozen with TorchScript (raises where that fails).

    Why: at query sizes (a few short texts) the eager forward pass is mostly per-op dispatch,
    not arithmetic. Traced and frozen, the same ops (the autocast casts recorded into the
    graph) run ~25% faster per call at 1-5 queries and ~10-15% at 16, measured on this
    machine, with the same vectors (bit-identical here). For documents (long batches) it measured no faster,
    so only the query channel uses it. The trace is taken on a padded batch: the attention
    mask's code path is recorded, and a batch without padding computes the same through it.
    ``memory.embed_model`` verifies it against the eager path before it is used.
    """
    import warnings

    import torch

    class _Hidden(torch.nn.Module):
        def __init__(self, model: Any, keys: list[str]) -> None:
            super().__init__()
            self.model, self.keys = model, keys

        def forward(self, *inputs: Any) -> Any:
            return self.model(**dict(zip(self.keys, inputs, strict=True))).last_hidden_state

    enc = _model_inputs(w, tok, sample)
    keys = _encoder_inputs(enc)
    device = w.cfg.device.split(":")[0]
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # TracerWarnings on shape checks that load()'s check covers
        with torch.autocast(device, dtype=torch.bfloat16, enabled=w.bf16, cache_enabled=False):
            module = torch.jit.trace(  # type: ignore[no-untyped-call]
                _Hidden(w.model[0].auto_model, keys).eval(), tuple(enc[k] for k in keys), check_trace=False
            )
        return torch.jit.freeze(module.eval())


def _specials(tok: Any) -> tuple[list[int], list[int]]:
    """The special token ids the tokenizer puts before and after one segment."""
    whole = list(tok("memory")["input_ids"])
    inner = list(tok("memory", add_special_tokens=False)["input_ids"])
    at = next(i for i in range(len(whole) - len(inner) + 1) if whole[i : i + len(inner)] == inner)
    return whole[:at], whole[at + len(inner) :]


def pooled_in_context(w: LoadedModel, tok: Any, texts: Sequence[str]) -> np.ndarray:
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


def context_cut_to_fit(w: LoadedModel, tok: Any, texts: Sequence[str]) -> list[str]:
    """Texts marked with ``CONTEXT_MARK`` for the library's own encode(): the mark read as a
    line break, and the context cut from its start so that the text's own tokens all fit the
    model's window (the library cuts from the end, which would drop the text's own end in
    favour of its headings or previous turns). A tokenizer without offsets drops the context
    of a text that does not fit with it."""
    head, tail = _specials(tok)
    limit = w.model.max_seq_length - len(head) - len(tail) - 1  # and the line break's token
    out: list[str] = []
    for text in texts:
        context, own = text.split(CONTEXT_MARK, 1)
        room = limit - len(tok(own, add_special_tokens=False)["input_ids"])
        ctx = tok(context, add_special_tokens=False, return_offsets_mapping=bool(tok.is_fast))
        if len(ctx["input_ids"]) <= room:
            out.append(f"{context}\n{own}")
        elif room <= 0 or not tok.is_fast:
            out.append(own)
        else:
            out.append(f"{context[ctx['offset_mapping'][-room][0] :]}\n{own}")
    return out
