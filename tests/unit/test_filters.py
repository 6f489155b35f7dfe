"""Metadata filters: validation, AND/OR shape and escaping."""

from __future__ import annotations

import pytest

from memory.errors import InvalidRequest
from memory.filters import BASE_FILTER_KEYS, build_filter, conjoin, in_time, knn_clause, time_clause, value_hash

ALLOWED = set(BASE_FILTER_KEYS)


@pytest.mark.parametrize(
    ("flt", "query"),
    [
        (None, "*"),
        ({}, "*"),
        ({"service": "billing-service"}, r"@service:{billing\-service}"),
        (
            {"service": "billing-service", "environment": "production"},
            r"@environment:{production} @service:{billing\-service}",
        ),
        ({"environment": ["production", "staging"]}, "@environment:{production|staging}"),
        ({"service": "x} | @kind:{*"}, r"@service:{x\}\ \|\ \@kind\:\{\*}"),
        ({"service": {"not": "a"}}, f"-@h_service:[{value_hash('a')} {value_hash('a')}]"),
        (
            {"service": {"not": ["a", "b"]}, "environment": "prod"},
            f"@environment:{{prod}} -(@h_service:[{value_hash('a')} {value_hash('a')}] | "
            f"@h_service:[{value_hash('b')} {value_hash('b')}])",
        ),
    ],
)
def test_build_filter(flt, query) -> None:
    """Keys AND together, a list ORs its values, and values are escaped."""
    assert build_filter(flt, allowed=ALLOWED) == query


@pytest.mark.parametrize(
    ("flt", "message"),
    [
        ({"tenant": "a"}, "unknown metadata_filter key 'tenant'; filterable"),
        ({"Service": "a"}, r"unknown metadata_filter key 'Service' \(did you mean 'service'\?\)"),
        ({"servce": "a"}, r"'servce' \(did you mean 'service'\?\)"),
        ({"service": []}, "empty list"),
        ({"service": ""}, "1..512"),
        ({"service": 3}, "must be strings"),
        ({"service": ["a", 3]}, "must be strings"),
        ({"service": "x" * 600}, "1..512"),
        ({"kind": "turn"}, "kinds: document, transcript, community"),
        ({"kind": ["document", "Transcript"]}, "'Transcript'; kinds"),
    ],
)
def test_build_filter_rejects_bad_filters(flt, message) -> None:
    """Unknown keys and bad values are errors, never silently ignored: a kind outside the
    three would match nothing."""
    with pytest.raises(InvalidRequest, match=message):
        build_filter(flt, allowed=ALLOWED)


def test_hash_clause_and_matches() -> None:
    """The numeric form filters the same values; matches re-checks exact strings."""
    from memory.filters import hash_clause, matches, normalize_filter, tag_clause, value_hash

    flt = normalize_filter({"service": ["a", "b"], "environment": "prod"}, allowed=ALLOWED).include
    assert flt == {"environment": ["prod"], "service": ["a", "b"]}
    h = hash_clause(flt)
    assert h == (
        f"@h_environment:[{value_hash('prod')} {value_hash('prod')}] "
        f"(@h_service:[{value_hash('a')} {value_hash('a')}] | @h_service:[{value_hash('b')} {value_hash('b')}])"
    )
    assert tag_clause(flt) == "@environment:{prod} @service:{a|b}"
    assert 0 <= value_hash("x") < 2**53 and value_hash("x") == value_hash("x") != value_hash("y")
    assert matches({"environment": "prod", "service": "b"}, flt)
    assert not matches({"environment": "prod", "service": "c"}, flt)
    assert not matches({"service": "a"}, flt)
    assert hash_clause({}) == "*" == tag_clause({})


def test_knn_clause_uses_tags_unless_a_value_cannot_match_as_a_tag() -> None:
    """Edge whitespace or the separator: that key is filtered by the exact-value hash instead."""
    assert knn_clause({}) == "*"
    assert knn_clause({"environment": ["production"]}) == "@environment:{production}"
    spaced = knn_clause({"environment": ["production "], "service": ["billing"]})
    assert spaced == f"@h_environment:[{value_hash('production ')} {value_hash('production ')}] @service:{{billing}}"
    assert knn_clause({"service": ["a\x1fb"]}).startswith("@h_service:[")
    # ASCII control characters are a syntax error in a TAG query, escaped or not
    for value in ("\x00", "a\x00b", "\x01", "_\x01", "\x7f"):
        assert knn_clause({"service": [value]}).startswith("@h_service:["), repr(value)
    assert knn_clause({"service": ["_"]}) == "@service:{\\_}"


def test_time_range_clause_and_check() -> None:
    """A time range is a NUMERIC range over timestamps, open ends infinite; ANDed with the rest."""
    assert time_clause(None, None) == "*"
    assert time_clause(100.0, None) == "@timestamp:[100.0 +inf]"
    assert time_clause(None, 200) == "@timestamp:[-inf 200.0]"
    assert time_clause(1.5, 2.5) == "@timestamp:[1.5 2.5]"
    assert conjoin("*", "*") == "*"
    assert conjoin("@a:{x}", "*", "@timestamp:[1.0 +inf]") == "@a:{x} @timestamp:[1.0 +inf]"
    assert in_time(None, None, None) and not in_time(None, 1.0, None)
    assert in_time(5.0, 5.0, 5.0) and not in_time(4.9, 5.0, None) and not in_time(5.1, None, 5.0)
    # a timestamp as RediSearch returns it (12 significant digits) still passes the range the
    # engine matched it with, at either end (fuzzing: 00.123456 came back as 00.12)
    exact = 1735689600.123456
    returned = float(f"{exact:.12g}")
    assert in_time(returned, exact, exact) and in_time(returned, exact - 0.001, None)
    assert not in_time(returned, exact + 0.02, None) and not in_time(returned, None, exact - 0.02)
    # read from the hash (a context turn's), a timestamp 1 ms before the range is outside it
    assert not in_time(exact, exact + 0.001, None, exact=True) and in_time(exact, exact + 0.001, None)
    assert in_time(exact, exact, exact, exact=True) and not in_time(exact, None, exact - 0.001, exact=True)


def test_an_exclusion_keeps_what_lacks_the_key_and_drops_its_values() -> None:
    """``{"not": ...}``: a chunk without the key passes, one with an excluded value fails;
    keys AND with inclusions, and ``admits`` checks one key alone."""
    from memory.filters import normalize_filter

    flt = normalize_filter({"service": {"not": ["a", "b"]}, "environment": ["prod", "qa"]}, allowed=ALLOWED)
    assert (flt.include, flt.exclude) == ({"environment": ["prod", "qa"]}, {"service": ["a", "b"]})
    assert flt.keys == ("environment", "service")
    assert flt.matches({"environment": "prod"}) and flt.matches({"environment": "qa", "service": "c"})
    assert not flt.matches({"environment": "prod", "service": "b"}) and not flt.matches({"service": "c"})
    assert flt.admits("service", None) and flt.admits("service", "c") and not flt.admits("service", "a")
    assert not flt.admits("environment", "dev") and flt.admits("other", "x")
    narrowed = flt.including("service", ["c"]).without({"environment"})
    assert (narrowed.include, narrowed.exclude) == ({"service": ["c"]}, {"service": ["a", "b"]})


def test_exclusions_in_the_engine_queries() -> None:
    """The hash form negates each excluded key's values; the vector leg's too, always by
    hash, since a TAG clause matches a value RediSearch trimmed."""
    from memory.filters import normalize_filter

    flt = normalize_filter({"service": {"not": ["a", "b"]}, "environment": "prod"}, allowed=ALLOWED)
    ha, hb, hp = value_hash("a"), value_hash("b"), value_hash("prod")
    excluded = f"-(@h_service:[{ha} {ha}] | @h_service:[{hb} {hb}])"
    assert flt.hash_query() == f"@h_environment:[{hp} {hp}] {excluded}"
    assert flt.knn_query() == f"@environment:{{prod}} {excluded}"
    alone = normalize_filter({"service": {"not": "a"}}, allowed=ALLOWED)
    assert alone.hash_query() == alone.knn_query() == f"-@h_service:[{ha} {ha}]"


@pytest.mark.parametrize(
    ("flt", "message"),
    [
        ({"service": {"is": "a"}}, "its one key is 'not'"),
        ({"service": {"not": "a", "also": "b"}}, "its one key is 'not'"),
        ({"service": {"not": []}}, r"metadata_filter\['service'\]\['not'\] is an empty list"),
        ({"service": {"not": [""]}}, "1..512"),
    ],
)
def test_bad_exclusions(flt, message) -> None:
    with pytest.raises(InvalidRequest, match=message):
        build_filter(flt, allowed=ALLOWED)


@pytest.mark.parametrize(
    ("pairs", "want"),
    [
        ([], {}),
        (["env=prod", "env=qa", "svc=a=b"], {"env": ["prod", "qa"], "svc": "a=b"}),
        (["env!=prod"], {"env": {"not": "prod"}}),
        (["env!=prod", "env!=qa", "svc=a"], {"env": {"not": ["prod", "qa"]}, "svc": "a"}),
        (["env=!prod"], {"env": "!prod"}),
    ],
)
def test_filter_from_pairs(pairs, want) -> None:
    """``key=value`` texts include (a repeated key: any of them), ``key!=value`` exclude."""
    from memory.filters import filter_from_pairs

    assert filter_from_pairs(pairs) == want


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        (["env"], "key=value or key!=value"),
        (["=x"], "key=value"),
        (["!=x"], "key=value"),
        (["env=a", "env!=b"], "both"),
    ],
)
def test_filter_from_pairs_refuses(pairs, message) -> None:
    from memory.filters import filter_from_pairs

    with pytest.raises(InvalidRequest, match=message):
        filter_from_pairs(pairs)
