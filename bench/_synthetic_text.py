"""Synthetic text: deterministic English-looking paragraphs and queries with technical identifiers."""

from __future__ import annotations

import random
from pathlib import Path

import _common  # noqa: F401  (the offline environment and sys.path, before any project module)

SERVICES = [
    "billing-service", "auth-service", "search-api", "ledger-service", "payments-gateway",
    "orders-service", "inventory-worker", "notify-queue", "session-cache", "reports-api",
    "shipping-service", "catalog-api", "profile-service", "fraud-worker", "pricing-service",
]  # fmt: skip
CONFIG_KEYS = [
    "max_connections", "token_ttl", "refresh_interval", "lock_timeout", "pool_size",
    "retry_backoff", "batch_size", "idle_timeout", "queue_depth", "cache_ttl",
]  # fmt: skip
HTTP_STATUSES = ["HTTP 500", "HTTP 502", "HTTP 503", "HTTP 504", "HTTP 401", "HTTP 429"]


class SyntheticText:
    """Deterministic English-looking text: words drawn (Zipf-like) from the model's vocabulary.

    Whole words of the embedding model's WordPiece vocabulary, roughly in frequency order,
    give realistic token counts per word, and a few technical identifiers per paragraph
    give BM25 and the graph layer something to find. Nothing is downloaded.
    """

    def __init__(self, seed: int = 7) -> None:
        from memory.config import PACKAGED_MODEL
        from memory.embedder import resolve_model_path

        vocab = Path(resolve_model_path(PACKAGED_MODEL)) / "vocab.txt"
        words = [w.strip() for w in vocab.read_text(encoding="utf-8").splitlines()]
        self.words = [w for w in words[1990:22000] if w.isalpha() and w.isascii() and len(w) >= 3]
        self.rng = random.Random(seed)
        n = len(self.words)
        self._weights = [1.0 / (i + 10) for i in range(n)]
        self._cum: list[float] = []
        total = 0.0
        for w in self._weights:
            total += w
            self._cum.append(total)

    def word(self) -> str:
        return self.rng.choices(self.words, cum_weights=self._cum, k=1)[0]

    def words_n(self, n: int) -> list[str]:
        return self.rng.choices(self.words, cum_weights=self._cum, k=n)

    def identifier(self) -> str:
        r = self.rng.random()
        if r < 0.35:
            return self.rng.choice(SERVICES)
        if r < 0.6:
            return self.rng.choice(CONFIG_KEYS)
        if r < 0.8:
            return self.rng.choice(HTTP_STATUSES)
        return f"ERR_{self.word().upper()}_{self.rng.randrange(16**3):03X}"

    def sentence(self) -> str:
        words = self.words_n(self.rng.randint(8, 20))
        if self.rng.random() < 0.4:
            words.insert(self.rng.randrange(len(words)), self.identifier())
        return " ".join(words).capitalize() + "."

    def paragraph(self, n_words: int) -> str:
        out: list[str] = []
        count = 0
        while count < n_words:
            s = self.sentence()
            out.append(s)
            count += len(s.split())
        return " ".join(out)

    def query(self, n_words: int = 6) -> str:
        return " ".join(self.words_n(n_words))
