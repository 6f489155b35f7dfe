"""A kind filter that can match nothing in the query's scope (pure)."""

from __future__ import annotations

from graph.search import outside_scope


def test_a_kind_outside_the_scope_is_named_with_the_scope_to_ask() -> None:
    why = outside_scope({"kind": "community"}, "chunks")
    assert why is not None and "outside scope 'chunks'" in why and "'communities'" in why
    why = outside_scope({"kind": ["document", "transcript"]}, "communities")
    assert why is not None and "'chunks'" in why


def test_a_kind_that_is_none_is_named_as_such_in_every_scope() -> None:
    for scope in ("chunks", "communities", "all"):
        why = outside_scope({"kind": "foo"}, scope)  # type: ignore[arg-type]
        assert why is not None and "'foo': no kind of memory" in why and "outside" not in why, why
    assert outside_scope({"kind": ["foo", "document"]}, "chunks") is None


def test_a_kind_the_scope_holds_or_an_exclusion_is_no_conflict() -> None:
    assert outside_scope({"kind": ["community", "document"]}, "chunks") is None  # one of them can match
    assert outside_scope({"kind": "community"}, "all") is None
    assert outside_scope({"kind": {"not": "community"}}, "chunks") is None
    assert outside_scope({"service": "billing"}, "chunks") is None
    assert outside_scope(None, "communities") is None
