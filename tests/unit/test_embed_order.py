"""memory.embed_order (EmbedOrder): one holder at a time, the foreground's waiters first, each in order, and a
waiter cancelled before or after it was given the turn never leaves the turn held."""

from __future__ import annotations

import asyncio

from memory.embed_order import EmbedOrder, background, in_background


async def turns_taken(turns: EmbedOrder, first_back: bool, waiters: list[tuple[str, bool]]) -> list[str]:
    """The order in which ``waiters`` (name, background), queued behind a first holder, take the turn."""
    order: list[str] = []
    release = asyncio.Event()

    async def hold(name: str, back: bool) -> None:
        async with turns.turn(background=back):
            order.append(name)
            if name == "first":
                await release.wait()

    first = asyncio.create_task(hold("first", first_back))
    await asyncio.sleep(0)
    tasks = [asyncio.create_task(hold(n, b)) for n, b in waiters]
    await asyncio.sleep(0)
    assert turns.waiting == len(waiters)
    release.set()
    await asyncio.gather(first, *tasks)
    return order


async def test_the_foreground_goes_before_the_background_each_in_order() -> None:
    turns = EmbedOrder()
    order = await turns_taken(turns, True, [("b1", True), ("f1", False), ("b2", True), ("f2", False)])
    assert order == ["first", "f1", "f2", "b1", "b2"]
    assert turns.waiting == 0
    async with turns.turn():  # free again: taken at once
        pass


async def test_a_cancelled_waiter_leaves_the_turn_free() -> None:
    turns = EmbedOrder()
    release = asyncio.Event()

    async def hold() -> None:
        async with turns.turn():
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiter.cancel()  # before its turn
    await asyncio.sleep(0)
    assert turns.waiting == 0
    release.set()
    await holder
    await asyncio.wait_for(asyncio.create_task(hold()), 1)

    # Given the turn and cancelled in the same step: the turn goes on to the next.
    release.clear()
    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    given = asyncio.create_task(hold())
    after = asyncio.create_task(hold())
    await asyncio.sleep(0)
    release.set()
    await holder  # passes the turn to ``given``'s future
    given.cancel()
    await asyncio.gather(given, return_exceptions=True)
    await asyncio.wait_for(after, 1)


async def test_background_is_the_context_of_the_block_and_its_tasks() -> None:
    assert not background()
    with in_background():
        assert background()
        assert await asyncio.create_task(_is_background())
    assert not background()
    assert not await asyncio.create_task(_is_background())


async def _is_background() -> bool:
    return background()


async def test_the_background_gets_a_turn_after_a_run_of_foreground_ones() -> None:
    """A steady stream of small writes slows a lane down, never stops it."""
    waiters = [("b1", True), *((f"f{i}", False) for i in range(1, 7))]
    order = await turns_taken(EmbedOrder(), False, waiters)
    assert order == ["first", "f1", "f2", "f3", "f4", "b1", "f5", "f6"]
