"""What a call holds and gives back once (gateway/downstream/leases.py), with fakes of the
backend and the upstream call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway import errors
from gateway.downstream.leases import Leases
from gateway.observability.counters import Counters
from gateway.queues import Limit, Queues
from gateway.ratelimit import InFlight
from gateway.tasks.policy import Policy

LIMIT = Limit("main", "*", 1, 4, server=True)


class FakeBackend:
    """Hands out a process per call and counts the ones given back (as PerCall does)."""

    name = "main"

    def __init__(self) -> None:
        self.queues = Queues()
        self.taken: list[object] = []
        self.given_back: list[object] = []

    async def for_request(self, conn: Any, owner: Any, method: str) -> object:
        self.taken.append(proc := object())
        return proc

    def ticket(self, owner: str, tool_limit: Any) -> Any:
        return self.queues.ticket(owner, tool_limit, LIMIT)

    def done(self, conn: Any, used: Any) -> None:
        self.given_back.append(used)


class FakeCall:
    def __init__(self) -> None:
        self.client_id = 7
        self.conn = self
        self.cancelled: list[str] = []
        self.answers: list[dict[str, Any]] = []

    def cancel(self, call: Any, why: str) -> None:
        self.cancelled.append(why)

    def answer(self, msg: dict[str, Any]) -> None:
        self.answers.append(msg)


def unlimited(_tool: str) -> Policy:
    return Policy("auto", 1000, 60_000, 60_000, 1000, None)


def leases(per_owner: int = 2) -> Leases:
    return Leases(InFlight(per_owner, Counters()))


async def test_everything_taken_goes_back_once_whoever_releases() -> None:
    backend, held = FakeBackend(), leases()
    lease = held.take("alice", "tools/call")
    await lease.connect(backend, object(), object(), "tools/call")  # type: ignore[arg-type]
    ticket = lease.queue({"method": "tools/call", "params": {"name": "x"}}, unlimited)
    assert ticket is not None and not ticket.queued
    lease.release()
    lease.release()  # the exchange's done, then a cancel: still once
    assert backend.given_back == backend.taken and len(backend.given_back) == 1
    assert held.status() == {"in_flight": 0, "queued": 0, "stopping": False}
    assert held.inflight._calls == {}
    assert backend.queues.lanes[("main", "*", True)].running == 0


async def test_a_refusal_inside_the_block_gives_back_what_was_taken() -> None:
    backend, held = FakeBackend(), leases()

    async def refused() -> None:
        with held.take("alice", "tools/call") as lease:
            await lease.connect(backend, object(), object(), "tools/call")  # type: ignore[arg-type]
            raise errors.QueueFull("full")
    with pytest.raises(errors.QueueFull):
        await refused()
    assert len(backend.given_back) == 1 and not held.live


async def test_a_return_before_the_hand_over_gives_back_and_after_it_does_not() -> None:
    held = leases()
    with held.take("alice", "tools/list"):
        pass  # refused and answered without raising
    assert not held.live
    with held.take("alice", "tools/call") as lease:
        done = lease.hand(FakeCall())  # type: ignore[arg-type]
    assert len(held.live) == 1  # the exchange's or task's now
    done()
    assert not held.live


async def test_cancelled_while_it_waits_for_a_process_the_slot_goes() -> None:
    held, started = leases(), asyncio.Event()

    class Slow(FakeBackend):
        async def for_request(self, conn: Any, owner: Any, method: str) -> object:
            started.set()
            await asyncio.Event().wait()
            raise AssertionError

    async def call() -> None:
        with held.take("alice", "tools/call") as lease:
            await lease.connect(Slow(), object(), object(), "tools/call")  # type: ignore[arg-type]

    job = asyncio.ensure_future(call())
    await started.wait()
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert not held.live and held.inflight._calls == {}


def test_the_principals_slots_bound_its_calls_not_anothers() -> None:
    held = leases(per_owner=1)
    held.take("alice", "tools/call")
    with pytest.raises(errors.TooManyRequests):
        held.take("alice", "tools/call")
    held.take("bob", "tools/call")  # Bob's share is his own
    assert len(held.live) == 2


async def test_stopping_refuses_new_calls_and_queued_ones_and_waits_for_the_rest() -> None:
    backend, held = FakeBackend(), leases()
    running = held.take("alice", "tools/call")
    await running.connect(backend, object(), object(), "tools/call")  # type: ignore[arg-type]
    running.queue({"method": "tools/call", "params": {"name": "x"}}, unlimited)
    waiting = held.take("bob", "tools/call")
    await waiting.connect(backend, object(), object(), "tools/call")  # type: ignore[arg-type]
    ticket = waiting.queue({"method": "tools/call", "params": {"name": "x"}}, unlimited)
    assert ticket is not None and ticket.queued
    waiting.hand(call := FakeCall())  # type: ignore[arg-type]
    assert held.stop() == 1
    assert call.cancelled == ["the gateway is stopping"]
    assert call.answers[0]["error"]["data"]["reason"] == "shutdown"
    with pytest.raises(errors.GatewayStopping):
        held.take("carol", "tools/call")
    held.take("carol", "tools/list").release()  # other requests still pass
    waiting.release()  # its exchange's done, once answered
    assert await held.idle(0.01) == 1  # the running call holds the drain
    asyncio.get_running_loop().call_later(0.05, running.release)
    assert await held.idle(5) == 0


async def test_a_call_that_waited_for_its_process_through_the_drains_start_is_not_sent(
        ) -> None:
    """Found by review: a tools/call waiting for a process when the drain began reached the
    server afterwards; its queue place is where it is refused now, holding nothing."""
    backend, held = FakeBackend(), leases()

    async def call() -> None:
        with held.take("bob", "tools/call") as lease:
            await lease.connect(backend, object(), object(), "tools/call")  # type: ignore[arg-type]
            held.stop()  # the signal, while it waited
            lease.queue({"method": "tools/call", "params": {"name": "x"}}, unlimited)
    with pytest.raises(errors.GatewayStopping):
        await call()
    assert not held.live and backend.given_back == backend.taken


async def test_a_lease_asked_for_its_process_twice_holds_one() -> None:
    """Review: a modern call that was to be a task at once connects in the task's attach;
    when no task can be made after that (the store failing as the task is forgotten), it is
    answered inline and connects again: a second process the release would not give back."""
    backend, held = FakeBackend(), leases()
    with held.take("bob", "tools/call") as lease:
        first = await lease.connect(backend, object(), object(), "tools/call")  # type: ignore[arg-type]
        lease.queue({"method": "tools/call", "params": {"name": "x"}}, unlimited)
        again = await lease.connect(backend, object(), object(), "tools/call")  # type: ignore[arg-type]
        lease.queue({"method": "tools/call", "params": {"name": "x"}}, unlimited)
    assert again is first and backend.taken == backend.given_back == [first]
    assert backend.queues.lanes[("main", "*", True)].running == 0
