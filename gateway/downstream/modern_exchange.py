"""A modern request in flight (protocol 2026-07-28): its exchange, built whole from the
frozen description of the request its era decided (envelope.ModernRequest), its life
(forwarding / task / parked / answered) changed only by its verbs along exchange.py's
one table.

Request-scoped notifications only reach it; the upstream's requests to the client become
an `input_required` round (the call parked: mrtr.py, rounds.py); its results are made
modern (shapes.py). The era that forwards it (modern.py) is reached through `Era`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from gateway import errors
from gateway.answer_bytes import Hold
from gateway.downstream import shapes, sse
from gateway.downstream.envelope import ModernRequest
from gateway.downstream.exchange import Exchange, Life
from gateway.downstream.mrtr import Parked
from gateway.downstream.rounds import Rounds
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.tasks.engine import Handover
from gateway.tasks.model import Task
from gateway.upstream.correlator import Call
from gateway.upstream.isolation import Backend


class Era(Protocol):
    """What an exchange asks of the era that forwards it (modern.py `ModernEra`)."""

    @property
    def rounds(self) -> Rounds: ...
    @property
    def backend(self) -> Backend: ...
    @property
    def server_info(self) -> object: ...
    @property
    def ttl_ms(self) -> int: ...
    @property
    def scope(self) -> str: ...

    def task_soon(self, ex: ModernExchange) -> None:
        """The sync budget of `ex` ran out: its call becomes a task unless it answers first."""


INPUT_BATCH_S = 0.02  # server requests arriving this close together share one round


class ModernExchange(Exchange):
    """A modern request in flight: request-scoped notifications only, server requests turned
    into an `input_required` round, results made modern.

    Built whole from its `request` (frozen: what the era decided) and, for an MRTR retry,
    the call it resumes (`parked`); its life (`Life`) changes only by its verbs, along
    `MOVES`."""

    __slots__ = ("_batch", "_budget", "_call", "_inputs", "_life", "_parked", "_refused",
                 "era", "request")
    takes_mrtr = True  # a modern-only upstream's input_required goes to the client as is

    def __init__(self, era: Era, request: ModernRequest, sse_ok: bool, hold: Hold,
                 parked: Parked | None = None) -> None:
        super().__init__(request.id, sse_ok, lambda: sse.Stream("0", 0), {}, hold)
        self.era = era
        self.request = request
        self._parked = parked  # a retry's: re-parked if the server asks again
        if parked is not None:
            self.sent(parked.call, parked.done)
        self._inputs: list[Message] = []
        self._refused: dict[str, dict[str, Any]] = {}  # capabilities asked, not declared
        self._batch: asyncio.TimerHandle | None = None
        self._budget: asyncio.TimerHandle | None = None  # auto mode: then it becomes a task

    # -- Sink ------------------------------------------------------------------------------
    def on_message(self, msg: Message) -> None:
        if "id" in msg:  # a server request, routed here because this call is in flight
            if self._call is not None:  # so it is: none is routed before it is sent
                self._input(self._call, msg)
        elif msg.get("method") == mcp.PROGRESS:
            if not self.request.own_progress:
                super().on_message(msg)
        elif msg.get("method") == mcp.LOG_MESSAGE:
            params = msg.get("params")
            level = params.get("level") if isinstance(params, dict) else None
            if shapes.log_wanted(level, self.request.caller.log_level):
                super().on_message(msg)
        # Anything else is not about this request; listen streams carry change notifications.

    def on_response(self, msg: Message) -> None:
        self._cancel_batch()
        self.stop_budget()
        if self._refused and not self._inputs and "error" in msg and self._call is not None:
            self._missing_capability(self._call)  # it failed for want of what the client lacks
            return
        self._move(Life.ANSWERED)
        request, era = self.request, self.era
        if request.modern:
            era.rounds.seal_state(msg, request.caller.principal, request.method,
                                  request.digest)
        if request.method == mcp.TOOLS_LIST:
            era.backend.learn_tools(msg)
            if request.hidden is not None:
                msg = shapes.hide_tools(msg, request.hidden)
        msg, status = shapes.modern_response(request.method, msg, era.server_info,
                                             era.ttl_ms, era.scope, request.uri)
        self.answer(msg, status)

    def on_refused(self, capability: str) -> None:
        """The upstream asked for input this request's client did not declare (it got an
        error answer). Decided with the rest of the batch: see `_ask`."""
        self._refused[capability] = {}
        self._start_batch()

    def _missing_capability(self, call: Call) -> None:
        self._move(Life.ANSWERED)
        call.conn.cancel(call, "the client lacks a capability this call needs")
        err = errors.MissingCapability(
            f"Missing required client capability: {', '.join(self._refused)}",
            {"requiredCapabilities": self._refused})
        self.answer(err.to_message(self.request.id), err.http_status)

    def _input(self, call: Call, msg: Message) -> None:
        method = self.request.method
        if method not in mcp.MRTR_METHODS:  # spec MRTR: only these may ask for input
            call.conn.reply(msg["id"], jsonrpc.error(
                msg["id"], jsonrpc.METHOD_NOT_FOUND, f"{method} cannot ask for input"),
                call.owner)
            return
        self._inputs.append(msg)
        # spec (tasks extension): resolve MRTR exchanges before creating a task.
        self.stop_budget()
        self._start_batch()

    def _start_batch(self) -> None:
        if self._batch is None:
            self._batch = asyncio.get_running_loop().call_later(INPUT_BATCH_S, self._ask)

    def _cancel_batch(self) -> None:
        if self._batch is not None:
            self._batch.cancel()
            self._batch = None

    # -- parked for a round (MRTR) -----------------------------------------------------------
    def _ask(self) -> None:
        """Park the upstream call and answer with an input_required round for the input the
        client declared. A request for what it did not declare was refused upstream; the
        call goes on, and only if it then fails is that -32021 (spec 2026-07-28 basic:
        MissingRequiredClientCapability; see on_response): servers ask for optional things
        (server-everything asks every client for its roots) and cope without them.
        """
        self._batch = None
        call = self._call
        if call is None or not self._inputs or not self._move(Life.PARKED):
            return
        # The call is not over: its process stays, released by the parked call now.
        parked = self._parked or Parked(call, self.request, self.done)
        for msg in self._inputs:
            parked.add_input(msg)
        self._inputs.clear()
        self.done = None
        self.era.rounds.ask(self, parked, self.request.id)

    def resume(self) -> None:
        """A retry's exchange takes up its parked call: the response that came meanwhile
        answers it; inputs not answered yet are asked again (spec MRTR: what is left);
        else it hears the call from now on, which may still become a task (MRTR first,
        then the sync budget)."""
        parked, call = self._parked, self._call
        if parked is None or call is None:
            return
        if parked.response is not None:
            self.on_response({**parked.response, "id": self.request.id})
        elif parked.asked:
            if self._move(Life.PARKED):
                self.done = None  # the parked call keeps releasing its process
                self.era.rounds.ask(self, parked, self.request.id)
        else:
            call.redirect(self)
            self.start_budget()

    # -- a task of its own ---------------------------------------------------------------------
    async def handover(self, task: Task) -> Handover | None:
        """This call, for its new task; None if it answered while the store wrote."""
        if self._call is None or not self._move(Life.TASK):
            return None
        # Input asked while the store wrote (a shared store takes a round trip) is the
        # task's now, not an input_required round of this request.
        self._cancel_batch()
        pending, self._inputs = self._inputs, []
        handover = Handover(self._call, done=self.done, pending=pending)
        self.done = None
        return handover

    def start_budget(self) -> None:
        policy = self.request.policy
        if policy is not None and self._life is Life.FORWARDING:
            self._budget = asyncio.get_running_loop().call_later(
                policy.sync_budget_ms / 1000, self._budget_spent)

    def _budget_spent(self) -> None:
        self._budget = None
        self.era.task_soon(self)

    def stop_budget(self) -> None:
        if self._budget is not None:
            self._budget.cancel()
            self._budget = None

    # -- its end ---------------------------------------------------------------------------
    def _stopping(self) -> None:
        self.stop_budget()

    def seen_as(self) -> dict[str, str]:
        return {"era": "modern"}

    def abandon(self, why: str) -> None:
        """Its client went away (spec 2026-07-28 Streamable HTTP, Cancellation: closing
        the response stream MUST be treated as cancelling the request): the call is
        cancelled upstream and its process and slot freed, once."""
        call = self._call
        if call is None or not self._move(Life.ANSWERED):
            return
        call.conn.cancel(call, why)
        done, self.done = self.done, None
        if done is not None:
            done()


__all__ = ["Era", "ModernExchange"]
