"""What this package is: its distribution name and installed version."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "agent-memory-daemon"


def package_version() -> str:
    """The installed version (``pyproject.toml``'s), or ``"0+unknown"`` when run from a tree
    that was never installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"
