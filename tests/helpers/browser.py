"""Headless Chromium for the browser tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


def chromium() -> str | None:
    """The headless browser of the page tests, or None where none is installed."""
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def chromium_flags(user_dir: str) -> list[str]:
    """Headless Chromium's flags for a page test: no sandbox (root), no network of its own, a fresh profile."""
    return [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={user_dir}",
    ]
