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
