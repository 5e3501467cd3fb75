"""The legacy era (protocol 2024-11-05 .. 2025-11-25) on Streamable HTTP: initialize and
sessions, POST answered as JSON or SSE, the GET stream, DELETE.

spec: mcp-base-2025-06-18.md, Transports > Streamable HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gateway import errors, router
from gateway.auth.exchange import TokenExchanger
from gateway.auth.principal import digest
from gateway.downstream import shapes, sse
from gateway.downstream.boundary import (
    ACCEPTS,
    UpstreamHeaders,
    check_accept,
    error_response,
    json_response,
    principal_of,
    queue_ticket,
    scopes_checked,
)
from gateway.downstream.core_tasks import CoreTasks
from gateway.downstream.resume import (
    ENDED,
    MAX_RECORD_BYTES,
    Record,
    Resumption,
    record_key,
)
from gateway.downstream.session import Session, SessionExchange, SessionStore, idle, refusal
from gateway.errors import StoreUnavailable, UpstreamError
from gateway.observability import log
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.ratelimit import InFlight
from gateway.router import Kind
from gateway.settings import Settings
from gateway.tasks.dialects import Lacking, core
from gateway.tasks.engine import TaskEngine
from gateway.tasks.policy import Policies
from gateway.upstream.connection import Connection
from gateway.upstream.isolation import Backend


class LegacyEra:
    """Handles legacy-era requests for one upstream."""

    def __init__(self, backend: Backend, sessions: SessionStore, conf: Settings,
                 engine: TaskEngine, policies: Policies, inflight: InFlight,
                 exchanger: TokenExchanger | None = None, resume: Resumption | None = None
                 ) -> None:
        self.backend = backend
        # Replicas sharing a store: sessions' records there, adopted on any replica.
        self.resume = resume
        self._adopting: dict[str, asyncio.Lock] = {}
        self._keys: dict[str, str] = {}  # record key -> id of the sessions held here
        if resume is not None and engine.replicas is not None:
            engine.replicas.on_announced(ENDED, self._ended_elsewhere)
        self._renewed = time.monotonic()
        self.by_principal = conf.auth.enabled  # with auth, core tasks are the principal's
        self.headers = UpstreamHeaders(backend, exchanger)
        self.inflight = inflight
        self.sessions = sessions
        self.flow = sse.Flow.of(conf)
        self.tasks = CoreTasks(backend, engine, policies, self.flow, inflight)
        self.replay = (conf.limits.replay_events, conf.limits.replay_bytes)
        timeout_ms = backend.conf.request_timeout_ms
        self.request_timeout_s = timeout_ms / 1000 if timeout_ms else None

    # -- POST ------------------------------------------------------------------------------
    async def post(self, request: web.Request, msg: Message, kind: jsonrpc.Kind
                   ) -> web.StreamResponse:
        if kind == "request" and msg["method"] == mcp.INITIALIZE:
            return await self.initialize(request, msg)
        session = await self.session_of(request)
        if kind == "notification":
            self.on_notification(session, msg)
            resp: web.StreamResponse = web.Response(status=202)
        elif kind == "response":
            await self.on_reply(session, msg)
            resp = web.Response(status=202)
        else:
            resp = await self.on_request(request, session, msg)
        if not resp.prepared:  # an SSE answer's headers are sent: they carry it already
            # Every answer names its session, so a balancer that learns affinity from
            # answers (deploy/haproxy.cfg: stick store-response) learns the replica that
            # adopted it at its first answer, a JSON one or a 202 included. The spec asks
            # the header of the initialize answer and forbids it on none; clients keep the
            # id they hold (the same).
            resp.headers[mcp.H_SESSION] = session.id
        return resp

    async def initialize(self, request: web.Request, msg: Message) -> web.StreamResponse:
        params = msg.get("params")
        if not isinstance(params, dict) or not isinstance(params.get("capabilities", {}), dict):
            return json_response(jsonrpc.error(msg["id"], jsonrpc.INVALID_PARAMS,
                                               "Invalid params: initialize needs params"))
        version = router.negotiate(params.get("protocolVersion"))
        session = self._session(version, params.get("capabilities") or {},
                                principal_of(request).owner)
        session.client_info = info = params.get("clientInfo")
        if not self._keepable(session):
            return json_response(jsonrpc.error(msg["id"], jsonrpc.INVALID_PARAMS, (
                "Invalid params: the client's capabilities are too large to keep for its "
                f"session (at most {MAX_RECORD_BYTES} bytes as JSON)")))
        refused = await self._admit(session)
        if refused is not None:
            self.backend.counters["rejections.sessions"] += 1
            log.warning("session.refused", principal=session.principal[:12],
                        reason=refused.message, upstream=self.backend.name)
            return json_response(refused.to_message(msg["id"]), refused.http_status)
        try:
            session.conn = await self.backend.attach(session)
        except UpstreamError as exc:
            await self._unadmit(session)
            return json_response(exc.to_message(msg["id"]), 503)
        assert session.conn.init_result is not None
        log.info("session.created", session=session.owner[:12], protocol=version,
                 upstream=self.backend.name,
                 client=info.get("name") if isinstance(info, dict) else None)
        self.backend.counters["sessions.created"] += 1
        result = shapes.initialize_result(session.conn.init_result, version)
        return json_response(jsonrpc.result(msg["id"], result), headers={mcp.H_SESSION: session.id})

    def _session(self, version: str, capabilities: dict[str, Any], principal: str,
                 sid: str | None = None) -> Session:
        session = Session(version, capabilities, *self.replay, principal=principal,
                          budget=self.sessions.replay, sid=sid)
        if self.by_principal:
            session.task_owner = principal
        return session

    def _keepable(self, session: Session) -> bool:
        """Whether the shared store can keep the session's record (its client's info left
        out when too large); always, without a shared store."""
        kept = self.record_of(session).kept() if self.resume is not None else None
        if kept is not None:
            session.client_info = kept.client_info
        return self.resume is None or kept is not None

    def record_of(self, session: Session) -> Record:
        return Record(session.principal, self.backend.name, session.version,
                      session.capabilities, session.client_info)

    async def _admit(self, session: Session) -> errors.TooManySessions | None:
        """Hold the new session here and record it in the shared store; the refusal when
        its principal holds its share (here, or across replicas) and none of its own
        sessions here is idle to make room (issue 29: never another principal's)."""
        try:
            evicted = self.sessions.add(session)
        except errors.TooManySessions as exc:
            return exc
        if evicted is not None:
            await self.end(evicted, "evicted")
        if self.resume is None:
            return None
        if await self._recorded(session):
            self._keys[record_key(session.id)] = session.id
            return None
        self.sessions.pop(session.id)
        return refusal(True, self.sessions.per_principal, self.sessions.max_sessions)

    async def _unadmit(self, session: Session) -> None:
        """A session whose client never got its id (its upstream failed it): gone here,
        and its record with it, so that it holds none of its principal's share across
        replicas (a few retries in an upstream outage would lock the principal out for
        a whole idle time)."""
        self.sessions.pop(session.id)
        if self.resume is not None:
            self._keys.pop(record_key(session.id), None)
            await self.resume.end(session.id, session.principal)

    async def _recorded(self, session: Session) -> bool:
        """Its record is kept, the principal's share across replicas allowing, after one of
        its idle sessions here ended to make room if need be."""
        assert self.resume is not None
        record = self.record_of(session)
        if await self.resume.open(session.id, record):
            return True
        spare = self.sessions.idle_of(session.principal, but=session)
        if spare is None:
            return False
        await self.end(spare, "evicted")
        return await self.resume.open(session.id, record)

    async def on_request(self, request: web.Request, session: Session, msg: Message
                         ) -> web.StreamResponse:
        json_ok, sse_ok = request[ACCEPTS]
        client_id = msg["id"]
        lacking = scopes_checked(request, msg, self.tasks.policy)  # InsufficientScope: 403
        decision = self.decide(session, msg)
        if decision.kind is Kind.REFUSE:
            assert decision.error is not None  # a JSON-RPC error: HTTP 200, as a server's
            return json_response(decision.error.to_message(client_id))
        if decision.serve == "set_level":
            session.level = decision.level
            if session.conn is not None:  # decide() needs it: always set by now
                session.conn.sync_level()
        if decision.result is not None or (decision.kind is Kind.SUBSCRIPTION
                                           and self._subscription(session, msg)):
            return json_response(jsonrpc.result(client_id, decision.result or {}))
        if client_id in session.calls:
            raise errors.InvalidRequest(
                f"Invalid Request: id {errors.shown(client_id)} is already in flight")
        if decision.kind is Kind.ANSWER:  # tasks/* of the gateway's core tasks
            return await self.tasks.serve(request, session, msg)
        headers = await self.headers.of(request)
        if decision.kind is Kind.TASK:
            return await self.tasks.call(session, msg, decision, headers)
        ex = SessionExchange(session, sse_ok)
        ex.edit = self.tasks.edit(decision.edit, session)
        if decision.kind is Kind.SUBSCRIPTION and msg["method"] == mcp.SUBSCRIBE:
            ex.edit = _subscribed(session, msg["params"]["uri"])
        if lacking is not None and msg["method"] == mcp.TOOLS_LIST:
            ex.edit = _then_hide(ex.edit, lacking)
        return await self.forward(request, session, msg, ex, json_ok, headers)

    def decide(self, session: Session, msg: Message) -> router.Decision:
        assert session.conn is not None
        conn = session.conn
        return router.legacy(msg, core_tasks=core.offered(session.version),
                             keeps_level=conn.modern or conn.logs,
                             native_task_ids=conn.correlator.tasks.held_by(session),
                             catalogue=self.backend.catalogue, policy_for=self.tasks.policy)

    async def forward(self, request: web.Request, session: Session, msg: Message,
                      ex: SessionExchange, json_ok: bool, headers: dict[str, str] | None
                      ) -> web.StreamResponse:
        assert session.conn is not None
        client_id = msg["id"]
        try:
            self.inflight.take(session.principal)
        except errors.TooManyRequests as exc:  # a JSON-RPC error: HTTP 200, as a server's
            return json_response(exc.to_message(client_id))
        try:
            conn = await self.backend.for_request(session.conn, session, msg["method"])
        except UpstreamError as exc:
            self.inflight.release(session.principal)
            return json_response(exc.to_message(client_id))
        await conn.reachable()
        try:
            ticket = queue_ticket(self.backend, session.principal, msg, self.tasks.policy)
            call = conn.request(msg, session, ex, headers, ticket=ticket)
        except (UpstreamError, errors.QueueFull) as exc:  # a JSON-RPC error: HTTP 200
            self._finished(session, client_id, conn)
            return json_response(exc.to_message(client_id))
        except BaseException:  # a fault of the gateway's: its slot and process go back
            self._finished(session, client_id, conn)
            raise
        session.calls[client_id] = call
        ex.done = lambda: self._finished(session, client_id, conn)
        if self.request_timeout_s is not None:  # from when it runs: a queue is not counted
            call.when_running(lambda: self._time(ex, session, client_id))
        # A call that waits in a queue keeps its request open meanwhile: the exchange turns
        # to SSE after one keep-alive interval, and keep-alives flow.
        return await ex.respond(request, json_ok, self.flow)

    def _time(self, ex: SessionExchange, session: Session, client_id: Any) -> None:
        assert self.request_timeout_s is not None
        ex.timer = asyncio.get_running_loop().call_later(
            self.request_timeout_s, self._timed_out, session, client_id)

    def _finished(self, session: Session, client_id: Any, used: Connection) -> None:
        session.calls.pop(client_id, None)
        self.inflight.release(session.principal)
        assert session.conn is not None
        self.backend.done(session.conn, used)

    def _timed_out(self, session: Session, client_id: Any) -> None:
        call = session.calls.get(client_id)
        if call is None:
            return
        name = call.conn.name
        call.conn.cancel(call, "timed out at the gateway")
        log.warning("request.timed_out", upstream=name, session=session.owner[:12])
        assert self.request_timeout_s is not None
        call.sink.on_response(UpstreamError.timed_out(name, self.request_timeout_s)
                              .to_message(client_id))

    def _subscription(self, session: Session, msg: Message) -> bool:
        """True when the gateway answers a (un)subscribe itself: the upstream holds one
        subscription per URI for all sessions, so only the first subscribe and the last
        unsubscribe of a holder reach it."""
        uri = msg["params"]["uri"]  # a string: the router said so
        assert session.conn is not None
        if msg["method"] == mcp.SUBSCRIBE:
            if uri in session.subscriptions:
                return True
            session.subscriptions.add(uri)
            return not session.conn.hold(uri)
        if uri not in session.subscriptions:
            return True  # nothing of this session's to end; another's stays held upstream
        session.subscriptions.discard(uri)
        return not session.conn.release(uri)

    def on_notification(self, session: Session, msg: Message) -> None:
        method = msg["method"]
        if method in router.SWALLOWED_NOTIFICATIONS:
            return
        if method == mcp.CANCELLED:
            params = msg.get("params")
            request_id = params.get("requestId") if isinstance(params, dict) else None
            call = session.calls.get(request_id) if jsonrpc.valid_id(request_id) else None
            if call is not None:
                reason = params.get("reason") if isinstance(params, dict) else None
                call.conn.cancel(call, str(reason or "cancelled by the client"))
                call.sink.on_response(jsonrpc.error(call.client_id, jsonrpc.REQUEST_CANCELLED,
                                                    "Request cancelled"))
            return
        assert session.conn is not None
        session.conn.notify(msg)

    async def on_reply(self, session: Session, msg: Message) -> None:
        # Only what was asked of this session is answered from it (DESIGN.md, Tenancy).
        conn = session.replies.pop(msg["id"], None)
        # An answer to a task's input request also moves the task back to working.
        if conn is None or not (await self.tasks.engine.reply(msg, session.task_owner)
                                or conn.reply(msg["id"], msg, session)):
            raise errors.InvalidRequest(f"Invalid Request: no server request with id "
                                        f"{errors.shown(msg['id'])} is waiting for an answer")

    # -- GET and DELETE --------------------------------------------------------------------
    async def get(self, request: web.Request) -> web.StreamResponse:
        check_accept(request, need_json=False)
        session = await self.session_of(request)
        stream, after = session.get_stream, session.get_stream.sent
        last = request.headers.get(mcp.H_LAST_EVENT)
        parsed = sse.parse_event_id(last) if last else None
        if parsed is not None and (found := session.find_stream(parsed[0])) is not None:
            stream, after = found, parsed[1]
        resp = await sse.open_response(request, {mcp.H_SESSION: session.id})
        if stream is session.get_stream:
            self.tasks.opened_get(session)
        await sse.pump(request, resp, stream, after, self.flow)
        return resp

    async def delete(self, request: web.Request) -> web.StreamResponse:
        sid, principal = _session_id(request), principal_of(request).owner
        session = self.sessions.get(sid, principal)
        if session is not None and session.conn is None and self.resume is not None:
            session = await self.adopt(sid, principal)  # being adopted here: its end after
        if session is None and self.resume is not None:
            # Another principal's session held here is looked up too: it looks unknown.
            record = await self.resume.find(sid, principal)
            if record is not None and self.sessions.held(sid) is None:
                _check_version(request)
                await self._end_everywhere(sid, principal)  # held elsewhere, or nowhere
                log.info("session.ended", session=digest("session", sid)[:12],
                         why="deleted", upstream=self.backend.name)
                return web.Response(status=200)
            session = self.sessions.get(sid, principal)  # adopted here meanwhile
        if session is None:
            raise _not_found()
        _check_version(request)
        await self.end(session, "deleted")
        return web.Response(status=200)

    async def end(self, session: Session, why: str) -> None:
        """End `session`: cancel its calls upstream, release its process, close its streams.
        Deleted or evicted, it ends everywhere; idle here, its record expires by itself
        unless another replica serves it meanwhile."""
        self.sessions.pop(session.id)
        if self.resume is not None:
            self._keys.pop(record_key(session.id), None)
            if why in ("deleted", "evicted"):
                await self._end_everywhere(session.id, session.principal)
        session.closed = True
        await self.tasks.end(session)
        for call in list(session.calls.values()):
            call.conn.cancel(call, "client session ended")
            call.sink.on_response(jsonrpc.error(call.client_id, jsonrpc.REQUEST_CANCELLED,
                                                "Session ended"))
        if session.conn is not None:
            for uri in session.subscriptions:
                if session.conn.release(uri):
                    session.conn.send_own(mcp.UNSUBSCRIBE, {"uri": uri})
            await self.backend.detach(session, session.conn)
        session.close_streams()
        log.info("session.ended", session=session.owner[:12], why=why, upstream=self.backend.name)

    async def _end_everywhere(self, sid: str, principal: str) -> None:
        """Its record goes (no replica adopts it or writes it back), and every replica
        holding a copy is told to end it now rather than at its next renewal."""
        assert self.resume is not None
        await self.resume.end(sid, principal)
        if self.tasks.engine.replicas is not None:
            # The store down: the copies end at their next renewal instead.
            with contextlib.suppress(StoreUnavailable):
                await self.tasks.engine.replicas.announce(ENDED, record_key(sid))

    async def _ended_elsewhere(self, key: str) -> None:
        """Another replica ended the session whose record key is `key` (DELETE, eviction)."""
        sid = self._keys.get(key)
        session = None if sid is None else self.sessions.held(sid)
        if session is not None:
            await self.end(session, "ended elsewhere")

    async def expire(self) -> None:
        for session in self.sessions.expired():
            await self.end(session, "idle")
        if self.resume is not None:
            await self._renew()

    async def _renew(self) -> None:
        """The records of the sessions used since the last renewal (or whose work runs)
        live on; those ended on another replica meanwhile (DELETE) end here too."""
        assert self.resume is not None
        since, self._renewed = self._renewed, time.monotonic()
        used = {s.id: s for s in self.sessions.all() if s.last_seen >= since or not idle(s)}
        for sid in await self.resume.renew([(s.id, self.record_of(s)) for s in used.values()]):
            await self.end(used[sid], "ended elsewhere")

    # -- checks ----------------------------------------------------------------------------
    async def session_of(self, request: web.Request) -> Session:
        sid, principal = _session_id(request), principal_of(request).owner
        # A session is bound to the auth context that created it (and so are its tasks):
        # another principal's is not found. One still being adopted (its upstream not yet
        # attached) is waited for.
        session = self.sessions.get(sid, principal)
        if self.resume is not None and (session is None or session.conn is None):
            session = await self.adopt(sid, principal)
        if session is None:
            raise _not_found()
        _check_version(request)
        return session

    async def adopt(self, sid: str, principal: str) -> Session | None:
        """The session `sid` of `principal` that another replica made (it stopped, died, or
        the balancer sent the client here), held here from now on; None when the store
        knows no such session of this principal. One adoption at a time per id: requests
        that come meanwhile wait for it."""
        assert self.resume is not None
        lock = self._adopting.setdefault(sid, asyncio.Lock())
        try:
            async with lock:
                held = self.sessions.get(sid, principal)
                if held is not None:  # adopted by the request that held the lock
                    return held
                # Read even when another principal's session `sid` is held here: Bob on
                # Alice's id gets what an unknown id gets (a 503 too, the store down).
                record = await self.resume.find(sid, principal)
                # Adopted meanwhile by a request that came as the lock was let go (or
                # another principal's, held here: not found).
                if self.sessions.held(sid) is not None:
                    return self.sessions.get(sid, principal)
                return None if record is None else await self._adopted(sid, record)
        finally:
            if not lock.locked():
                self._adopting.pop(sid, None)

    async def _adopted(self, sid: str, record: Record) -> Session | None:
        session = self._session(record.version, record.capabilities, record.principal, sid)
        session.client_info = record.client_info
        evicted = self.sessions.add(session)  # TooManySessions: 503, the client retries
        if evicted is not None:
            await self.end(evicted, "evicted")
        try:
            session.conn = await self.backend.attach(session)
        except UpstreamError:
            self.sessions.pop(sid)
            raise
        if session.closed:  # ended meanwhile (on another replica): its upstream goes too
            await self.backend.detach(session, session.conn)
            return None
        self._keys[record_key(sid)] = sid
        log.info("session.adopted", session=session.owner[:12], protocol=session.version,
                 upstream=self.backend.name)
        self.backend.counters["sessions.adopted"] += 1
        return session


def _not_found() -> errors.SessionNotFound:
    # spec (Session Management): a terminated session MUST get 404; the same words for
    # an id never made and another principal's.
    return errors.SessionNotFound("Session not found: it ended or never existed; "
                                  "initialize a new one")


def _check_version(request: web.Request) -> None:
    version = request.headers.get(mcp.H_PROTOCOL)
    # spec (Protocol Version Header): an invalid or unsupported version MUST get 400.
    if version is not None and version not in mcp.LEGACY_VERSIONS:
        raise errors.UnsupportedVersion(
            f"Bad Request: unsupported MCP-Protocol-Version {version}",
            {"supported": list(mcp.LEGACY_VERSIONS), "requested": version})


def _session_id(request: web.Request) -> str:
    sid = request.headers.get(mcp.H_SESSION)
    if not sid:
        raise errors.SessionRequired("Bad Request: Mcp-Session-Id header is required")
    return sid


def _subscribed(session: Session, uri: str) -> Callable[[Message], Message]:
    """On the answer to a subscribe that went upstream: held if the server took it, else
    let go (the session holds nothing the server does not)."""
    def settle(msg: Message) -> Message:
        conn = session.conn
        if conn is not None and "error" in msg:
            session.subscriptions.discard(uri)
            conn.release(uri)
        elif conn is not None:
            conn.confirm(uri)
        return msg
    return settle


def _then_hide(edit: Callable[[Message], Message] | None, lacking: Lacking
               ) -> Callable[[Message], Message]:
    """`edit`, then the tools the caller may not call taken out of the list."""
    def hide(msg: Message) -> Message:
        return shapes.hide_tools(edit(msg) if edit else msg, lacking)
    return hide


__all__ = ["LegacyEra", "error_response"]
