"""The modern era (protocol 2026-07-28) on Streamable HTTP, bridged onto legacy upstreams.

Every request is self-contained: its `_meta` carries the protocol version and the client's
capabilities, its headers mirror the method and name. No sessions: `Mcp-Session-Id` is
ignored, GET and DELETE answer 405 (see `endpoint`). The upstream's requests to the client
become MRTR rounds (`mrtr`); progress and log messages flow on the request's own SSE stream;
closing that stream cancels the call upstream.

A request's route (connection and era) is resolved first, its requestState opened once
(rounds.py), then the router decides on those facts; a forwarded request is described
whole (envelope.ModernRequest) and carried by its exchange (modern_exchange.py).

spec: 2026-07-28/01-basic-index, 02-versioning, 05-streamable-http, 08-mrtr, 10-12.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, assert_never

import orjson
from aiohttp import web

from gateway import errors, router
from gateway.auth.replicas import ReplicaSeals
from gateway.auth.token_exchange import TokenExchanger
from gateway.downstream import envelope, shapes, sse
from gateway.downstream.boundary import (
    ACCEPTS,
    UpstreamHeaders,
    call_key,
    json_response,
    principal_of,
    scopes_checked,
)
from gateway.downstream.envelope import Caller, ModernRequest
from gateway.downstream.exchange import send_held
from gateway.downstream.handoff import Handoff
from gateway.downstream.leases import Leases
from gateway.downstream.listen import Listeners
from gateway.downstream.modern_exchange import ModernExchange
from gateway.downstream.modern_tasks import Asked, Keyed, ModernTasks
from gateway.downstream.mrtr import ParkedCalls, Sealer
from gateway.downstream.references import names_a_task, own_references
from gateway.downstream.rounds import Elsewhere, Rounds, TheirRound
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.push import client
from gateway.settings.schema import Settings
from gateway.tasks.dialects import (
    Lacking,
    extension,
    handlers,
    task_id_of,
    unscoped,
    watch_progress,
)
from gateway.tasks.engine import TaskEngine
from gateway.tasks.policy import Policies, Policy
from gateway.upstream import native_tasks
from gateway.upstream.connection import Connection
from gateway.upstream.isolation import Backend, Route


@dataclass(frozen=True, slots=True)
class Forward:
    """How one decided request is forwarded: who asks, by which route, what the router
    decided and what the caller may not see, and a modern upstream's own round it retries."""

    caller: Caller
    route: Route
    decision: router.Pass | router.TaskCall
    lacking: Lacking | None
    theirs: TheirRound | None
    masked: str | None = None  # the name called, when no client may call it (curation.py)


class ModernEra:
    """Handles modern-era requests for one upstream."""

    def __init__(self, backend: Backend, conf: Settings, sealer: Sealer, engine: TaskEngine,
                 policies: Policies, leases: Leases,
                 exchanger: TokenExchanger | None = None,
                 seals: ReplicaSeals | None = None) -> None:
        self.backend = backend
        self.headers = UpstreamHeaders(backend, exchanger)
        self.leases = leases
        self.engine = engine
        self.policies = policies
        self.flow = sse.Flow.of(conf)
        self.ttl_ms = conf.caching.ttl_ms
        self.scope = conf.caching.scope
        self.handoff = Handoff(seals or ReplicaSeals(None))
        timeout_ms = backend.conf.request_timeout_ms
        self.request_timeout_s = timeout_ms / 1000 if timeout_ms else None
        parked = ParkedCalls(conf.limits.max_parked, conf.limits.park_timeout_ms / 1000,
                             conf.limits.max_parked_per_principal)
        self.rounds = Rounds(sealer, parked, engine.replica, conf.replica_url or "",
                             backend.name, backend.counters)
        self.listeners = Listeners(conf.limits.max_listeners_per_owner, self.flow,
                                   conf.limits.max_listeners)
        self.tasks = ModernTasks(backend, engine, self.policy, self.flow, leases)
        self.webhooks_allowed = tuple(conf.webhooks_allowed)
        self.curation = policies.curation(backend.name)
        # Tools that need scopes: tools/list differs from one token to another.
        self.lists_vary = bool(policies.scopes(backend.name))

    @property
    def server_info(self) -> object:
        init = self.backend.primary.init_result
        return init.get("serverInfo") if init else None

    async def post(self, request: web.Request, msg: Message, kind: jsonrpc.Kind
                   ) -> web.StreamResponse:
        if kind == "notification":
            return web.Response(status=202)  # none are defined for HTTP in this revision
        if kind == "response":
            raise errors.InvalidRequest("Invalid Request: modern clients send no responses; "
                                        "answer input requests with inputResponses")
        caller = envelope.check(request, msg, self.backend.catalogue, self.curation)
        msg, masked = self.curation.request(msg) if self.curation.active else (msg, None)
        lacking = scopes_checked(request, msg, self.policy)  # InsufficientScope: 403
        if (kept := self.kept(msg, caller, lacking)) is not None:
            match router.modern_held(msg, capabilities=caller.capabilities):
                case router.Refuse(error=error):
                    raise error
                case router.ServeTasks():
                    self.engine.admit(caller.principal)  # the tasks/* rate, as elsewhere
                    return await send_held(request, jsonrpc.result(msg["id"], kept),
                                           self.flow, self.leases.answers.hold(
                                               caller.principal))
        try:  # the route first: the decision depends on its era
            route = await self.backend.for_principal(caller.principal)
        except errors.UpstreamError as exc:  # it cannot start
            return await self.unrouted(request, msg, caller, lacking, exc)
        # Its requestState, opened here once (InvalidParams: forged, expired, another's).
        retry = self.rounds.opened(msg, caller.principal, route.modern)
        if names_a_task(msg):
            msg = await self.own_references(msg, caller.principal, route.conn)
        decision = self.decide(msg, caller, route, retry)
        match decision:
            case router.Refuse(error=error):
                raise error
            case router.Discover():  # what the server said when found ready
                return json_response(jsonrpc.result(msg["id"], shapes.discover_result(
                    route.init_result, self.ttl_ms, self.scope)))
            case router.ServeTasks():
                return await self.serve_tasks(request, msg, caller, lacking)
            case router.Listen():
                return await self.listeners.listen(request, msg, caller, route, self.engine)
            case router.Resume(round=retried):
                return await self.resume(request, msg, caller, retried)
            case router.Pass() | router.TaskCall():
                theirs = retry if isinstance(retry, TheirRound) else None
                return await self.forward(request, msg, Forward(caller, route, decision,
                                                                lacking, theirs, masked))
            case _:
                assert_never(decision)

    async def own_references(self, msg: Message, principal: str, conn: Connection
                             ) -> Message:
        """`msg`, whose related-task reference stays only for the caller's own task: the
        gateway's, or one it created on the upstream (references.py)."""
        return await own_references(
            msg, principal, lambda task_id: conn.task_owners.owns(task_id, principal),
            self.engine, self.backend.name)

    def policy(self, tool: str) -> Policy:
        return self.policies.for_tool(self.backend.name, tool)

    async def serve_tasks(self, request: web.Request, msg: Message, caller: Caller,
                          lacking: Lacking | None) -> web.StreamResponse:
        """tasks/* of the gateway's own tasks, from the engine (a finished task's result
        inlined: held, as an answer is)."""
        self.engine.admit(caller.principal)
        result = await handlers.extension_request(self.engine, msg["method"],
                                                  msg.get("params") or {}, caller.principal,
                                                  lacking or unscoped)
        return await send_held(request, jsonrpc.result(msg["id"], result), self.flow,
                               self.leases.answers.hold(caller.principal))

    async def unrouted(self, request: web.Request, msg: Message, caller: Caller,
                       lacking: Lacking | None, down: errors.UpstreamError
                       ) -> web.StreamResponse:
        """The server cannot be reached now (it cannot start): what the gateway answers
        by itself still is, the router's refusals and tasks/* of a task the engine holds
        for the caller (its handle was returned: it stays reachable, issue 51); anything
        else, and a task id the engine does not hold (it may be the server's own), is a
        503, as a legacy initialize gets."""
        held = msg["method"] in extension.METHODS and await self.engine.holds(
            task_id_of(msg.get("params") or {}), caller.principal)
        decision = router.modern_held(msg, capabilities=caller.capabilities) if held else \
            router.modern(msg, capabilities=caller.capabilities, modern_upstream=False,
                          upstream_task=False, catalogue=self.backend.catalogue,
                          policy_for=self.policy)
        match decision:
            case router.Refuse(error=error):
                raise error
            case router.ServeTasks() if held:
                return await self.serve_tasks(request, msg, caller, lacking)
        return json_response(down.to_message(msg["id"]), 503)

    def kept(self, msg: Message, caller: Caller, lacking: Lacking | None
             ) -> orjson.Fragment | None:
        """A tasks/get of the caller's finished task as its first read answered it
        (tasks/kept.py: the task cannot have changed), for the router's early step to
        decide on. Anything else (a retry's state to open) takes the ordinary path."""
        if msg["method"] != extension.GET:  # every modern request asks: the cheap test first
            return None
        params = msg.get("params") or {}
        if "requestState" in params:
            return None
        return handlers.kept(self.engine, extension.NAME, extension.GET, params,
                             caller.principal, lacking or unscoped)

    def decide(self, msg: Message, caller: Caller, route: Route,
               retry: router.OwnRound | TheirRound | None) -> router.ModernDecision:
        """The router's decision on the facts found before it: the route's era, whose
        task a tasks/* names, and the round a retry's state names."""
        method, params = msg["method"], msg.get("params") or {}
        # Only a modern upstream has tasks of its own that tasks/* could name instead.
        theirs = method.startswith(router.TASKS_PREFIX) and route.modern and \
            route.conn.task_owners.owns(task_id_of(params), caller.principal)
        return router.modern(msg, capabilities=caller.capabilities,
                             modern_upstream=route.modern, upstream_task=theirs,
                             catalogue=self.backend.catalogue, policy_for=self.policy,
                             retry=retry if isinstance(retry, router.OwnRound) else None)

    # -- forwarding ------------------------------------------------------------------------
    async def forward(self, request: web.Request, msg: Message, how: Forward
                      ) -> web.StreamResponse:
        json_ok, sse_ok = request[ACCEPTS]
        principal, decision = how.caller.principal, how.decision
        # BadIdempotencyKey: 400
        key = call_key(request, msg, principal, self.backend.name, extension.NAME)
        asked = Asked.of(msg["params"]) if key is not None else None  # the client's params
        push = None  # a webhook for its task (push/client.py; InvalidParams: 400)
        if msg["method"] == mcp.TOOLS_CALL:
            msg, push = client.taken(msg, self.webhooks_allowed)
        described, msg = self._described(msg, how, push)  # from here, as the upstream takes it
        headers = await self.headers.of(request)  # AuthUnavailable: 503
        if key is not None and asked is not None:  # run once, as a task (tasks/keys.py)
            return await self.tasks.keyed(request, msg, described, Keyed(
                key, asked, how.route.conn, headers, decision))
        # TooManyRequests (429), GatewayStopping (503): raised, nothing held
        at_once = isinstance(decision, router.TaskCall) and decision.at_once
        with self.leases.take(principal, described.method) as lease:
            if isinstance(decision, router.TaskCall) and at_once and json_ok:
                if (created := await self.tasks.first(msg, described, how.route.conn, headers,
                                                      decision, lease)) is not None:
                    return created
                at_once = False  # no task could be made: the call is answered inline
            try:  # UpstreamError: nothing was sent: 503, as to an initialize
                used = await lease.connect(self.backend, how.route.conn, described.caller,
                                           described.method)
                ticket = lease.queue(msg, self.policy)  # QueueFull: 503, raised
                ex = ModernExchange(self, described, sse_ok,
                                    self.leases.answers.hold(principal))
                call = used.request(msg, described.caller, ex, headers, decision.follow,
                                    ticket)
            except errors.UpstreamError as exc:
                return json_response(exc.to_message(described.id), 503)
            ex.sent(call, lease.hand(call))
        if not described.own_progress:  # the client's own token: a quiet call tells it it runs
            ex.heartbeat(call.progress_token, self.flow, ticket)
        # A call that must wait its turn is a task at once for a caller that can take one.
        adopt = at_once or (ticket is not None and ticket.queued)
        if not adopt:
            ex.start_budget()
        return await self._respond(request, ex, json_ok, adopt)

    @staticmethod
    def _described(msg: Message, how: Forward, push: dict[str, Any] | None = None
                   ) -> tuple[ModernRequest, Message]:
        """The request as its exchange holds it, and `msg` as the route's upstream takes it
        (a new message: the client's is left as it came): in its era, a modern upstream's
        own state out of the gateway's seal, the tasks extension kept from a modern upstream
        where the gateway decides about tasks, and progress asked for where the call may
        become a task."""
        method, params = msg["method"], msg.get("params") or {}
        policy = how.decision.policy if isinstance(how.decision, router.TaskCall) else None
        asked = params  # the client's, as its retry repeats them
        if how.theirs is not None:  # a modern upstream runs its own rounds: its own state
            params = {**params, "requestState": how.theirs.state}
        upstream_params = shapes.to_upstream(params, how.route.modern)  # a new dict
        if how.decision.follow:
            native_tasks.ask_for_task(upstream_params)
        # The gateway decides about tasks here: a modern upstream must not make its own.
        caller = how.caller.without_tasks() if policy is not None and how.route.modern \
            else how.caller
        name, uri = params.get("name"), params.get("uri")
        return ModernRequest(
            msg["id"], caller, method, asked, str(name or ""),
            uri if isinstance(uri, str) else None, how.route.modern, policy, how.lacking,
            own_progress=policy is not None and watch_progress(upstream_params),
            push=push, masked=how.masked), \
            {**msg, "params": upstream_params}

    # -- tasks (the io.modelcontextprotocol/tasks extension: modern_tasks.py) -------------
    def task_soon(self, ex: ModernExchange) -> None:
        """The sync budget ran out: the call becomes a task (unless it answers first)."""
        self.tasks.soon(ex)

    async def _respond(self, request: web.Request, ex: ModernExchange, json_ok: bool,
                       adopt: bool = False) -> web.StreamResponse:
        """`ex` answered (`adopt`: made a task first, its handle the answer unless no task
        could be made); however the request ends (answered, its client gone, even while
        its task was written, or cut off as a slow reader), a call still forwarding ends
        with it."""
        if self.request_timeout_s is not None:
            ex.time_out(self.request_timeout_s, self.backend.name, self.flow.late)
        try:
            if adopt:
                await self.tasks.adopt(ex)
            return await ex.respond(request, json_ok, self.flow)
        finally:  # cancelled, or cut off as a slow reader: a call still forwarding ends here
            ex.abandon("the client closed the request's stream, or was cut off")
            ex.let_go()

    # -- MRTR ------------------------------------------------------------------------------
    async def resume(self, request: web.Request, msg: Message, caller: Caller,
                     retry: router.OwnRound) -> web.StreamResponse:
        """A retry of the gateway's own round: its parked call goes on, on this replica's
        exchange for the retry, or the retry goes to the replica that holds it."""
        json_ok, sse_ok = request[ACCEPTS]
        parked = self.rounds.claim(retry, msg["params"])
        if isinstance(parked, Elsewhere):
            return await self.handoff.to(parked.replica, parked.url, request, msg,
                                         principal_of(request))
        call = parked.call
        call.redirect(parked, client_id=msg["id"])  # parked hears it still
        # The same request as the one parked (its digest checked): described anew for
        # this retry's id and caller (its log level, its capabilities).
        described = replace(parked.request, id=msg["id"], caller=caller)
        ex = ModernExchange(self, described, sse_ok,
                            self.leases.answers.hold(caller.principal), parked)
        ex.resume()
        return await self._respond(request, ex, json_ok)

    def close(self) -> None:
        self.rounds.close()
        self.listeners.close()
