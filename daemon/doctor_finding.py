"""What one of doctor's checks found (``daemon.doctor``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Finding:
    """One check: its name, whether it passed, what was seen, and how to fix it."""

    check: str
    ok: bool
    detail: str
    fix: str = ""
