"""The real embedder, keeping the texts it is sent: what an ingestion embedded, not reused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class Counting:
    """The real embedder, counting the texts it is sent; ``identity`` may claim another model."""

    def __init__(self, inner: Any, identity: str | None = None) -> None:
        self.inner, self.dims = inner, inner.dims
        self.identity = identity or inner.identity
        self.sent: list[str] = []

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        self.sent.extend(texts)
        return await self.inner.embed_documents(texts)

    async def embed_query(self, text: str) -> np.ndarray:
        return await self.inner.embed_query(text)

    async def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return await self.inner.token_offsets(text)
