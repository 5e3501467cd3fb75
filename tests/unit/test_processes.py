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


async def test_a_stop_cancelled_while_it_waits_still_ends_the_process() -> None:
    """The stdio shutdown (stdin closed, a grace, SIGTERM, SIGKILL) cancelled in its wait
    (the gateway stopping while a process is being closed: an era probe's, say) still
    kills the process and closes its transport: none outlives the gateway (before: its
    transport was left unclosed, and a process that ignored the close ran on)."""
    import os
    from pathlib import Path

    import structlog
    from mcp_http import BASIC

    from gateway.settings.load import from_mapping
    from gateway.upstream import isolation

    # A server that outlives its stdin's close and ignores SIGTERM (its shell sleeps on).
    stubborn = f'trap "" TERM; "{BASIC[0]}" "{BASIC[1]}"; sleep 30'
    conf = from_mapping({"upstreams": {"main": {"command": "sh", "args": ["-c", stubborn],
                                                "era": "legacy",
                                                "shutdown_grace_ms": 5000}}})
    backend = isolation.build("main", conf.upstreams["main"], 1 << 20)
    with structlog.testing.capture_logs() as events:
        await backend.start()
        await backend.primary.wait_ready()
    pid = next(e["pid"] for e in events if e["event"] == "upstream.spawned")
    closing = asyncio.ensure_future(backend.primary.close())
    await asyncio.sleep(0.3)  # in the grace
    closing.cancel()
    await asyncio.gather(closing, return_exceptions=True)

    def running() -> bool:
        stat = Path(f"/proc/{pid}/stat")
        return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    for _ in range(40):
        if not running():
            break
        await asyncio.sleep(0.05)
    assert not running()
    assert os.path.exists("/proc/self")  # /proc is there: the check above means something
