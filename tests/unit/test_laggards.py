"""Timers armed late (gateway/laggards.py): a call answered within a tick arms
none; one still waiting arms its request timeout and keep-alive switch, which fire after
their deadlines, as before."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import structlog

from gateway.downstream import sse
from gateway.downstream.exchange import Exchange, Life
from gateway.laggards import LAZY_MIN_S, TICK_S, Laggards
from gateway.protocol import jsonrpc


class Conn:
    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def cancel(self, call: Any, why: str) -> None:
        self.cancelled.append(why)


class Call:
    ticket = None  # runs at once: no queue
    progress_token = None

    def __init__(self) -> None:
        self.conn = Conn()


def exchange() -> tuple[Exchange, Call, list[int]]:
    ex = Exchange(7, True, lambda: sse.Stream("0", 0), {}, None)
    call, released = Call(), []
    ex.sent(call, lambda: released.append(1))  # type: ignore[arg-type]
    return ex, call, released


class Told:
    def __init__(self) -> None:
        self.times = 0

    def late(self) -> None:
        self.times += 1


async def test_only_what_waits_a_whole_tick_is_told_late_once_and_the_tick_stops() -> None:
    late, quick, slow = Laggards(), Told(), Told()
    late.watch(slow)
    late.watch(quick).discard(quick)  # over before the tick
    await asyncio.sleep(TICK_S * 3)
    assert (quick.times, slow.times) == (0, 1)
    assert not late.young and not late.old and late._handle is None


async def test_a_call_answered_within_a_tick_arms_no_timer() -> None:
    late = Laggards()
    ex, call, released = exchange()
    ex.time_out(600, "main", late)
    ex.on_response(jsonrpc.result(1, {}))
    await asyncio.sleep(TICK_S * 3)
    assert ex.timer is None and released == [1] and call.conn.cancelled == []
    assert not late.young and not late.old


async def test_a_late_call_is_timed_out_after_its_deadline_not_before() -> None:
    late, loop = Laggards(), asyncio.get_running_loop()
    ex, call, _ = exchange()
    ended: list[float] = []
    ex.done = lambda: ended.append(loop.time())  # when the call's lease went back
    seconds = LAZY_MIN_S * 2
    started = loop.time()
    ex.time_out(seconds, "main", late)
    await asyncio.sleep(seconds * 0.8)
    assert ex.life is Life.FORWARDING and ex.timer is not None  # armed, not yet due
    await asyncio.sleep(seconds * 0.2 + TICK_S * 2)
    assert ex.life is Life.ANSWERED and ended and ended[0] - started >= seconds
    assert call.conn.cancelled == ["timed out at the gateway"]
    assert ex.response is not None and b"did not answer within 0.2 s" in ex.response


async def test_a_timeout_too_short_to_defer_is_armed_at_once() -> None:
    ex, _, _ = exchange()
    ex.time_out(LAZY_MIN_S / 2, "main", Laggards())
    assert ex.timer is not None


async def test_a_slow_answer_turns_to_sse_after_the_keep_alive_not_before() -> None:
    loop = asyncio.get_running_loop()
    flow = sse.Flow(keepalive_s=LAZY_MIN_S * 2, slow_s=1)
    ex, _, _ = exchange()
    started = loop.time()
    waiting = asyncio.ensure_future(ex._wait(flow.keepalive_s, flow.late))
    await asyncio.sleep(flow.keepalive_s * 0.8)
    assert not waiting.done()
    await waiting
    assert loop.time() - started >= flow.keepalive_s
    assert ex._wake is not None and ex._wake.result() is False  # the time was up: no news


async def test_a_late_timer_runs_in_its_requests_context_not_the_ticks() -> None:
    """The request's context carries its metrics marker and its log and trace context: a
    call that becomes a task is counted by its task (metrics.py `task_created`)."""
    whose: contextvars.ContextVar[str] = contextvars.ContextVar("whose", default="nobody")
    late, seen = Laggards(), []
    contextvars.Context().run(late.watch, Told())  # the tick is armed in another context

    def alices() -> Exchange:
        whose.set("alice")
        ex, _, _ = exchange()
        ex.done = lambda: seen.append(whose.get())
        ex.time_out(LAZY_MIN_S, "main", late)
        return ex

    ex = contextvars.copy_context().run(alices)
    await asyncio.sleep(LAZY_MIN_S + TICK_S * 3)
    assert ex.life is Life.ANSWERED and seen == ["alice"]


class Raises:
    def late(self) -> None:
        raise RuntimeError("one exchange's late() failed")


async def test_one_late_that_raises_costs_the_others_nothing() -> None:
    """Each watched is told late whatever another's late() raises (the fault is logged,
    `timers.late_failed`): none is left with its timers unarmed."""
    late, others = Laggards(), [Told() for _ in range(200)]
    late.watch(Raises())
    for who in others:
        late.watch(who)
    with structlog.testing.capture_logs() as logs:
        await asyncio.sleep(TICK_S * 4)
    assert [e["event"] for e in logs] == ["timers.late_failed"]
    assert all(who.times == 1 for who in others)


async def test_the_tick_keeps_no_requests_context_alive() -> None:
    """The tick is armed in no request's context: while the gateway stays busy it would
    otherwise keep the first watcher's (its metrics marker, log and trace context)."""
    whose: contextvars.ContextVar[str] = contextvars.ContextVar("whose")
    late = Laggards()

    def alices_request() -> None:
        whose.set("alice's request")
        late.watch(Told())
    contextvars.copy_context().run(alices_request)
    late.watch(Told())  # more calls keep it ticking
    await asyncio.sleep(TICK_S * 1.5)
    late.watch(Told())
    assert late._handle is not None
    assert whose not in late._handle._context  # type: ignore[attr-defined]
