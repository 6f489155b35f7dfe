"""When a daemon that cannot use the index leaves its consumer groups, and when it joins again (pure)."""

from __future__ import annotations

import pytest

from daemon.presence import next_move


@pytest.mark.parametrize(
    ("usable", "aside", "others_usable", "move"),
    [
        (True, False, False, None),  # a daemon that can use the index never leaves
        (True, False, True, None),
        (False, False, True, "leave"),  # it cannot, and another can: that one takes its partitions
        (False, False, False, None),  # nobody can: it stays, and answers `unavailable` with the reason
        (False, True, True, None),
        (False, True, False, "join"),  # the one that could is gone
        (True, True, True, "join"),  # it can now (a reindex with its settings)
        (True, True, False, "join"),
    ],
)
def test_next_move(usable: bool, aside: bool, others_usable: bool, move: str | None) -> None:
    assert next_move(usable=usable, aside=aside, others_usable=others_usable) == move
