"""Community detection in its own process (graph.compute): same results, crashes, shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import psutil
import pytest

from graph.communities import assign_ids, detect
from graph.compute import CommunityComputer
from graph.errors import ComputeCrashed
from tests.helpers import eventually, run_python

pytestmark = pytest.mark.integration


def _graph() -> tuple[list[str], list[tuple[str, str, float]]]:
    groups = [[f"{g}{i}" for i in range(6)] for g in "abc"]
    edges = [(m[i], m[j], 2.0) for m in groups for i in range(6) for j in range(i + 1, 6)]
    edges += [("a0", "b0", 1.0), ("b0", "c0", 1.0)]
    return sorted({n for e in edges for n in e[:2]}), edges


@pytest.fixture(scope="module")
async def computer():
    comp = CommunityComputer()
    await comp.start()
    yield comp
    comp.close()


async def test_detection_runs_in_its_own_process_with_the_same_result(computer: CommunityComputer) -> None:
    """Leiden and id matching run in the worker process, not in the daemon's, and give exactly
    what they give in-process (same graph, same seed)."""
    child = await computer(os.getpid)
    assert child != os.getpid() and computer.pids() == [child]
    nodes, edges = _graph()
    raw = await computer(detect, nodes, edges, seed=7, max_size=10)
    assert raw == detect(nodes, edges, seed=7, max_size=10) and len(raw) == 3
    first = assign_ids(raw, [])
    again = await computer(assign_ids, raw, first.communities, threshold=0.3)
    assert again.communities == assign_ids(raw, first.communities).communities == first.communities


async def test_the_worker_runs_leiden_without_loading_torch(computer: CommunityComputer) -> None:
    """cdlib imports torch for algorithms Leiden never uses: the worker refuses it, so no torch
    library is mapped into it (a third of its memory), and detection works as in-process."""
    (pid,) = computer.pids()
    maps = [m.path for m in psutil.Process(pid).memory_maps()]
    assert any("igraph" in p for p in maps), maps  # the check sees the libraries it loaded
    assert not any("libtorch" in p for p in maps), [p for p in maps if "torch" in p]
    nodes, edges = _graph()
    assert await computer(detect, nodes, edges, seed=3, max_size=10) == detect(nodes, edges, seed=3, max_size=10)


async def test_a_killed_compute_process_fails_one_call_and_is_replaced(computer: CommunityComputer) -> None:
    """A worker killed under a detection (out of memory, an operator) fails that call with a
    retryable error; the next call gets a new worker."""
    old = await computer(os.getpid)
    call = asyncio.ensure_future(computer(time.sleep, 30))
    await asyncio.sleep(0.3)
    os.kill(old, signal.SIGKILL)
    with pytest.raises(ComputeCrashed) as info:
        await asyncio.wait_for(call, 30)
    assert info.value.retryable
    new = await computer(os.getpid)
    assert new != old
    nodes, edges = _graph()
    assert await computer(detect, nodes, edges, seed=7) == detect(nodes, edges, seed=7)


async def test_close_kills_a_detection_in_progress() -> None:
    """Stopping the daemon never waits for a long Leiden run: the worker is killed."""
    comp = CommunityComputer()
    pid = await comp(os.getpid)
    call = asyncio.ensure_future(comp(time.sleep, 60))
    await asyncio.sleep(0.3)
    comp.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(ComputeCrashed):
        await asyncio.wait_for(call, 30)
    with pytest.raises(ComputeCrashed):  # closed for good
        await comp(os.getpid)


_START_AND_DIE = """
import asyncio, os, signal, sys
from graph.compute import CommunityComputer

async def main() -> None:
    comp = CommunityComputer()
    await comp.start()
    print(await comp(os.getpid), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the daemon killed: no close()

if __name__ == "__main__":
    asyncio.run(main())
"""


async def test_the_worker_exits_when_its_daemon_is_killed(tmp_path: Any) -> None:
    """A pool worker outlives a killed parent (it waits on its queue for good, ~450 MB): the
    suite's kill -9'ed daemons left theirs behind. It now exits once orphaned."""
    code, out, _ = await run_python(tmp_path, "start_and_die.py", _START_AND_DIE, timeout=120)
    assert code == -signal.SIGKILL
    worker = int(out.split()[-1])

    async def gone() -> bool:
        return not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE

    try:
        await eventually(gone, timeout=20, what="the orphaned compute worker exited")
    finally:
        if psutil.pid_exists(worker):
            os.kill(worker, signal.SIGKILL)
