"""Settling futures that several parties may race to settle (pure)."""

from __future__ import annotations

import asyncio
from typing import TypeVar

T = TypeVar("T")


def settle(fut: asyncio.Future[T], outcome: T | BaseException) -> None:
    """Give ``fut`` its result, or raise ``outcome`` in its waiter if it is an exception.

    A future already done (its waiter cancelled, or answered by another path) is left as it
    is: setting it again would raise ``InvalidStateError`` in the code that answers the rest.
    """
    if fut.done():
        return
    if isinstance(outcome, BaseException):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)
