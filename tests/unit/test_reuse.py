"""Vector keys and the lookup reply's shapes (pure)."""

from __future__ import annotations

from memory.index.reuse import _first_hit, vector_key


def test_a_vector_key_names_the_model_and_the_exact_text() -> None:
    base = vector_key("minilm|fp32|384", "Raise lock_timeout to 30s.")
    assert base == vector_key("minilm|fp32|384", "Raise lock_timeout to 30s.")
    assert base != vector_key("minilm|bf16|384", "Raise lock_timeout to 30s.")
    assert base != vector_key("minilm|fp32|384", "Raise lock_timeout to 30s")
    assert len(base) == 32 and base.isalnum()  # a TAG value that needs no escaping


def test_the_first_hit_is_read_from_resp3_and_resp2_replies() -> None:
    resp3 = {b"total_results": 1, b"results": [{b"id": b"k", b"extra_attributes": {b"vector": b"v", b"tenant": b"t"}}]}
    resp2 = [1, b"k", [b"vector", b"v", b"tenant", b"t"]]
    assert _first_hit(resp3) == _first_hit(resp2) == {b"vector": b"v", b"tenant": b"t"}
    assert _first_hit({b"total_results": 0, b"results": []}) == {} == _first_hit([0])
