"""The packaged model under both precisions: bf16 autocast must give the float32 vectors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from memory.config import EmbeddingConfig
from memory.embedder import SentenceTransformerEmbedder, native_bf16, use_bf16

pytestmark = pytest.mark.integration

TEXTS = [
    "ERR_CONN_RESET_4F2A: the billing-service lost its connection to db-01.prod during the deploy.",
    "How do I rotate the TLS certificate of the ingress controller?",
    "Runbook: when pgbouncer reports max_connections, raise pool_size and restart the workers. " * 8,
]


async def test_bfloat16_vectors_match_float32(embedder: Any) -> None:
    """Same model, same texts: cosine >= 0.9999 between the two precisions, queries and docs alike."""
    f32 = SentenceTransformerEmbedder(cfg=EmbeddingConfig(precision="float32"), model=embedder._model)
    b16 = SentenceTransformerEmbedder(cfg=EmbeddingConfig(precision="bfloat16"), model=embedder._model)
    try:
        assert not f32.bf16 and b16.bf16
        a, b = await f32.embed_documents(TEXTS), await b16.embed_documents(TEXTS)
        assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
        assert np.allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-3)
        assert (a * b).sum(axis=1).min() >= 0.9999
        qa, qb = await f32.embed_query(TEXTS[1]), await b16.embed_query(TEXTS[1])
        assert float(qa @ qb) >= 0.9999
        # and they are not the same computation (the setting is not ignored)
        assert not np.array_equal(a, b)
    finally:
        f32.close()
        b16.close()


def test_auto_precision_follows_the_cpu() -> None:
    assert use_bf16(EmbeddingConfig(precision="auto")) == native_bf16()
    assert use_bf16(EmbeddingConfig(precision="auto", device="cuda")) is False
    assert use_bf16(EmbeddingConfig(precision="float32")) is False
