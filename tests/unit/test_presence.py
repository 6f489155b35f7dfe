"""Whose standing counts as a daemon that may still run (pure but for this process's pid)."""

from __future__ import annotations

import os
import socket

from daemon.presence import Standing, _may_run


def _standing(host: str, pid: int) -> Standing:
    return Standing(instance="i", host=host, pid=pid, group="g", usable=True, why=None, at=0.0)


def test_a_daemon_of_this_host_counts_only_while_its_process_runs() -> None:
    """One killed here a moment ago and started again with other settings is no other daemon."""
    here = socket.gethostname()
    assert _may_run(_standing(here, os.getppid()))  # a process that runs
    assert _may_run(_standing(here, os.getpid()))  # another daemon of this process (tests run several)
    assert not _may_run(_standing(here, 2**22 + 12345))  # no such process
    assert _may_run(_standing("another-host", 2**22 + 12345))  # another host's: not ours to judge
