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
from collections.abc import Callable
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
from gateway.tasks.curation import Curation, unmask
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
    @property
    def curation(self) -> Curation: ...
    @property
    def lists_vary(self) -> bool: ...
    @property
    def flow(self) -> sse.Flow: ...

    def task_soon(self, ex: ModernExchange) -> None:
        """The sync budget of `ex` ran out: its call becomes a task unless it answers first."""


INPUT_BATCH_S = 0.02  # server requests arriving this close together share one round


class InputBatch:
    """What a call's server asked of the client lately, gathered for INPUT_BATCH_S so that
    requests arriving together share one round: its input requests, and the capabilities
    it asked for that the client did not declare (refused upstream at once; decided with
    the rest: ModernExchange `_ask`). `due()` when the time is up."""

    __slots__ = ("_timer", "due", "inputs", "refused")

    def __init__(self, due: Callable[[], None]) -> None:
        self.due = due
        self.inputs: list[Message] = []
        self.refused: dict[str, dict[str, Any]] = {}  # as requiredCapabilities says them
        self._timer: asyncio.TimerHandle | None = None

    def add(self, msg: Message) -> None:
        self.inputs.append(msg)
        self._start()

    def refuse(self, capability: str) -> None:
        self.refused[capability] = {}
        self._start()

    @property
    def only_refused(self) -> bool:
        """Something was refused, and nothing is asked: the call may fail for want of it."""
        return bool(self.refused) and not self.inputs

    def take(self) -> list[Message]:
        """The input requests gathered, which leave the batch; its time stops."""
        self.cancel()
        taken, self.inputs = self.inputs, []
        return taken

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _start(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(INPUT_BATCH_S, self._due)

    def _due(self) -> None:
        self._timer = None
        self.due()


class ModernExchange(Exchange):
    """A modern request in flight: request-scoped notifications only, server requests turned
    into an `input_required` round, results made modern.

    Built whole from its `request` (frozen: what the era decided) and, for an MRTR retry,
    the call it resumes (`parked`); its life (`Life`) changes only by its verbs, along
    `MOVES`."""

    __slots__ = ("_batch", "_budget", "_budget_at", "_parked", "era", "request")
    takes_mrtr = True  # a modern-only upstream's input_required goes to the client as is

    def __init__(self, era: Era, request: ModernRequest, sse_ok: bool, hold: Hold,
                 parked: Parked | None = None) -> None:
        super().__init__(request.id, sse_ok, lambda: sse.Stream("0", 0), {}, hold)
        self.era = era
        self.request = request
        self._parked = parked  # a retry's: re-parked if the server asks again
        if parked is not None:
            self.sent(parked.call, parked.done)
        self._batch: InputBatch | None = None  # made when the server first asks
        self._budget: asyncio.TimerHandle | None = None  # auto mode: then it becomes a task
        self._budget_at: float | None = None  # its deadline, armed once late (laggards.py)

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
        batch = self._batch
        if batch is not None:
            batch.cancel()
        self.stop_budget()
        if batch is not None and batch.only_refused and "error" in msg and \
                self._call is not None:  # it failed for want of what the client lacks
            self._missing_capability(self._call, batch.refused)
            return
        self._move(Life.ANSWERED)
        request, era = self.request, self.era
        if request.modern:
            era.rounds.seal_state(msg, request.caller.principal, request.method,
                                  request.asked)
        if request.method == mcp.TOOLS_LIST:
            era.backend.learn_tools(msg)
            if request.hidden is not None:
                msg = shapes.hide_tools(msg, request.hidden)
            if era.lists_vary:  # spec 2026-07-28 (caching, Choosing a Cache Scope): a list
                # that varies per caller is private, whatever the server or settings said
                msg = shapes.private(msg)
            if era.curation.active:
                msg = era.curation.listed(msg)
        elif request.masked is not None:  # answered as an unknown tool is, as called
            msg = unmask(msg, request.masked)
        msg, status = shapes.modern_response(request.method, msg, era.server_info,
                                             era.ttl_ms, era.scope, request.uri)
        self.answer(msg, status)

    def on_refused(self, capability: str) -> None:
        """The upstream asked for input this request's client did not declare (it got an
        error answer). Decided with the rest of the batch: see `_ask`."""
        self._batched().refuse(capability)

    def _batched(self) -> InputBatch:
        if self._batch is None:
            self._batch = InputBatch(self._ask)
        return self._batch

    def _missing_capability(self, call: Call, refused: dict[str, dict[str, Any]]) -> None:
        self._move(Life.ANSWERED)
        call.conn.cancel(call, "the client lacks a capability this call needs")
        err = errors.MissingCapability(
            f"Missing required client capability: {', '.join(refused)}",
            {"requiredCapabilities": refused})
        self.answer(err.to_message(self.request.id), err.http_status)

    def _input(self, call: Call, msg: Message) -> None:
        method = self.request.method
        if method not in mcp.MRTR_METHODS:  # spec MRTR: only these may ask for input
            call.conn.reply(msg["id"], jsonrpc.error(
                msg["id"], jsonrpc.METHOD_NOT_FOUND, f"{method} cannot ask for input"),
                call.owner)
            return
        # spec (tasks extension): resolve MRTR exchanges before creating a task.
        self.stop_budget()
        self._batched().add(msg)

    # -- parked for a round (MRTR) -----------------------------------------------------------
    def _ask(self) -> None:
        """Park the upstream call and answer with an input_required round for the input the
        client declared. A request for what it did not declare was refused upstream; the
        call goes on, and only if it then fails is that -32021 (spec 2026-07-28 basic:
        MissingRequiredClientCapability; see on_response): servers ask for optional things
        (server-everything asks every client for its roots) and cope without them.
        """
        call, batch = self._call, self._batch
        if call is None or batch is None or not batch.inputs or not self._move(Life.PARKED):
            return
        # The call is not over: its process stays, released by the parked call now.
        parked = self._parked or Parked(call, self.request, self.done)
        for msg in batch.take():
            parked.add_input(msg)
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
        pending = self._batch.take() if self._batch is not None else []
        handover = Handover(self._call, done=self.done, pending=pending)
        self.done = None
        return handover

    def start_budget(self) -> None:
        policy = self.request.policy
        if policy is None or self._life is not Life.FORWARDING:
            return
        seconds = policy.sync_budget_ms / 1000
        if (due := self._due(seconds, self.era.flow.late)) is None:
            self._budget = asyncio.get_running_loop().call_later(seconds, self._budget_spent)
        else:
            self._budget_at = due

    def late(self) -> None:
        super().late()
        if self._budget_at is not None and self._life is Life.FORWARDING:
            self._budget = self._at(self._budget_at, self._budget_spent)
        self._budget_at = None

    def _budget_spent(self) -> None:
        self._budget = None
        self.era.task_soon(self)

    def stop_budget(self) -> None:
        self._budget_at = None
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
