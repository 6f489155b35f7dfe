"""What a write pushes onto a document's history (``memory.index.history.plan_history``, pure)."""

from __future__ import annotations

from typing import Any

from memory.batch_plan import passed_over
from memory.index.copying import _merged
from memory.index.history import Passed, Version, plan_history
from memory.records import MemoryItem


def said(version: int, content: str, ts: float, *, deleted: bool = False, **meta: object) -> Passed:
    return Passed(version, deleted, content, "notes/ana.md", dict(meta), ts)


def stored(version: int, content: str, ts: float) -> Version:
    return Version(version, content, "notes/ana.md", {}, ts, None)


def shown(plan: tuple[list[Version], bool]) -> tuple[list[tuple[int, str, float | None, float | None]], bool]:
    entries, clear = plan
    return [(e.version, e.content, e.timestamp, e.until) for e in entries], clear


def test_the_stored_version_is_kept_until_the_write_that_replaces_it() -> None:
    plan = plan_history(stored(1, "Paris", 10.0), 1, [], said(2, "Berlin", 20.0), None)
    assert shown(plan) == ([(1, "Paris", 10.0, 20.0)], False)


def test_the_versions_a_batch_passed_over_are_kept_in_order_each_until_the_next() -> None:
    passed = [said(3, "Munich", 30.0), said(2, "Berlin", 20.0), said(1, "old", 1.0)]  # v1: below the stored one
    plan = plan_history(stored(1, "Paris", 10.0), 1, passed, said(4, "Lisbon", 40.0), None)
    assert shown(plan) == ([(1, "Paris", 10.0, 20.0), (2, "Berlin", 20.0, 30.0), (3, "Munich", 30.0, 40.0)], False)


def test_a_delete_in_the_batch_drops_everything_before_it() -> None:
    passed = [said(2, "Berlin", 20.0), said(3, "", 30.0, deleted=True), said(4, "Munich", 40.0)]
    plan = plan_history(stored(1, "Paris", 10.0), 1, passed, said(5, "Lisbon", 50.0), 1)
    # The list goes, and what came after the delete is kept, whatever the head said.
    assert shown(plan) == ([(4, "Munich", 40.0, 50.0)], True)


def test_an_unchanged_version_is_no_change_and_the_latest_to_say_it_stands_for_both() -> None:
    passed = [said(2, "Paris", 20.0), said(3, "Berlin", 30.0)]
    plan = plan_history(stored(1, "Paris", 10.0), 1, passed, said(4, "Berlin", 40.0), None)
    # As written one at a time: v2 replaced v1 with no change, so v2 stands for both.
    assert shown(plan) == ([(2, "Paris", 20.0, 30.0)], False)
    # Metadata is part of what a version says.
    plan = plan_history(stored(1, "Paris", 10.0), 1, [], said(2, "Paris", 20.0, team="x"), None)
    assert shown(plan) == ([(1, "Paris", 10.0, 20.0)], False)


def test_what_the_head_holds_already_is_not_pushed_again() -> None:
    passed = [said(2, "Berlin", 20.0)]
    plan = plan_history(stored(1, "Paris", 10.0), 1, passed, said(3, "Lisbon", 30.0), 2)
    assert shown(plan) == ([], False)
    plan = plan_history(stored(1, "Paris", 10.0), 1, passed, said(3, "Lisbon", 30.0), 1)
    assert shown(plan) == ([(2, "Berlin", 20.0, 30.0)], False)


def test_a_stored_version_not_to_be_kept_still_bounds_the_batch() -> None:
    # A sliced write under way: the stored v2 is not read, yet v1 and v2 of the batch are past.
    passed = [said(1, "old", 1.0), said(2, "Berlin", 20.0), said(3, "Munich", 30.0)]
    plan = plan_history(None, 2, passed, said(4, "Lisbon", 40.0), None)
    assert shown(plan) == ([(3, "Munich", 30.0, 40.0)], False)


def test_a_batch_passes_over_the_lower_versions_of_a_kept_document_and_nothing_else() -> None:
    def item(doc: str, version: int | None, content: str = "text", op: str = "upsert", **kw: Any) -> MemoryItem:
        return MemoryItem(op, doc, version, content=content, **kw)  # type: ignore[arg-type]

    kept = item("a", 3)
    lower, other_tenant = item("a", 2), item("a", 1, tenant="acme")
    blank = item("a", 1, "\u200b\ufeff")  # refused, had it been written: said nothing, held nothing
    deleted = item("a", 1, "", op="delete")
    late = item("a", 2, "after v3")  # ignored, had it come alone
    turn = item("transcript:x/s/0", None, kind="transcript")
    batch = [blank, deleted, lower, kept, other_tenant, late, turn, item("b", 1)]
    assert passed_over(batch, [kept, turn, other_tenant]) == {id(kept): [deleted, lower]}


def test_a_batch_passes_over_only_the_versions_that_would_have_held_one_at_a_time() -> None:
    # Shuffled versions: 1 after 3 and 4 after 5 would each have been ignored, as 6 after 8.
    items = [MemoryItem("upsert", "a", v, content=f"v{v}") for v in (3, 1, 5, 4, 8, 6)]
    kept = items[4]
    assert [i.version for i in passed_over(items, [kept])[id(kept)]] == [3, 5]
    # Only the winner, after a higher version's copy: nothing passed over.
    assert passed_over([kept, items[1]], [kept]) == {}


def test_a_write_that_starts_again_plans_what_it_pushed_the_first_time() -> None:
    passed = [said(2, "Paris", 20.0)]
    first = plan_history(stored(1, "Paris", 10.0), 1, passed, said(3, "Berlin", 30.0), None)
    assert shown(first) == ([(2, "Paris", 20.0, 30.0)], False)
    # Its start pushed that; started again, the stored version is not read (a sliced write under way).
    again = plan_history(None, 1, passed, said(3, "Berlin", 30.0), 2)
    assert shown(again) == ([], False)


def test_a_reindex_merge_keeps_each_version_once_ours_first_newest_first() -> None:
    def entry(version: int, content: str) -> bytes:
        return Version(version, content, "d", {}, float(version), float(version + 1)).encode().encode()

    theirs = [entry(3, "old three"), entry(2, "two"), entry(1, "one")]
    ours = [entry(4, "four"), entry(3, "three")]
    merged = [Version.decode(raw) for raw in _merged(theirs, ours, keep=4)]
    want = [(4, "four"), (3, "three"), (2, "two"), (1, "one")]
    assert [(v.version, v.content) for v in merged if v is not None] == want
    assert len(_merged(theirs, ours, keep=2)) == 2
    assert _merged([b"not json"], ours, keep=5) == ours  # an entry another release wrote is left out
