"""Session-wide real servers: a tansu broker and Redis with RediSearch on free ports.

Set AGENTMEM_TEST_KAFKA / AGENTMEM_TEST_REDIS_URL to run against servers you started
(for example compose/ with Apache Kafka) instead.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def unique(name: str, n: int = 10) -> str:
    """A short name derived from a test id, so parallel tests never share state."""
    return "t" + hashlib.sha1(name.encode()).hexdigest()[:n]


@pytest.fixture(scope="session")
def tmp_root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="agentmemd-tests-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_url(tmp_root: Path) -> Iterator[str]:
    if url := os.environ.get("AGENTMEM_TEST_REDIS_URL"):
        yield url
        return
    from daemon.launcher import free_port, start_redis

    url = f"redis://127.0.0.1:{free_port()}/0"
    server = start_redis(url, data_dir=tmp_root / "redis")
    yield url
    server.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_root: Path) -> Iterator[str]:
    if bootstrap := os.environ.get("AGENTMEM_TEST_KAFKA"):
        yield bootstrap
        return
    from daemon.launcher import free_port, start_tansu

    server = start_tansu(f"127.0.0.1:{free_port()}", log_dir=tmp_root / "tansu")
    yield server.address
    server.stop()


@pytest.fixture(scope="session")
async def embedder() -> AsyncIterator[object]:
    from memory.config import EmbeddingConfig
    from memory.embedder import SentenceTransformerEmbedder

    emb = await SentenceTransformerEmbedder.load(EmbeddingConfig())  # type: ignore[call-arg]
    yield emb
    emb.close()
