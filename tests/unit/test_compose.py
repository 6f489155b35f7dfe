"""The production stack's files agree with the project (read as text and YAML: no Docker here)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_the_image_pins_the_torch_install_sh_installs() -> None:
    """An older pin in the Dockerfile built the daemon on another torch than the one tested."""
    (pinned,) = re.findall(r'"torch==([0-9.]+)"', (ROOT / "install.sh").read_text())
    assert f"ARG TORCH_VERSION={pinned}\n" in (ROOT / "compose" / "Dockerfile").read_text()


def test_kafka_and_redis_are_reachable_from_the_host_on_loopback() -> None:
    """Agents and the operator's CLI on the host reach the stack; nothing beyond loopback."""
    services = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())["services"]
    kafka = services["kafka"]
    assert "127.0.0.1:9094:9094" in kafka["ports"]
    assert "HOST://${KAFKA_HOST_ADDRESS:-localhost:9094}" in kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert "HOST://:9094" in kafka["environment"]["KAFKA_LISTENERS"]
    assert "127.0.0.1:6379:6379" in services["redis"]["ports"]
    assert all(p.startswith("127.0.0.1:") for s in services.values() for p in s.get("ports", []))


def test_the_build_context_leaves_a_checkouts_state_out() -> None:
    """The context is the project root: without these, a checkout sent its .venv (GBs) to the builder."""
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", ".agentmem"} <= set(ignored)
