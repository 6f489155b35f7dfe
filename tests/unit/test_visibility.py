"""Which chunks of a doc under a sliced write queries may see (pure logic)."""

from __future__ import annotations

import pytest

from memory.visibility import TAKEOVER_AFTER_S, WriteMarker, decide, slices, visible


def test_marker_round_trips_and_bad_markers_read_as_none() -> None:
    marker = WriteMarker(shown=3, writing=4, token="t", owner="o", since=1.5, beat=2.5)
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


def test_who_may_write_over_an_unfinished_write() -> None:
    now = 1_000_000.0
    live = WriteMarker(shown=1, writing=5, token="t", owner="other", beat=now - 1)
    assert decide(4, live, owner="me", now=now) == "skip"  # a later version is being written
    assert decide(6, live, owner="me", now=now) == "write"  # a later version replaces it
    assert decide(5, live, owner="me", now=now) == "wait"  # another live process writes this one
    assert decide(5, live, owner="other", now=now) == "write"  # a process's own failed attempt
    dead = WriteMarker(shown=1, writing=5, token="t", owner="other", beat=now - TAKEOVER_AFTER_S - 1)
    assert decide(5, dead, owner="me", now=now) == "write"  # no progress for long: its writer died
    copied = WriteMarker(shown=1, writing=5, token="t")  # a reindex's copy: nobody holds it
    assert decide(5, copied, owner="me", now=now) == "write"
    assert decide(1, WriteMarker(shown=5, writing=None), owner="me", now=now) == "write"  # finished
    assert decide(1, None, owner="me", now=now) == "write"
    assert decide(None, live, owner="me", now=now) == "write"  # unversioned items never wait


def test_slices_cover_everything_once() -> None:
    assert slices(0, 4) == []
    assert slices(10, 4) == [range(0, 4), range(4, 8), range(8, 10)]
    assert [i for part in slices(1000, 64) for i in part] == list(range(1000))
    with pytest.raises(ValueError):
        slices(3, 0)
