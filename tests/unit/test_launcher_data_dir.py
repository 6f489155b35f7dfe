"""The data dir line `up` prints: where the memory lives, and whether it is new."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.launcher import describe_data_dir


def test_the_data_dir_is_named_absolute_and_new_or_earlier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert describe_data_dir(Path(".agentmem")).startswith(f"{tmp_path / '.agentmem'} (new: the memory starts empty")
    (tmp_path / ".agentmem" / "appendonlydir").mkdir(parents=True)
    assert describe_data_dir(Path(".agentmem")) == f"{tmp_path / '.agentmem'} (Redis's data from earlier runs)"
