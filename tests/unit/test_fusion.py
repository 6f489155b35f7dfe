"""Weighted RRF: the formula, ranks, weights, ties and edge cases."""

from __future__ import annotations

import pytest

from memory.config import RetrievalConfig
from memory.fusion import Fused, boost_recent, freshness, fuse_rrf, per_doc_first, recency_ranks
from memory.retrieval import Retriever


@pytest.mark.parametrize(
    ("legs", "weights", "k", "expected"),
    [
        # one leg: 1/(k+rank)
        ({"dense": ["a", "b"]}, {}, 60, [("a", 1 / 61), ("b", 1 / 62)]),
        # both legs agree: sums
        ({"dense": ["a"], "sparse": ["a"]}, {}, 60, [("a", 2 / 61)]),
        # weights scale each leg
        (
            {"dense": ["a", "b"], "sparse": ["b", "a"]},
            {"dense": 0.6, "sparse": 0.4},
            60,
            [("a", 0.6 / 61 + 0.4 / 62), ("b", 0.6 / 62 + 0.4 / 61)],
        ),
        # k = 0 is allowed: 1/rank
        ({"sparse": ["x", "y"]}, {}, 0, [("x", 1.0), ("y", 0.5)]),
        # zero weight reports ranks but adds nothing
        ({"dense": ["a"], "sparse": ["b"]}, {"dense": 0.0}, 60, [("b", 1 / 61), ("a", 0.0)]),
        # empty legs
        ({"dense": [], "sparse": []}, {}, 60, []),
    ],
)
def test_scores_follow_the_weighted_rrf_formula(legs, weights, k, expected) -> None:
    """score = sum of w_leg / (k + rank_leg), ranks 1-based, best first."""
    fused = fuse_rrf(legs, weights, k=k)
    assert [f.id for f in fused] == [e[0] for e in expected]
    for f, (_, score) in zip(fused, expected, strict=True):
        assert f.score == pytest.approx(score)


def test_ranks_are_reported_per_leg() -> None:
    """Each hit carries its 1-based rank in every leg that found it."""
    fused = {f.id: f for f in fuse_rrf({"dense": ["a", "b"], "sparse": ["c", "a"]}, {})}
    assert fused["a"].ranks == {"dense": 1, "sparse": 2}
    assert fused["c"].ranks == {"sparse": 1}


def test_ties_break_on_id() -> None:
    """Equal scores are ordered by id so results are stable run to run."""
    fused = fuse_rrf({"dense": ["b"], "sparse": ["a"]}, {})
    assert [f.id for f in fused] == ["a", "b"]


def test_duplicate_in_one_leg_keeps_best_rank() -> None:
    """An id repeated inside a leg counts once, at its first rank."""
    (hit,) = fuse_rrf({"dense": ["a", "a"]}, {})
    assert hit.ranks == {"dense": 1}
    assert hit.score == pytest.approx(1 / 61)


@pytest.mark.parametrize(("weights", "k"), [({"dense": -1.0}, 60), ({}, -1)])
def test_rejects_negative_weights_and_k(weights, k) -> None:
    """Negative weights or k are programming errors."""
    with pytest.raises(ValueError):
        fuse_rrf({"dense": ["a"]}, weights, k=k)


def test_a_leg_given_as_ranks_can_tie() -> None:
    """A leg given as id -> rank scores tied ids alike and reports those ranks."""
    fused = {f.id: f for f in fuse_rrf({"sparse": ["b", "a"], "identifier": {"a": 1, "b": 1, "c": 3}}, {})}
    assert fused["a"].ranks == {"sparse": 2, "identifier": 1}
    assert fused["b"].score == pytest.approx(1 / 61 + 1 / 61)
    assert fused["a"].score == pytest.approx(1 / 62 + 1 / 61)
    assert fused["c"].score == pytest.approx(1 / 63)


def test_rejects_ranks_below_one() -> None:
    """An explicit rank must be 1-based."""
    with pytest.raises(ValueError):
        fuse_rrf({"identifier": {"a": 0}}, {})


@pytest.mark.parametrize(
    ("hits", "ranks"),
    [
        ([("old", 1.0), ("new", 3.0), ("mid", 2.0)], {"new": 1, "mid": 2, "old": 3}),
        # equal times share a rank (competition ranking); no time ranks last
        ([("a", 5.0), ("b", 5.0), ("c", None), ("d", 1.0)], {"a": 1, "b": 1, "d": 3, "c": 4}),
        # a repeated id keeps its first entry
        ([("a", 1.0), ("a", 9.0), ("b", 2.0)], {"b": 1, "a": 2}),
        ([], {}),
    ],
)
def test_recency_ranks_newest_first(hits, ranks) -> None:
    """Recency ranks are by time, newest first."""
    assert recency_ranks(hits) == ranks


@pytest.mark.parametrize(
    ("hits", "fresh"),
    [
        ([("old", 0.0), ("mid", 25.0), ("new", 100.0)], {"old": 0.0, "mid": 0.25, "new": 1.0}),
        # one time for all: each is the newest
        ([("a", 7.0), ("b", 7.0)], {"a": 1.0, "b": 1.0}),
        # no time is the oldest
        ([("a", 7.0), ("b", None)], {"a": 1.0, "b": 0.0}),
        ([("a", None)], {"a": 0.0}),
        # a repeated id keeps its first entry
        ([("a", 0.0), ("a", 9.0), ("b", 10.0)], {"a": 0.0, "b": 1.0}),
        ([], {}),
    ],
)
def test_freshness_places_each_hit_between_the_oldest_and_the_newest(hits, fresh) -> None:
    """Freshness is 0 for the oldest (or undated) hit, 1 for the newest, linear between."""
    assert freshness(hits) == pytest.approx(fresh)


def _fused(*scored: tuple[str, float]) -> list[Fused]:
    return [Fused(id=i, score=s, ranks={"dense": n}) for n, (i, s) in enumerate(scored, start=1)]


@pytest.mark.parametrize(
    ("scored", "times", "weight", "top_k", "order"),
    [
        # weight 0: as fused, no recency rank
        ([("old", 0.18), ("new", 0.17)], {"old": 1.0, "new": 2.0}, 0.0, 10, ["old", "new"]),
        # an update that matches almost as well passes the old fact
        ([("old", 0.18), ("new", 0.17)], {"old": 1.0, "new": 2.0}, 0.5, 10, ["new", "old"]),
        # a weak match (a third as good) stays below at weight 1, passes at 3
        ([("fact", 0.18), ("chat", 0.06)], {"fact": 1.0, "chat": 9.0}, 1.0, 10, ["fact", "chat"]),
        ([("fact", 0.18), ("chat", 0.06)], {"fact": 1.0, "chat": 9.0}, 3.0, 10, ["chat", "fact"]),
        # of two about as new, the better match stays first however heavy the weight
        (
            [("old", 0.18), ("update", 0.05), ("chat", 0.03)],
            {"old": 0.0, "update": 99.0, "chat": 100.0},
            1000.0,
            10,
            ["update", "chat", "old"],
        ),
        # only the first top_k are reordered; the rest follow unchanged
        ([("a", 0.3), ("b", 0.2), ("c", 0.1)], {"a": 1.0, "b": 2.0, "c": 3.0}, 5.0, 2, ["b", "a", "c"]),
    ],
)
def test_boost_recent_lifts_newer_hits_by_a_multiple_of_how_well_they_match(
    scored, times, weight, top_k, order
) -> None:
    """Recency multiplies each of the first top_k scores by 1 + weight x freshness."""
    out = boost_recent(_fused(*scored), times, weight, top_k)
    assert [f.id for f in out] == order
    head = {f.id for f in _fused(*scored)[:top_k]}
    for f in out:
        assert ("recency" in f.ranks) == (weight > 0 and f.id in head)


def test_boost_recent_refuses_a_negative_weight() -> None:
    """A negative recency weight is a caller's bug, not an order."""
    with pytest.raises(ValueError, match="recency weight"):
        boost_recent(_fused(("a", 1.0)), {"a": 1.0}, -1.0, 10)


def test_per_id_weights_replace_the_query_weights_for_those_ids() -> None:
    """An id with its own leg weights (a transcript turn) is scored with them; the others with the query's."""
    legs = {"dense": ["doc", "turn"], "sparse": ["turn", "doc"]}
    fused = fuse_rrf(legs, {"dense": 1.0, "sparse": 1.0}, k=0, weights_of={"turn": {"dense": 0.5, "sparse": 1.5}})
    scores = {f.id: f.score for f in fused}
    assert scores["doc"] == pytest.approx(1.0 / 1 + 1.0 / 2)
    assert scores["turn"] == pytest.approx(0.5 / 2 + 1.5 / 1)


def test_per_id_weights_are_checked_too() -> None:
    """A negative per-id weight is refused like a negative query weight."""
    with pytest.raises(ValueError):
        fuse_rrf({"dense": ["a"]}, {"dense": 1.0}, weights_of={"a": {"dense": -1.0}})


@pytest.mark.parametrize(
    ("cfg", "top_k", "fetched"),
    [
        ({}, 1, 30),  # a shallow request still fuses 30 candidates a leg
        ({}, 15, 30),
        ({}, 16, 32),  # past the floor: 2 x top_k
        ({}, 100, 200),
        ({"min_candidates": 0}, 5, 10),
        ({"min_candidates": 0, "fetch_multiplier": 1.0}, 5, 5),
    ],
)
def test_legs_fetch_at_least_the_candidate_floor(cfg: dict[str, float], top_k: int, fetched: int) -> None:
    retriever = Retriever(index=None, embedder=None, cfg=RetrievalConfig(**cfg))  # type: ignore[arg-type]
    assert retriever.fetch_k(top_k) == fetched


def test_a_similarity_floor_is_a_cosine_distance_reach() -> None:
    """min_similarity s keeps vector candidates within cosine distance 1 - s; the request's
    floor wins over the configured one, and neither means no floor."""
    from memory.config import RetrievalConfig
    from memory.search_spec import SearchSpec, max_vector_distance

    assert max_vector_distance(SearchSpec(text="x", top_k=1, min_similarity=0.8), RetrievalConfig()) == pytest.approx(
        0.2
    )
    configured = RetrievalConfig(min_similarity=0.25)
    assert max_vector_distance(SearchSpec(text="x", top_k=1), configured) == pytest.approx(0.75)
    assert max_vector_distance(SearchSpec(text="x", top_k=1, min_similarity=-1.0), configured) == pytest.approx(2.0)
    assert max_vector_distance(SearchSpec(text="x", top_k=1), RetrievalConfig()) is None


def _doc(hit_id: str) -> str:
    return hit_id.split("#")[0]


@pytest.mark.parametrize(
    ("ids", "limit", "want"),
    [
        # A long doc's third chunk and on wait for the other docs' hits.
        (["big#1", "big#2", "big#3", "a#1", "big#4", "b#1"], 2, ["big#1", "big#2", "a#1", "b#1", "big#3", "big#4"]),
        # Nothing else found: the doc's further chunks fill the results all the same.
        (["big#1", "big#2", "big#3"], 1, ["big#1", "big#2", "big#3"]),
        # Over the whole list: a result dropped or folded is replaced by another doc's hit.
        (["a#1", "a#2", "b#1", "c#1", "a#3", "d#1"], 1, ["a#1", "b#1", "c#1", "d#1", "a#2", "a#3"]),
        # 0: no limit.
        (["big#1", "big#2", "a#1"], 0, ["big#1", "big#2", "a#1"]),
    ],
)
def test_per_doc_first_keeps_one_documents_hits_to_its_limit(ids: list[str], limit: int, want: list[str]) -> None:
    """The order does not depend on the depth asked for: a shallow request's results are the
    head of a deeper one's."""
    fused = [Fused(id=i, score=1.0 / (n + 1)) for n, i in enumerate(ids)]
    out = per_doc_first(fused, _doc, limit)
    assert [f.id for f in out] == want
    assert sorted(f.id for f in out) == sorted(ids)  # nothing lost, nothing twice


@pytest.mark.parametrize(
    ("text", "dense"),
    [
        ("SUBT-4410", 0.0),
        ('"INC-4411", ERR_CONN_RESET_4F2A', 0.0),
        ("a3f9c2e", 0.0),
        ("what is INC-4411?", 1.0),  # words besides the id: the vector leg reads them
        ("pgbouncer", 1.0),  # a name is a word
        ("PTEN JSON", 1.0),  # and so are words in capitals alone,
        ("PoolTimeoutError", 1.0),  # names with capitals inside,
        ("GPT-4 COVID-19 node.js", 1.0),  # and with a digit or two, or a dot
        ("Pierre Gerard-Marchant", 1.0),
        (" ".join(f"OPS-{i}" for i in range(9)), 1.0),  # a long list of ids says more than ids
        ("quokka-zebra-7731", 1.0),  # in lower case a document may hold it as words: no id of its index
    ],
)
def test_a_question_of_identifiers_alone_leaves_out_the_vector_leg(text: str, dense: float) -> None:
    """The model reads no meaning in an opaque id; a request that sets dense_weight has it."""
    from memory.search_spec import SearchSpec, leg_weights

    assert leg_weights(SearchSpec(text=text, top_k=5), RetrievalConfig())[0]["dense"] == dense
    assert leg_weights(SearchSpec(text=text, top_k=5, dense_weight=0.5), RetrievalConfig())[0]["dense"] == 0.5
    # The vector leg asked for alone (the others weighed 0) runs, whatever the text.
    alone = SearchSpec(text=text, top_k=5, sparse_weight=0.0, identifier_weight=0.0)
    assert leg_weights(alone, RetrievalConfig())[0]["dense"] == 1.0
