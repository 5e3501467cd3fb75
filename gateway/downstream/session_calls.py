"""A legacy session's calls forwarded upstream, once legacy.py decided to forward them: taken
within the principal's share of calls in flight, sent on the connection isolation picks,
timed by `request_timeout_ms`, cancelled (by the client, the timeout or the session's end),
and their lease (leases.py: slot, process, queue place) given back when they end.

The one writer of a session's `calls` (by the client's request id).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from gateway import errors, router
from gateway.downstream import sse
from gateway.downstream.boundary import ACCEPTS, json_response
from gateway.downstream.leases import Lease, Leases
from gateway.downstream.session import Edit, Session, SessionExchange
from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.observability import log
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.upstream.correlator import Call
from gateway.upstream.isolation import Backend


class SessionCalls:
    """The calls of one upstream's legacy sessions: forwarded, timed, cancelled, ended."""

    def __init__(self, backend: Backend, leases: Leases, flow: sse.Flow,
                 policy_for: router.PolicyFor) -> None:
        self.backend = backend
        self.leases = leases
        self.flow = flow
        self.policy_for = policy_for
        timeout_ms = backend.conf.request_timeout_ms
        self.request_timeout_s = timeout_ms / 1000 if timeout_ms else None

    async def forward(self, request: web.Request, session: Session, msg: Message,
                      edit: Edit | None, headers: dict[str, str] | None
                      ) -> web.StreamResponse:
        """Send request `msg` upstream for `session`; its answer (through `edit`), as JSON
        or SSE. A refusal before it was sent is a JSON-RPC error (HTTP 200, as a server's);
        the gateway stopping is a 503 (GatewayStopping, raised)."""
        json_ok, sse_ok = request[ACCEPTS]
        ex = SessionExchange(session, sse_ok, edit)
        ex.hold = self.leases.answers.hold(session.principal)
        client_id = msg["id"]
        try:
            lease = self.leases.take(session.principal, msg["method"])
        except errors.TooManyRequests as exc:
            return json_response(exc.to_message(client_id))
        with lease:
            try:
                conn = await lease.connect(self.backend, session.conn, session, msg["method"])
                await conn.reachable()
                ticket = lease.queue(msg, self.policy_for)
                call = conn.request(msg, session, ex, headers, ticket=ticket)
            except (UpstreamError, errors.QueueFull) as exc:
                return json_response(exc.to_message(client_id))
            session.calls[client_id] = call
            ex.done = self._done(session, client_id, lease.hand(call))
        ex.heartbeat(call.progress_token, self.flow, ticket)
        if (seconds := self.request_timeout_s) is not None:  # from when it runs, not queued
            call.when_running(lambda: self._time(ex, session, client_id, seconds))
        # A call that waits in a queue keeps its request open meanwhile: the exchange turns
        # to SSE after one keep-alive interval, and keep-alives flow.
        return await ex.respond(request, json_ok, self.flow)

    @staticmethod
    def _done(session: Session, client_id: RequestId, lease: Lease) -> Callable[[], None]:
        """The call is over: it leaves the session's calls, and its lease goes back."""
        def done() -> None:
            session.calls.pop(client_id, None)
            lease.release()
        return done

    def _time(self, ex: SessionExchange, session: Session, client_id: RequestId, seconds: float
              ) -> None:
        ex.timer = asyncio.get_running_loop().call_later(
            seconds, self._timed_out, session, client_id, seconds)

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
