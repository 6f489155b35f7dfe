"""The data dir line `up` prints: where the memory lives, and whether it is new."""

from __future__ import annotations

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
