"""A legacy session's calls forwarded upstream, once legacy.py decided to forward them: taken
within the principal's share of calls in flight, sent on the connection isolation picks,
timed by `request_timeout_ms`, cancelled (by the client, the timeout or the session's end),
and their lease (leases.py: slot, process, queue place) given back when they end.

The one writer of a session's `calls` (by the client's request id).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from gateway import errors, router
from gateway.downstream import sse
from gateway.downstream.boundary import ACCEPTS, json_response
from gateway.downstream.leases import Lease, Leases
from gateway.downstream.session import Edit, Session, SessionExchange
from gateway.errors import UpstreamError
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message, RequestId
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
        client_id = msg["id"]
        ex = SessionExchange(session, client_id, sse_ok,
                             self.leases.answers.hold(session.principal), edit)
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
            session.calls[client_id] = ex
            ex.sent(call, _done(session, client_id, lease.hand(call)))
        ex.heartbeat(call.progress_token, self.flow, ticket)
        if self.request_timeout_s is not None:  # from when it runs, not queued
            ex.time_out(self.request_timeout_s, self.backend.name, self.flow.late)
        # A call that waits in a queue keeps its request open meanwhile: the exchange turns
        # to SSE after one keep-alive interval, and keep-alives flow.
        return await ex.respond(request, json_ok, self.flow)

    @staticmethod
    def cancelled(session: Session, request_id: object, reason: object) -> None:
        """The client's notifications/cancelled of its request `request_id`, if in flight
        (spec: cancellation; the upstream is told, the request answered as cancelled)."""
        ex = session.calls.get(request_id) if jsonrpc.valid_id(request_id) else None
        if ex is not None:
            ex.stop(str(reason or "cancelled by the client"), jsonrpc.error(
                ex.request_id, jsonrpc.REQUEST_CANCELLED, "Request cancelled"))

    @staticmethod
    def end(session: Session) -> None:
        """The session ended: each of its calls is cancelled upstream and answered so."""
        for ex in list(session.calls.values()):
            ex.stop("client session ended", jsonrpc.error(
                ex.request_id, jsonrpc.REQUEST_CANCELLED, "Session ended"))


def _done(session: Session, client_id: RequestId, lease: Lease) -> Callable[[], None]:
    """The call is over: it leaves the session's calls, and its lease goes back."""
    def done() -> None:
        session.calls.pop(client_id, None)
        lease.release()
    return done


__all__ = ["SessionCalls"]
