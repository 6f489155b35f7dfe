"""Which chunks of a doc under a sliced write queries may see (pure logic)."""

from __future__ import annotations

import pytest

from memory.visibility import WriteMarker, slices, supersedes, visible


def test_marker_round_trips_and_bad_markers_read_as_none() -> None:
    marker = WriteMarker(shown=3, writing=4, token="t")
    assert WriteMarker.decode(marker.encode()) == marker
    assert WriteMarker.decode(marker.encode().encode()) == marker  # as redis returns it
    assert WriteMarker.decode(None) is None
    for bad in (
        "",
        "{",
        "[]",
        '{"shown": 1}',
        '{"shown": "1", "writing": null, "token": ""}',
        '{"shown": true, "writing": null, "token": ""}',
    ):
        assert WriteMarker.decode(bad) is None, bad


def test_only_the_shown_version_is_visible() -> None:
    assert visible(5, None)  # no marker: no write under way
    writing = WriteMarker(shown=1, writing=2, token="t")
    assert visible(1, writing)
    assert not visible(2, writing)  # already overwritten in place by the new version
    assert not visible(None, writing)  # a hit without its version is not trusted
    assert not visible(1, WriteMarker(shown=None, writing=2, token="t"))  # new doc or a delete
    finished = WriteMarker(shown=2, writing=None)
    assert visible(2, finished) and not visible(1, finished)


def test_newer_unfinished_writes_win() -> None:
    writing = WriteMarker(shown=1, writing=5, token="t")
    assert not supersedes(4, writing)
    assert supersedes(5, writing)  # a redelivery takes its own version's write over
    assert supersedes(6, writing)
    assert supersedes(1, WriteMarker(shown=5, writing=None))  # finished: the stored version decides
    assert supersedes(1, None)


def test_slices_cover_everything_once() -> None:
    assert slices(0, 4) == []
    assert slices(10, 4) == [range(0, 4), range(4, 8), range(8, 10)]
    assert [i for part in slices(1000, 64) for i in part] == list(range(1000))
    with pytest.raises(ValueError):
        slices(3, 0)
