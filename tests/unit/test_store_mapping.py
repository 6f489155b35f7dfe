"""LangGraph store items as documents: ids, sources, metadata and filters (pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from consumers.events import DocumentEvent
from consumers.store_mapping import (
    PIECE_CHARS,
    ROOT,
    is_item,
    item_doc_id,
    item_parts,
    literal_prefix,
    matches_filter,
    namespace_matches,
    namespace_source,
    pushdown_filter,
    source_namespace,
    value_metadata,
)
from memory.errors import InvalidRequest

NAMESPACES = [("users",), ("users", "u1", "memories"), ("a/b", "c%2F", "ü ñ"), ("x" * 100,)]


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_a_namespace_round_trips_through_its_source(namespace: tuple[str, ...]) -> None:
    source = namespace_source(namespace)
    assert source.startswith(ROOT) and source.endswith("/") and source.isascii()
    assert source_namespace(source) == namespace


def test_a_source_prefix_is_a_namespace_prefix() -> None:
    """Labels are whole: ("users",) is a prefix of ("users", "u1") and not of ("users2",)."""
    assert namespace_source(("users", "u1")).startswith(namespace_source(("users",)))
    assert not namespace_source(("users2",)).startswith(namespace_source(("users",)))
    assert not namespace_source(("a/b",)).startswith(namespace_source(("a",)))
    assert source_namespace("wiki/runbook.md") is None
    assert namespace_source(()) == ROOT  # the prefix of every item (no item has an empty namespace)


def test_doc_ids_are_deterministic_distinct_and_valid() -> None:
    ids = {item_doc_id(ns, key) for ns in NAMESPACES for key in ("k", "k/1", "", "\x00")}
    assert len(ids) == len(NAMESPACES) * 4
    assert item_doc_id(("a",), "b/c") == item_doc_id(("a",), "b/c") != item_doc_id(("a", "b"), "c")
    long = item_doc_id(("n",), "k" * 2000)
    assert long.startswith(f"{ROOT}sha256:") and long != item_doc_id(("n",), "k" * 2001)
    for doc_id in ids | {long}:  # what the daemon accepts: checked by the contract's own model
        DocumentEvent.model_validate({"event_id": "e", "op": "delete", "doc_id": doc_id, "version": 1})


def test_a_namespace_too_long_for_a_filter_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="512"):
        namespace_source(("ü" * 100,))  # 600 characters once percent-encoded


def test_a_namespace_given_as_a_string_is_refused() -> None:
    """``"users"`` for ``("users",)`` would be stored under ``("u", "s", "e", "r", "s")``."""
    with pytest.raises(InvalidRequest, match=r"a tuple of labels, \('users',\)"):
        item_doc_id("users", "k")  # type: ignore[arg-type]


def test_a_value_round_trips_through_metadata() -> None:
    created = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    value: dict[str, Any] = {"text": "x" * (2 * PIECE_CHARS + 5), "n": 1.5, "nested": {"a": [1, None]}, "service": "s"}
    meta = value_metadata(("a", "b"), "k", value, created_at=created, filter_keys=("service", "environment"))
    assert meta["lg_pieces"] == 3 and all(len(str(v)) <= PIECE_CHARS for v in meta.values())
    assert meta["service"] == "s" and "environment" not in meta
    assert is_item(meta) and not is_item({"service": "s"}) and not is_item(None)
    assert item_parts(meta) == (("a", "b"), "k", value, created)
    DocumentEvent.model_validate(
        {"event_id": "e", "op": "upsert", "doc_id": "d", "version": 1, "content": "c", "metadata": meta}
    )


@pytest.mark.parametrize("bad", [{"t": datetime.now(UTC)}, {"n": float("nan")}, {"t": "x" * (57 * PIECE_CHARS)}])
def test_a_value_that_cannot_be_stored_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        value_metadata(("a",), "k", bad, created_at=datetime.now(UTC))


def test_only_string_equality_and_inequality_on_filterable_fields_are_pushed_down() -> None:
    flt = {"service": "billing", "environment": {"$eq": "prod"}, "kind": "x", "priority": 2, "agent_id": {"$ne": "a"}}
    flt |= {"role": {"$ne": 3}, "team": {"$gt": "a"}, "user": {"$eq": "u", "$ne": "v"}}
    assert pushdown_filter(flt, ("service", "environment", "agent_id", "kind", "role", "team", "user")) == {
        "service": "billing",
        "environment": "prod",
        "agent_id": {"not": "a"},
    }
    assert pushdown_filter(None, ("service",)) == {}


VALUE = {"kind": "pref", "n": 3, "tags": ["a", "b"], "nested": {"x": 1, "y": "z"}}


@pytest.mark.parametrize(
    ("flt", "want"),
    [
        ({"kind": "pref"}, True),
        ({"kind": "fact"}, False),
        ({"n": {"$gt": 2, "$lte": 3}}, True),
        ({"n": {"$lt": 3}}, False),
        ({"n": {"$ne": 3}}, False),
        ({"tags": ["a", "b"]}, True),
        ({"tags": ["a"]}, False),
        ({"nested": {"x": 1}}, True),
        ({"nested": {"x": 2}}, False),
        ({"missing": None}, True),
    ],
)
def test_filters_decide_as_in_memory_store_does(flt: dict[str, Any], want: bool) -> None:
    from langgraph.store.memory import _compare_values  # the reference: InMemoryStore's own

    assert matches_filter(VALUE, flt) is want
    assert all(_compare_values(VALUE.get(k), v) for k, v in flt.items()) is want


def test_namespace_conditions() -> None:
    ns = ("users", "u1", "memories")
    assert namespace_matches(ns, "prefix", ("users", "*")) and namespace_matches(ns, "suffix", ("memories",))
    assert not namespace_matches(ns, "prefix", ("docs",)) and not namespace_matches(ns, "suffix", ("*", "x"))
    assert not namespace_matches(("a",), "prefix", ("a", "b"))
    assert literal_prefix(("users", "*", "memories")) == ("users",) and literal_prefix(("*",)) == ()
