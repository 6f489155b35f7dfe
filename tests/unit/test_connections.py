"""Clients built from settings: an unreachable broker at the default address says where the
settings would have come from."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from consumers.client import MemoryClient
from daemon.connections import _default_broker_hint
from daemon.settings import Settings
from memory.errors import BackendUnavailable


def _no_settings(monkeypatch: pytest.MonkeyPatch, cwd: Path) -> None:
    for key in [k for k in os.environ if k.startswith("AGENTMEM_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(cwd)


def test_the_default_broker_names_where_settings_are_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No variable and no .env: the hint names the variable and the directory searched; a broker
    set anywhere (the environment, a .env) gives none."""
    _no_settings(monkeypatch, tmp_path)
    hint = _default_broker_hint(Settings())
    assert "AGENTMEM_KAFKA_BOOTSTRAP is not set" in hint and str(tmp_path) in hint
    (tmp_path / ".env").write_text("AGENTMEM_KAFKA_BOOTSTRAP=127.0.0.1:19092\n")
    assert _default_broker_hint(Settings()) == ""
    (tmp_path / ".env").unlink()
    monkeypatch.setenv("AGENTMEM_KAFKA_BOOTSTRAP", "127.0.0.1:29092")
    assert _default_broker_hint(Settings()) == ""


async def test_an_unreachable_broker_adds_the_hint() -> None:
    """The client's start fails as any client's does, with the hint after the reason."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        client = MemoryClient(unreachable_hint="the hint", bootstrap=f"127.0.0.1:{port}", timeout_s=5)
        with pytest.raises(BackendUnavailable, match=rf"kafka at 127\.0\.0\.1:{port} unreachable: .* \(the hint\)$"):
            await client.start()
        await client.close()
