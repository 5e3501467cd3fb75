"""One HTTP request in flight, in either era: the `Sink` of its upstream call (or the
wait for a task's end), and the life of that call as this request sees it.

It answers with plain JSON when the response comes first, and switches to an SSE stream when
related messages (progress, logs) come before it, or when the call outlives one keep-alive
interval (so intermediaries see bytes on slow calls). A call whose request carried a
progress token has a heartbeat (heartbeat.py): quiet, it still tells its client it runs.
Its call's life (`Life`) changes only along `MOVES`: the first of an answer, a cancel and a
timeout wins, in both eras (a modern call may also become a task or park for input).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

from aiohttp import web

from gateway.answer_bytes import Hold
from gateway.downstream import sse
from gateway.downstream.boundary import JSON_HEADERS, mark
from gateway.downstream.heartbeat import Heartbeat
from gateway.errors import AnswersOverBudget, UpstreamTimeout
from gateway.laggards import Deferring, Laggards
from gateway.observability import log
from gateway.observability.tracing import error_type
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.queues import Ticket
from gateway.upstream.correlator import Call


class Life(enum.Enum):
    """Where a request's upstream call is, as its exchange sees it."""

    FORWARDING = "forwarding"  # in flight, its exchange the Sink (or about to be sent)
    TASK = "task"  # handed over to a task of its own: the answer is the task's handle
    PARKED = "parked"  # parked for an MRTR round: the answer is input_required
    ANSWERED = "answered"  # its answer is in (the server's, or the gateway's), or its
    # client went away and it was cancelled: either way, over for this request

    # Members are singletons: hashed by identity in C, not by Enum's Python __hash__ (two
    # calls a request in MOVES; bench/calls.py).
    __hash__ = object.__hash__


# h11's `_state.py` way: every move of a request's life in one table, an end moving nowhere.
# A verb whose move is not here does nothing: an answer, a cancel, a timeout and a task
# hand-over race, and the first one wins. (Only modern calls become tasks or park.)
MOVES: Final[Mapping[Life, frozenset[Life]]] = MappingProxyType({
    Life.FORWARDING: frozenset({Life.TASK, Life.PARKED, Life.ANSWERED}),
    Life.TASK: frozenset(),
    Life.PARKED: frozenset(),
    Life.ANSWERED: frozenset(),
})


class Exchange(Deferring):
    """Built whole from what the request is known by (`request_id`: the client's id, which
    the gateway's own answers carry), how it may be answered, and the principal's answer
    bytes (`hold`); then `sent` once its call is."""

    __slots__ = ("_call", "_life", "_timeout", "_wake", "_wake_at", "_wake_timer", "beat", "done",
                 "early", "error_type", "headers", "hold", "new_stream", "request_id",
                 "response", "sse_ok", "status", "stream", "timer")
    takes_mrtr = False  # a modern-only upstream's input_required becomes server requests

    def __init__(self, request_id: RequestId, sse_ok: bool, new_stream: Callable[[], sse.Stream],
                 headers: dict[str, str], hold: Hold | None) -> None:
        super().__init__()
        self.request_id = request_id
        self.sse_ok = sse_ok
        self.new_stream = new_stream
        self.headers = headers
        self.early: list[bytes] = []
        # Serialized on arrival: the dict of a multi-MiB result is freed at once.
        self.response: bytes | None = None
        self.status = 200
        self.error_type: str | None = None  # how the response failed (boundary.mark)
        self.stream: sse.Stream | None = None
        self._wake: asyncio.Future[bool] | None = None
        self.done: Callable[[], None] | None = None  # called once, when the response is in
        self.timer: asyncio.TimerHandle | None = None
        self.beat: Heartbeat | None = None
        self.hold = hold  # the answer's bytes, counted until written
        self._life = Life.FORWARDING
        self._call: Call | None = None
        # Timers deferred until it waited a tick (laggards.py), armed then.
        self._timeout: tuple[float, float, str] | None = None  # (due, seconds, upstream)
        self._wake_at: float | None = None  # loop time
        self._wake_timer: asyncio.TimerHandle | None = None

    # -- its call's life -------------------------------------------------------------------
    @property
    def life(self) -> Life:
        return self._life

    @property
    def forwarding(self) -> bool:
        """Its call is sent and still this request's."""
        return self._life is Life.FORWARDING and self._call is not None

    def _move(self, to: Life) -> bool:
        """Move to `to` if `MOVES` allows it; whether it did."""
        if to not in MOVES[self._life]:
            return False
        self._life = to
        return True

    def sent(self, call: Call, done: Callable[[], None] | None) -> None:
        """Its call was sent; `done` gives back what the call holds once it is over."""
        self._call, self.done = call, done

    def time_out(self, seconds: float, upstream: str, late: Laggards) -> None:
        """`request_timeout_ms`: counted from when the call runs (a queue is not counted),
        the call is cancelled upstream and answered so if not answered by then. A call that
        runs now has its timer armed only if it is `late` (laggards.py)."""
        call = self._call
        if call is None or self._life is not Life.FORWARDING:
            return
        if call.ticket is not None:  # it may wait in a queue: timed once it runs
            call.when_running(lambda: self._time_out_after(seconds, upstream))
        elif (due := self._due(seconds, late)) is None:
            self._time_out_after(seconds, upstream)
        else:
            self._timeout = (due, seconds, upstream)

    def _time_out_after(self, seconds: float, upstream: str) -> None:
        self.timer = asyncio.get_running_loop().call_later(seconds, self._timed_out, seconds,
                                                            upstream)

    # -- timers armed late (laggards.py) -----------------------------------------------------
    def late(self) -> None:
        """It waited a tick unanswered: the timers it deferred are armed."""
        super().late()
        if self._timeout is not None and self._life is Life.FORWARDING:
            due, seconds, upstream = self._timeout
            self.timer = self._at(due, self._timed_out, seconds, upstream)
        if self._wake_at is not None and self._wake is not None:
            self._wake_timer = self._at(self._wake_at, _time_up, self._wake)

    def _timed_out(self, seconds: float, upstream: str) -> None:
        answer = UpstreamTimeout.timed_out(upstream, seconds).to_message(self.request_id)
        if self.stop("timed out at the gateway", answer):
            log.warning("request.timed_out", upstream=upstream, **self.seen_as())

    def seen_as(self) -> dict[str, str]:
        """What names this request in its log events."""
        return {}

    def stop(self, why: str, answer: Message) -> bool:
        """Cancel its call upstream (a late answer is then dropped) and answer its client
        now with `answer`, unless its call is over for it already; whether it did."""
        call = self._call
        if call is None or not self._move(Life.ANSWERED):
            return False
        self._stopping()
        call.conn.cancel(call, why)
        self.answer(answer)
        return True

    def _stopping(self) -> None:
        """What else ends with a call stopped here (a modern call's sync budget)."""

    def let_go(self) -> None:
        """The request is over: the call and its exchange name each other, a cycle only the
        garbage collector frees, which may not run for a long time on a quiet gateway, and
        meanwhile the answer stays held (many MiB for a big result a slow reader never
        took)."""
        self._call = None

    def heartbeat(self, token: RequestId | None, flow: sse.Flow, ticket: Ticket | None
                  ) -> None:
        """Progress for the client's `token` while the call is quiet, saying whether it
        runs or waits behind others under its `ticket` (none without a token, or for a
        client that takes no SSE: it could not hear it)."""
        if token is not None and flow.heartbeat_s and self.sse_ok and self.response is None:
            waiting = None if ticket is None else lambda: ticket.ahead
            self.beat = Heartbeat(token, flow.heartbeat_s, self._deliver, waiting)

    # -- Sink ------------------------------------------------------------------------------
    def on_message(self, msg: Message) -> None:
        if self.beat is not None:
            self.beat.heard(msg)
        self._deliver(msg)

    def _deliver(self, msg: Message) -> None:
        if self.stream is not None:
            self.stream.push(jsonrpc.dumps(msg))
        elif self.sse_ok:
            self.early.append(jsonrpc.dumps(msg))
            self._notify()
        else:
            self.unstreamable(msg)

    def on_refused(self, capability: str) -> None:
        """A server request for what this client did not declare was refused upstream."""

    def unstreamable(self, msg: Message) -> None:
        """A related message for a client that accepts no SSE: dropped unless overridden."""

    def on_response(self, msg: Message) -> None:
        self._move(Life.ANSWERED)
        self.answer(msg)

    def answer(self, msg: Message, status: int = 200) -> None:
        """The request's answer is `msg` (unless it has one already)."""
        if self.response is not None:
            return
        self.response, self.status = jsonrpc.dumps(msg), status
        if self.hold is not None:
            self.response, msg = held(self.hold, msg, self.response)
        self.error_type = error_type(msg)
        self._unwatch()
        if self.timer is not None:
            self.timer.cancel()
        if self.beat is not None:
            self.beat.stop()
        if self.done is not None:
            done, self.done = self.done, None
            done()
        self.let_go()  # the call is over for this request, whatever becomes of it
        if self.stream is not None:
            self.stream.push(self.response, last=True)
        self._notify()

    # -- HTTP ------------------------------------------------------------------------------
    def _notify(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(True)

    async def _wait(self, timeout_s: float | None, late: Laggards) -> None:
        """Until news (`_notify`) or, given `timeout_s`, that long (armed once it is late,
        laggards.py)."""
        loop = asyncio.get_running_loop()
        self._wake = wake = loop.create_future()
        if timeout_s:
            if (due := self._due(timeout_s, late)) is None:
                self._wake_timer = loop.call_later(timeout_s, _time_up, wake)
            else:
                self._wake_at = due
        try:
            await wake
        finally:
            self._wake_at = None
            if self._wake_timer is not None:
                self._wake_timer.cancel()
                self._wake_timer = None

    async def respond(self, request: web.Request, json_ok: bool, flow: sse.Flow
                      ) -> web.StreamResponse:
        try:
            return await self._respond(request, json_ok, flow)
        finally:  # answered, or its client gone
            self.close()

    def close(self) -> None:
        """Nobody is left to hear a heartbeat, and the answer was written or has nobody to
        be written to (its bytes go back): once it responded, or when it never will (a
        lookup before it failed). Idempotent."""
        if self.beat is not None:
            self.beat.stop()
        if self.hold is not None:
            self.hold.end()

    async def _respond(self, request: web.Request, json_ok: bool, flow: sse.Flow
                       ) -> web.StreamResponse:
        if json_ok:
            if self.response is None and not self.early:
                await self._wait(flow.keepalive_s if self.sse_ok else None, flow.late)
            while not self.sse_ok and self.response is None:
                await self._wait(None, flow.late)
            if self.response is not None and not self.early:
                return self._marked(await sse.send_body(request, self.response, self.status,
                                                        JSON_HEADERS, flow))
        self.stream = stream = self.new_stream()
        for data in self.early:
            stream.push(data)
        self.early.clear()
        if self.response is not None:
            stream.push(self.response, last=True)
        resp = await sse.open_response(request, self.headers)
        await sse.pump(request, resp, stream, 0, flow)
        return self._marked(resp)

    def _marked(self, resp: web.StreamResponse) -> web.StreamResponse:
        return mark(resp, self.error_type)


def _time_up(wake: asyncio.Future[bool]) -> None:
    """A wait's time is up, unless news came first (its task not yet resumed)."""
    if not wake.done():
        wake.set_result(False)


async def send_held(request: web.Request, msg: Message, flow: sse.Flow, hold: Hold
                    ) -> web.StreamResponse:
    """An answer the gateway serves whole by itself (a finished task's result: tasks/result,
    tasks/get): counted against its principal's answer bytes until written, and written
    under the slow-reader rule (sse.send_body), as a call's answer is; over the budget, the
    error that names the bound instead."""
    body, sent = held(hold, msg, jsonrpc.dumps(msg))
    try:
        resp = await sse.send_body(request, body, 200, JSON_HEADERS, flow)
    finally:
        hold.end()
    return mark(resp, error_type(sent))


def held(hold: Hold, msg: Message, body: bytes) -> tuple[bytes, Message]:
    """`body`, the answer to `msg`, counted against its principal's answer bytes, and the
    message it is; over them, the error that names the bound instead (answer_bytes.py)."""
    try:
        hold.take(len(body))
    except AnswersOverBudget as exc:
        error = exc.to_message(msg.get("id"))
        return jsonrpc.dumps(error), error
    return body, msg
