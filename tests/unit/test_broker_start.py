"""A start-up whose consumers never join their groups ends with a reason, not a hang."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import daemon.broker as broker_mod
from memory.errors import BackendUnavailable


async def test_a_group_join_that_never_ends_fails_start_up_with_its_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``start_broker`` gives up after its timeout and names the likely cause and both fixes."""

    async def never_joins(_broker: Any) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(broker_mod, "_start_together", never_joins)
    with pytest.raises(BackendUnavailable) as caught:
        await broker_mod.start_broker(object(), timeout_s=0.05)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "did not join their groups" in message
    assert "restart it" in message and "AGENTMEM_CONSUMER__GROUP_ID" in message


async def test_the_commit_before_a_rejoin_is_given_up_in_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiokafka retries that commit without end on a retryable error, and "unknown topic" (a
    tenant's topic deleted under the daemon) is one: bounded, it fails as a commit failure,
    which aiokafka logs before it rejoins the group."""
    from aiokafka.consumer.group_coordinator import GroupCoordinator
    from aiokafka.errors import CommitFailedError, KafkaError

    async def retries_for_ever(_self: Any, _assignment: Any) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(GroupCoordinator, "_maybe_do_last_autocommit", retries_for_ever)
    monkeypatch.setattr(broker_mod, "LAST_COMMIT_S", 0.05)
    broker_mod.bound_last_commit()
    broker_mod.bound_last_commit()  # once: a second call does not wrap the wrapper
    bounded = GroupCoordinator._maybe_do_last_autocommit
    assert getattr(bounded, "bounded", False) and bounded is not retries_for_ever
    with pytest.raises(CommitFailedError) as caught:
        await bounded(object(), object())  # type: ignore[arg-type]
    assert isinstance(caught.value, KafkaError)  # what _on_join_prepare catches, logs and rejoins after
