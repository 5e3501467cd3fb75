"""A modern request's exchange (downstream/modern_exchange.py): built whole, its life moved
only along one table, so an answer, a task hand-over, a round and a client gone race
without two of them winning."""

from __future__ import annotations

import asyncio
from typing import Any

from test_rounds import Call as RoundsCall

from gateway.downstream import sse
from gateway.downstream.envelope import Caller, ModernRequest
from gateway.downstream.exchange import MOVES, Life
from gateway.downstream.modern_exchange import INPUT_BATCH_S, ModernExchange
from gateway.downstream.mrtr import ParkedCalls, Sealer
from gateway.downstream.rounds import Rounds
from gateway.laggards import Laggards
from gateway.observability.counters import Counters
from gateway.protocol import jsonrpc, mcp
from gateway.tasks.policy import Policy


class Call(RoundsCall):
    progress_token = None

    def when_running(self, run: Any) -> None:
        run()


class Backend:
    name = "main"

    def learn_tools(self, msg: Any) -> None:
        pass


class Era:
    """What an exchange asks of its era."""

    def __init__(self) -> None:
        self.rounds = Rounds(Sealer(b"k" * 32, 60), ParkedCalls(4, 60), "r1", "", "main",
                             Counters())
        self.backend = Backend()
        self.server_info = None
        self.ttl_ms, self.scope = 0, "private"
        self.flow = sse.Flow(keepalive_s=15, slow_s=1)  # its `late` watches deferred timers
        self.budgets_spent: list[ModernExchange] = []

    def task_soon(self, ex: ModernExchange) -> None:
        self.budgets_spent.append(ex)


def exchange(policy: Policy | None = None) -> tuple[ModernExchange, Call, list[int]]:
    request = ModernRequest(5, Caller("alice", {"elicitation": {}}, None), mcp.TOOLS_CALL,
                            {"name": "ask"}, "ask", None, modern=False, policy=policy)
    ex = ModernExchange(Era(), request, sse_ok=True, hold=None)  # type: ignore[arg-type]
    call, released = Call(), []
    ex.sent(call, lambda: released.append(1))  # type: ignore[arg-type]
    return ex, call, released


def test_every_move_is_in_one_table_and_an_end_moves_nowhere() -> None:
    assert MOVES[Life.FORWARDING] == {Life.TASK, Life.PARKED, Life.ANSWERED}
    assert all(not MOVES[end] for end in (Life.TASK, Life.PARKED, Life.ANSWERED))


async def test_an_answer_wins_over_a_later_task_hand_over() -> None:
    ex, _, released = exchange()
    ex.on_response(jsonrpc.result(99, {"content": []}))
    assert ex.life is Life.ANSWERED and released == [1]
    assert await ex.handover(object()) is None  # type: ignore[arg-type]


async def test_a_handed_over_call_is_the_tasks_and_its_client_leaving_cancels_nothing() -> None:
    ex, call, released = exchange()
    handover = await ex.handover(object())  # type: ignore[arg-type]
    assert handover is not None and handover.call is call and ex.life is Life.TASK
    ex.abandon("the client closed the request's stream")
    assert call.conn.cancelled == [] and released == []  # the task releases it, not this


async def test_a_client_gone_cancels_its_call_once_and_a_timeout_after_does_nothing() -> None:
    ex, call, released = exchange()
    ex.abandon("the client closed the request's stream")
    ex.abandon("again")
    ex.time_out(0.0, "main", Laggards())
    await asyncio.sleep(0.01)
    assert call.conn.cancelled == ["the client closed the request's stream"]
    assert released == [1] and ex.life is Life.ANSWERED and ex.response is None


async def test_a_server_request_parks_the_call_for_a_round() -> None:
    ex, call, released = exchange()
    ex.on_message(jsonrpc.request("gw-1", "elicitation/create", {"message": "name?"}))
    await asyncio.sleep(INPUT_BATCH_S * 3)
    assert ex.life is Life.PARKED and call.conn.parked == 1
    assert ex.response is not None and b'"input_required"' in ex.response
    assert released == []  # the parked call holds its process now
    assert await ex.handover(object()) is None  # type: ignore[arg-type]


async def test_the_sync_budget_runs_only_while_forwarding() -> None:
    policy = Policy(mode="auto", sync_budget_ms=1, ttl_ms=1000, max_ttl_ms=1000,
                    poll_interval_ms=100, timeout_ms=None)
    ex, _, _ = exchange(policy)
    ex.start_budget()
    await asyncio.sleep(0.02)
    assert ex.era.budgets_spent == [ex]  # type: ignore[attr-defined]
    answered, _, _ = exchange(policy)
    answered.on_response(jsonrpc.result(5, {}))
    answered.start_budget()
    await asyncio.sleep(0.02)
    assert answered.era.budgets_spent == []  # type: ignore[attr-defined]


async def test_an_input_batch_gathers_what_arrives_together_and_is_taken_once() -> None:
    """The server's requests within INPUT_BATCH_S make one round (`due` once); what was
    refused alone says the call may fail for want of it; taking stops the time."""
    from gateway.downstream.modern_exchange import InputBatch

    rounds: list[int] = []
    batch = InputBatch(lambda: rounds.append(len(batch.inputs)))
    batch.refuse("roots")
    assert batch.only_refused
    batch.add({"jsonrpc": "2.0", "id": 1, "method": "elicitation/create"})
    batch.add({"jsonrpc": "2.0", "id": 2, "method": "sampling/createMessage"})
    assert not batch.only_refused
    await asyncio.sleep(INPUT_BATCH_S * 3)
    assert rounds == [2]  # one round for both
    assert [m["id"] for m in batch.take()] == [1, 2] and batch.inputs == []
    batch.add({"jsonrpc": "2.0", "id": 3, "method": "elicitation/create"})
    batch.take()  # taken before its time: no round
    await asyncio.sleep(INPUT_BATCH_S * 3)
    assert rounds == [2] and batch.refused == {"roots": {}}
