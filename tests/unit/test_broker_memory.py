"""When `up` warns that the embedded broker's memory has grown: at 512 MiB and each doubling."""

from __future__ import annotations

from daemon.broker_memory import crossed

MIB = 1024 * 1024


def test_a_warning_at_the_first_size_and_at_each_doubling_once() -> None:
    assert crossed(100 * MIB, 0) is None
    assert crossed(512 * MIB, 0) == 512 * MIB
    assert crossed(900 * MIB, 512 * MIB) is None  # already told
    assert crossed(1024 * MIB, 512 * MIB) == 1024 * MIB
    assert crossed(5000 * MIB, 1024 * MIB) == 4096 * MIB  # a jump past several: the largest, once
    assert crossed(5000 * MIB, 4096 * MIB) is None
