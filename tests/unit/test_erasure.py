"""Which events of an erased tenant are left unapplied (pure)."""

from __future__ import annotations

from memory.tenants import Erasure


def test_an_erased_tenants_events_are_refused_and_after_a_new_start_only_those_from_before() -> None:
    erased = Erasure(at=1000.0, restored=False)
    assert erased.refuses(999_000) and erased.refuses(2_000_000) and erased.refuses(None)
    anew = Erasure(at=1000.0, restored=True)
    assert anew.refuses(999_999) and anew.refuses(1_000_000) and anew.refuses(None)
    assert not anew.refuses(1_000_001)


def test_events_written_while_a_tenant_was_erased_stay_refused_once_it_is_restored() -> None:
    """A write between the erasure and the tenant's topics created again was acked
    ``tenant_erased``, lost: a reindex (or a daemon behind) applied it anyway."""
    lifted = Erasure(at=1000.0, restored=True, restored_at=2000.0)
    assert lifted.refuses(1_500_000) and lifted.refuses(2_000_000) and lifted.refuses(999_000)
    assert not lifted.refuses(2_000_001)
    assert Erasure.from_json('{"at": 1000.0, "restored": true, "restored_at": 2000.0}') == lifted
    assert Erasure.from_json('{"at": 1000.0, "restored": true}').restored_at is None  # an older release's
