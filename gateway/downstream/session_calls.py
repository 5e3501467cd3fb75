"""A legacy session's calls forwarded upstream, once legacy.py decided to forward them: taken
within the principal's share of calls in flight, sent on the connection isolation picks,
timed by `request_timeout_ms`, cancelled (by the client, the timeout or the session's end),
and their slot and process given back when they end.

The one writer of a session's `calls` (by the client's request id).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway import errors, router
from gateway.downstream import sse
from gateway.downstream.boundary import ACCEPTS, json_response, queue_ticket
from gateway.downstream.session import Edit, Session, SessionExchange
from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.observability import log
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.ratelimit import InFlight
from gateway.upstream.connection import Connection
from gateway.upstream.correlator import Call
from gateway.upstream.isolation import Backend


class SessionCalls:
    """The calls of one upstream's legacy sessions: forwarded, timed, cancelled, ended."""

    def __init__(self, backend: Backend, inflight: InFlight, flow: sse.Flow,
                 policy_for: router.PolicyFor) -> None:
        self.backend = backend
        self.inflight = inflight
        self.flow = flow
        self.policy_for = policy_for
        timeout_ms = backend.conf.request_timeout_ms
        self.request_timeout_s = timeout_ms / 1000 if timeout_ms else None

    async def forward(self, request: web.Request, session: Session, msg: Message,
                      edit: Edit | None, headers: dict[str, str] | None
                      ) -> web.StreamResponse:
        """Send request `msg` upstream for `session`; its answer (through `edit`), as JSON
        or SSE. A refusal before it was sent is a JSON-RPC error (HTTP 200, as a server's)."""
        json_ok, sse_ok = request[ACCEPTS]
        ex = SessionExchange(session, sse_ok, edit)
        ex.hold = self.inflight.answers.hold(session.principal)
        client_id = msg["id"]
        try:
            self.inflight.take(session.principal)
        except errors.TooManyRequests as exc:
            return json_response(exc.to_message(client_id))
        try:
            conn = await self.backend.for_request(session.conn, session, msg["method"])
        except UpstreamError as exc:
            self.inflight.release(session.principal)
            return json_response(exc.to_message(client_id))
        except BaseException:  # cancelled while it waited for a process: its slot goes
            self.inflight.release(session.principal)
            raise
        await conn.reachable()
        try:
            ticket = queue_ticket(self.backend, session.principal, msg, self.policy_for)
            call = conn.request(msg, session, ex, headers, ticket=ticket)
        except (UpstreamError, errors.QueueFull) as exc:
            self._finished(session, client_id, conn)
            return json_response(exc.to_message(client_id))
        except BaseException:  # a fault of the gateway's: its slot and process go back
            self._finished(session, client_id, conn)
            raise
        session.calls[client_id] = call
        ex.done = lambda: self._finished(session, client_id, conn)
        ex.heartbeat(call.progress_token, self.flow, ticket)
        if (seconds := self.request_timeout_s) is not None:  # from when it runs, not queued
            call.when_running(lambda: self._time(ex, session, client_id, seconds))
        # A call that waits in a queue keeps its request open meanwhile: the exchange turns
        # to SSE after one keep-alive interval, and keep-alives flow.
        return await ex.respond(request, json_ok, self.flow)

    def _time(self, ex: SessionExchange, session: Session, client_id: RequestId, seconds: float
              ) -> None:
        ex.timer = asyncio.get_running_loop().call_later(
            seconds, self._timed_out, session, client_id, seconds)

    def _finished(self, session: Session, client_id: RequestId, used: Connection) -> None:
        session.calls.pop(client_id, None)
        self.inflight.release(session.principal)
        self.backend.done(session.conn, used)

    def _timed_out(self, session: Session, client_id: RequestId, seconds: float) -> None:
        call = session.calls.get(client_id)
        if call is None:
            return
        name = call.conn.name
        log.warning("request.timed_out", upstream=name, session=session.owner[:12])
        _stop(call, "timed out at the gateway",
              UpstreamTimeout.timed_out(name, seconds).to_message(client_id))

    @staticmethod
    def cancelled(session: Session, request_id: object, reason: object) -> None:
        """The client's notifications/cancelled of its request `request_id`, if in flight
        (spec: cancellation; the upstream is told, the request answered as cancelled)."""
        call = session.calls.get(request_id) if jsonrpc.valid_id(request_id) else None
        if call is not None:
            _stop(call, str(reason or "cancelled by the client"), jsonrpc.error(
                call.client_id, jsonrpc.REQUEST_CANCELLED, "Request cancelled"))

    @staticmethod
    def end(session: Session) -> None:
        """The session ended: each of its calls is cancelled upstream and answered so."""
        for call in list(session.calls.values()):
            _stop(call, "client session ended", jsonrpc.error(
                call.client_id, jsonrpc.REQUEST_CANCELLED, "Session ended"))


def _stop(call: Call, why: str, answer: Message) -> None:
    """Cancel `call` upstream (a late answer is then dropped) and answer its client now."""
    call.conn.cancel(call, why)
    call.sink.on_response(answer)


__all__ = ["SessionCalls"]
