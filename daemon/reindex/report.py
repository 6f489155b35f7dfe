"""What a reindex tells its caller: progress as it runs, a report at the end."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ReindexProgress:
    """Where a reindex is: its phase, and records replayed out of those to replay."""

    phase: str = "starting"
    generation: int = 0
    total: int = 0
    done: int = 0
    applied: int = 0
    skipped: int = 0
    invalid: int = 0
    failed: int = 0
    erased: int = 0  # events of an erased tenant (from before its erasure): never replayed
    communities: int = 0
    graph_docs: int = 0
    carried: int = 0  # docs copied from the old generation: the replay did not reproduce them
    # Built with other settings than the old generation: daemons on the old ones refuse it.
    settings_changed: bool = False


@dataclass
class ReindexReport:
    """The outcome: generations before and after, and what was replayed."""

    old_generation: int
    new_generation: int
    progress: ReindexProgress
    old_dropped: bool
    took_s: float
    chunks: int = 0
    errors: list[str] = field(default_factory=list)
    # The new generation's settings differ from the old one's: daemons still running with the
    # old settings refuse it until restarted with the new (docs/reindex.md).
    settings_changed: bool = False
