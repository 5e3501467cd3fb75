"""Places for isolated server processes (upstream/processes.py), alone: the overall bound
and each principal's share; a newcomer waits its turn within `process_wait_ms`, then is
refused naming the bound it met; a place given back lets the next one in; a cancelled
wait leaves nothing held."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import TooManyProcesses
from gateway.upstream.processes import Bounds, Processes


def places(overall: int = 3, per: int | None = 2) -> Processes:
    return Processes(Bounds(overall, per, wait_s=0.2, idle_s=60))


async def test_a_principal_over_its_share_waits_then_is_refused_others_are_not() -> None:
    processes = places()
    held = [await processes.take("main", "alice") for _ in range(2)]
    with pytest.raises(TooManyProcesses) as refused:
        await processes.take("main", "alice")
    assert refused.value.data["bound"] == "max_processes_per_principal"
    bob = await processes.take("main", "bob")  # his share is his own
    assert processes.status()["running"] == 3
    for ticket in [*held, bob]:
        ticket.release()
    assert processes.status()["running"] == 0


async def test_the_overall_bound_and_a_place_given_back_in_time() -> None:
    processes = places(overall=2, per=None)  # no auth: no shares, one bound
    first = await processes.take("main", "anonymous")
    second = await processes.take("main", "anonymous")
    waiting = asyncio.ensure_future(processes.take("main", "anonymous"))
    await asyncio.sleep(0.05)
    assert processes.status()["waiting"] == 1
    first.release()  # within the wait: the newcomer gets it
    third = await waiting
    with pytest.raises(TooManyProcesses) as refused:
        await processes.take("main", "anonymous")
    assert refused.value.data["bound"] == "max_processes"
    for ticket in (second, third):
        ticket.release()
    assert processes.status() == {"max_processes": 2, "max_processes_per_principal": None,
                                  "running": 0, "waiting": 0}


async def test_a_cancelled_wait_holds_nothing() -> None:
    processes = places(overall=1, per=None)
    held = await processes.take("main", "alice")
    waiting = asyncio.ensure_future(processes.take("main", "bob"))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    held.release()
    assert processes.status()["running"] == processes.status()["waiting"] == 0
    again = await processes.take("main", "bob")  # the place is free, not owed to the gone
    again.release()
