"""A contribution's version read from the head of its stored JSON (``graph.store.head_version``):
the summarizer reads it for every document of a community it summarizes."""

from __future__ import annotations

import json

from graph.contribution import Contribution
from graph.store import _UNREAD, _VERSION_HEAD, head_version


def _large() -> Contribution:
    chunks = [f"doc/big#{i}" for i in range(5000)]
    return Contribution(entities={f"e{i}": (f"Entity {i}", "ORG", chunks) for i in range(3)}, edges={("e0", "e1"): 4})


def test_the_version_comes_from_the_head_of_a_large_contribution() -> None:
    for version in (1733900000123456, None):
        stored = _large().to_json(version)
        assert len(stored) > 100 * _VERSION_HEAD
        found = head_version(stored[:_VERSION_HEAD])
        assert found == json.loads(stored)["v"] == (None if version is None else str(version))


def test_a_tombstone_is_read_whole_in_any_key_order() -> None:
    """The apply script encodes a delete's tombstone itself, and Lua tables have no key order."""
    for tombstone in ('{"v":"7","e":{},"x":{},"d":1}', '{"e":{},"d":1,"x":{},"v":"7"}'):
        assert head_version(tombstone) == "7"


def test_a_head_that_names_no_version_is_read_whole() -> None:
    """A long value whose head does not open with the version (another writer's key order, a
    number where a string is written): the caller reads it whole rather than guess."""
    other_order = json.dumps({"e": {"k": ["n", "t", ["c"] * 500]}, "v": "7"}, separators=(",", ":"))
    assert head_version(other_order[:_VERSION_HEAD]) is _UNREAD
    number = json.dumps({"v": 7, "e": {"k": ["n", "t", ["c"] * 500]}}, separators=(",", ":"))
    assert head_version(number[:_VERSION_HEAD]) is _UNREAD
