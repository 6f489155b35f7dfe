"""Which events of an erased tenant are left unapplied (pure)."""

from __future__ import annotations

from memory.tenants import Erasure


def test_an_erased_tenants_events_are_refused_and_after_a_new_start_only_those_from_before() -> None:
    erased = Erasure(at=1000.0, restored=False)
    assert erased.refuses(999_000) and erased.refuses(2_000_000) and erased.refuses(None)
    anew = Erasure(at=1000.0, restored=True)
    assert anew.refuses(999_999) and anew.refuses(1_000_000) and anew.refuses(None)
    assert not anew.refuses(1_000_001)
