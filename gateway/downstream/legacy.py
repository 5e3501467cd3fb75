"""The legacy era (protocol 2024-11-05 .. 2025-11-25) on Streamable HTTP: initialize and
sessions, POST answered as JSON or SSE, the GET stream, DELETE.

spec: mcp-base-2025-06-18.md, Transports > Streamable HTTP.
"""

from __future__ import annotations

from typing import assert_never

from aiohttp import web

from gateway import errors, router
from gateway.auth.token_exchange import TokenExchanger
from gateway.downstream import shapes, sse
from gateway.downstream.boundary import (
    UpstreamHeaders,
    call_key,
    check_accept,
    error_response,
    json_response,
    principal_of,
    scopes_checked,
)
from gateway.downstream.core_tasks import CoreTasks
from gateway.downstream.leases import Leases
from gateway.downstream.references import names_a_task, own_references
from gateway.downstream.resume import MAX_RECORD_BYTES, Resumption
from gateway.downstream.session import (
    Edit,
    Session,
    SessionStore,
)
from gateway.downstream.session_calls import SessionCalls
from gateway.downstream.session_life import SessionLife
from gateway.errors import UpstreamError
from gateway.observability import log
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.push import client
from gateway.settings.schema import Settings
from gateway.tasks.curation import unmask
from gateway.tasks.dialects import Lacking, core
from gateway.tasks.engine import TaskEngine
from gateway.tasks.keys import CallKey
from gateway.tasks.policy import Policies
from gateway.upstream.isolation import Backend


class LegacyEra:
    """Handles legacy-era requests for one upstream."""

    def __init__(self, backend: Backend, sessions: SessionStore, conf: Settings,
                 engine: TaskEngine, policies: Policies, leases: Leases,
                 exchanger: TokenExchanger | None = None, resume: Resumption | None = None
                 ) -> None:
        self.backend = backend
        self.headers = UpstreamHeaders(backend, exchanger)
        self.flow = sse.Flow.of(conf)
        self.tasks = CoreTasks(backend, engine, policies, self.flow, leases)
        self.calls = SessionCalls(backend, leases, self.flow, self.tasks.policy)
        self.life = SessionLife(backend, sessions, conf, self.tasks, self.calls, resume)
        self.sessions = sessions
        self.webhooks_allowed = tuple(conf.webhooks_allowed)
        self.curation = policies.curation(backend.name)

    # -- POST ------------------------------------------------------------------------------
    async def post(self, request: web.Request, msg: Message, kind: jsonrpc.Kind
                   ) -> web.StreamResponse:
        if kind == "request" and msg["method"] == mcp.INITIALIZE:
            return await self.initialize(request, msg)
        session = await self.session_of(request)
        if kind != "response" and names_a_task(msg):
            msg = await self.own_references(session, msg)
        if kind == "notification":
            self.on_notification(session, msg)
            resp: web.StreamResponse = web.Response(status=202)
        elif kind == "response":
            await self.on_reply(session, msg)
            resp = web.Response(status=202)
        else:
            resp = await self.on_request(request, session, msg)
        return _naming(resp, session)

    async def initialize(self, request: web.Request, msg: Message) -> web.StreamResponse:
        params = msg.get("params")
        if not isinstance(params, dict) or not isinstance(params.get("capabilities", {}), dict):
            return json_response(jsonrpc.error(msg["id"], jsonrpc.INVALID_PARAMS,
                                               "Invalid params: initialize needs params"))
        version = router.negotiate(params.get("protocolVersion"))
        info = params.get("clientInfo")
        session = self.life.new(version, params.get("capabilities") or {},
                                principal_of(request).owner, info)
        if not self.life.keepable(session):  # 400: no session was made (docs/limits.md)
            return json_response(jsonrpc.error(msg["id"], jsonrpc.INVALID_PARAMS, (
                "Invalid params: the client's capabilities are too large to keep for its "
                f"session (at most {MAX_RECORD_BYTES} bytes as JSON with its clientInfo's "
                "name, title and version)")), 400)
        refused = await self.life.admit(session)
        if refused is not None:
            self.backend.counters.reject("sessions")
            log.warning("session.refused", principal=session.principal[:12],
                        reason=refused.message, upstream=self.backend.name)
            return json_response(refused.to_message(msg["id"]), refused.http_status)
        try:
            # What the server said when the session was attached: read later, it could be
            # gone (the process lost meanwhile).
            server = await self.life.attach(session)
        except UpstreamError as exc:
            await self.life.unadmit(session)  # its client never got its id
            return json_response(exc.to_message(msg["id"]), 503)
        log.info("session.created", session=session.owner[:12], protocol=version,
                 upstream=self.backend.name,
                 client=info.get("name") if isinstance(info, dict) else None)
        self.backend.counters.sessions_created += 1
        result = shapes.initialize_result(server, version)
        return json_response(jsonrpc.result(msg["id"], result), headers={mcp.H_SESSION: session.id})

    async def on_request(self, request: web.Request, session: Session, msg: Message
                         ) -> web.StreamResponse:
        client_id = msg["id"]
        # A tool called by the server's name from here on (tasks/curation.py).
        msg, masked = self.curation.request(msg) if self.curation.active else (msg, None)
        lacking = scopes_checked(request, msg, self.tasks.policy)  # InsufficientScope: 403
        decision = self.decide(session, msg)
        edit: Edit | None = None
        push = None  # a webhook the call asks for its task (push/client.py)
        if msg["method"] == mcp.TOOLS_CALL and not isinstance(decision, router.Refuse):
            try:
                msg, push = client.taken(msg, self.webhooks_allowed)
            except errors.InvalidParams as exc:  # a JSON-RPC error, as a server's
                return json_response(exc.to_message(client_id))
        match decision:
            case router.Refuse(error=error):  # a JSON-RPC error: HTTP 200, as a server's
                return json_response(error.to_message(client_id))
            case router.Answer(result=result):
                return json_response(jsonrpc.result(client_id, result))
            case router.SetLevel(level=level):
                session.set_level(level)
                return json_response(jsonrpc.result(client_id, {}))
            case router.Subscription():
                if self._subscription(session, msg):
                    return json_response(jsonrpc.result(client_id, {}))
                if msg["method"] == mcp.SUBSCRIBE:  # held once the server took it
                    edit = _subscribed(session, msg["params"]["uri"])
            case router.ServeTasks():  # tasks/* of the gateway's core tasks
                return await self.tasks.serve(request, session, msg)
            case router.TaskCall():
                return await self.tasks.call(session, msg, decision,
                                             await self.headers.of(request),
                                             self._key(request, session, msg), push)
            case router.Augment():
                edit = self.tasks.marked_tools()
            case router.Pass():
                if (key := self._key(request, session, msg)) is not None:
                    return await self.tasks.keyed(request, session, msg, key, lacking,
                                                  await self.headers.of(request), push)
            case _:
                assert_never(decision)
        if lacking is not None and msg["method"] == mcp.TOOLS_LIST:
            edit = _then_hide(edit, lacking)
        if self.curation.active and msg["method"] == mcp.TOOLS_LIST:
            edit = _then(edit, self.curation.listed)
        if masked is not None:  # answered as an unknown tool is, under the name called
            edit = _then(edit, lambda m: unmask(m, masked))
        headers = await self.headers.of(request)
        return await self.calls.forward(request, session, msg, edit, headers)

    def _key(self, request: web.Request, session: Session, msg: Message) -> CallKey | None:
        """A tools/call's Idempotency-Key, kept for whoever sees the session's tasks (with
        auth its principal; without, the session); None for a call the upstream runs as a
        task of its own (its task, not the gateway's, is the call: the key is not used)."""
        params = msg.get("params")
        if msg["method"] != mcp.TOOLS_CALL or not isinstance(params, dict) or (
                core.is_task_call(params)
                and self.backend.catalogue.own_task_support(params.get("name"))):
            return None
        return call_key(request, msg, session.task_owner, self.backend.name, core.NAME)

    async def own_references(self, session: Session, msg: Message) -> Message:
        """`msg`, whose related-task reference (a request's or a notification's) stays only
        for a task of its own (references.py): the gateway's, or the upstream's that this
        session's principal (without auth: this session) created."""
        upstream = session.conn.task_owners
        held = upstream.held_by(session)

        def theirs(task_id: str) -> bool:
            if self.life.by_principal:  # with auth, the principal's tasks (as the engine's)
                return upstream.owns(task_id, session.principal)
            return task_id in held

        return await own_references(msg, session.task_owner, theirs, self.tasks.engine,
                                    self.backend.name)

    def decide(self, session: Session, msg: Message) -> router.LegacyDecision:
        conn = session.conn
        return router.legacy(msg, in_flight=msg["id"] in session.calls,
                             core_tasks=core.offered(session.version),
                             keeps_level=conn.modern or conn.logs,
                             native_task_ids=conn.task_owners.held_by(session),
                             catalogue=self.backend.catalogue, policy_for=self.tasks.policy)

    def _subscription(self, session: Session, msg: Message) -> bool:
        """True when the gateway answers a (un)subscribe itself: the upstream holds one
        subscription per URI for all sessions, so only the first subscribe and the last
        unsubscribe of a holder reach it."""
        uri = msg["params"]["uri"]  # a string: the router said so
        if msg["method"] == mcp.SUBSCRIBE:
            return not session.subscribe(uri)
        return not session.unsubscribe(uri)

    def on_notification(self, session: Session, msg: Message) -> None:
        method = msg["method"]
        if method in router.SWALLOWED_NOTIFICATIONS:
            return
        if method == mcp.CANCELLED:
            params = msg.get("params")
            if isinstance(params, dict):
                self.calls.cancelled(session, params.get("requestId"), params.get("reason"))
            return
        session.conn.notify(msg)

    async def on_reply(self, session: Session, msg: Message) -> None:
        # Only what was asked of this session is answered from it (docs/architecture.md, Tenancy).
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
        found = await self.life.to_end(sid, principal)
        if found is None:
            raise _not_found()
        _check_version(request)
        if isinstance(found, Session):
            await self.life.end(found, "deleted")
        else:  # held by another replica, or by one gone
            await self.life.end_elsewhere(sid, principal)
        return web.Response(status=200)

    async def expire(self) -> None:
        await self.life.expire()

    # -- checks ----------------------------------------------------------------------------
    async def session_of(self, request: web.Request) -> Session:
        sid, principal = _session_id(request), principal_of(request).owner
        # A session is bound to the auth context that created it (and so are its tasks):
        # another principal's is not found (SessionLife.find).
        session = await self.life.find(sid, principal)
        if session is None:
            raise _not_found()
        _check_version(request)
        return session


def _naming(resp: web.StreamResponse, session: Session) -> web.StreamResponse:
    """`resp` naming its session. Every answer does, so a balancer that learns affinity from
    answers (deploy/haproxy.cfg: stick store-response) learns the replica that adopted it at
    its first answer, a JSON one or a 202 included. The spec asks the header of the
    initialize answer and forbids it on none; clients keep the id they hold (the same)."""
    if not resp.prepared:  # an SSE answer's headers are sent: they carry it already
        resp.headers[mcp.H_SESSION] = session.id
    return resp


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


def _subscribed(session: Session, uri: str) -> Edit:
    """On the answer to a subscribe that went upstream: the session told whether the server
    took it."""
    def settle(msg: Message) -> Message:
        session.subscribed(uri, "error" not in msg)
        return msg
    return settle


def _then(edit: Edit | None, after: Edit) -> Edit:
    """`edit`, then `after`."""
    return (lambda msg: after(edit(msg))) if edit else after


def _then_hide(edit: Edit | None, lacking: Lacking) -> Edit:
    """`edit`, then the tools the caller may not call taken out of the list."""
    def hide(msg: Message) -> Message:
        return shapes.hide_tools(edit(msg) if edit else msg, lacking)
    return hide


__all__ = ["LegacyEra", "error_response"]
