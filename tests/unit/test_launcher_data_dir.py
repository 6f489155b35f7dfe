"""The data dir line `up` prints: where the memory lives, and whether it is new."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from daemon.launcher import describe_data_dir


def test_the_data_dir_is_named_absolute_and_new_or_earlier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert describe_data_dir(Path(".agentmem")).startswith(f"{tmp_path / '.agentmem'} (new: the memory starts empty")
    aof = tmp_path / ".agentmem" / "appendonlydir"
    aof.mkdir(parents=True)
    # What a Redis that started and stopped leaves (a start that failed on a taken port): new.
    (aof / "appendonly.aof.1.base.rdb").write_bytes(b"R" * 131)
    (aof / "appendonly.aof.1.incr.aof").write_bytes(b"")
    (aof / "appendonly.aof.manifest").write_text("file appendonly.aof.1.base.rdb seq 1 type b\n" * 20)
    assert "(new: the memory starts empty" in describe_data_dir(Path(".agentmem"))
    (aof / "appendonly.aof.1.incr.aof").write_bytes(b"*3\r\n$9\r\nFT.CREATE\r\n" * 100)
    assert describe_data_dir(Path(".agentmem")) == f"{tmp_path / '.agentmem'} (Redis's data from earlier runs)"


def test_the_live_holder_of_the_data_dir_is_read_without_the_lock(tmp_path: Path) -> None:
    """doctor names the `up` whose embedded broker does not answer: the lock's holder while it
    holds it, none after a clean stop, nor for a holder gone since whose pid the file names."""
    from daemon.launcher import data_dir_lock, running_holder

    assert running_holder(tmp_path) is None
    with data_dir_lock(tmp_path):
        assert running_holder(tmp_path) == os.getpid()
    assert running_holder(tmp_path) is None  # a clean stop empties the file
    (tmp_path / ".agentmemd.lock").write_text(f"pid {_exited_pid()}\n")
    assert running_holder(tmp_path) is None


def _exited_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


async def test_doctor_sends_to_the_up_whose_broker_does_not_answer(tmp_path: Path) -> None:
    """A broker that does not answer while an `up` holds the data dir: its fix is to restart that
    `up` (`agentmemd servers`, the generic fix, would be refused: the data dir is in use)."""
    import socket

    from daemon.doctor_kafka import check_kafka
    from daemon.launcher import data_dir_lock
    from daemon.settings import Settings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        settings = Settings(kafka_bootstrap=f"127.0.0.1:{s.getsockname()[1]}", data_dir=tmp_path)
        [alone] = await check_kafka(settings)
        assert not alone.ok and "`agentmemd servers`" in alone.fix
        with data_dir_lock(tmp_path):
            [held] = await check_kafka(settings)
    assert not held.ok and f"pid {os.getpid()}" in held.fix and "start it again" in held.fix, held
