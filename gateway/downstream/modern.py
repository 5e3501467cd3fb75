"""The modern era (protocol 2026-07-28) on Streamable HTTP, bridged onto legacy upstreams.

Every request is self-contained: its `_meta` carries the protocol version and the client's
capabilities, its headers mirror the method and name. No sessions: `Mcp-Session-Id` is
ignored, GET and DELETE answer 405 (see `endpoint`). The upstream's requests to the client
become MRTR rounds (`mrtr`); progress and log messages flow on the request's own SSE stream;
closing that stream cancels the call upstream.

spec: 2026-07-28/01-basic-index, 02-versioning, 05-streamable-http, 08-mrtr, 10-12.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any, assert_never

from aiohttp import web

from gateway import errors, router
from gateway.auth.replicas import ReplicaSeals
from gateway.auth.token_exchange import TokenExchanger
from gateway.downstream import envelope, shapes, sse
from gateway.downstream.boundary import (
    ACCEPTS,
    UpstreamHeaders,
    json_response,
    principal_of,
    queue_ticket,
    scopes_checked,
)
from gateway.downstream.envelope import Caller
from gateway.downstream.exchange import Exchange, send_held
from gateway.downstream.handoff import Handoff
from gateway.downstream.listen import Listeners
from gateway.downstream.mrtr import Parked, ParkedCalls, Sealer, digest
from gateway.downstream.references import own_references
from gateway.downstream.rounds import Elsewhere, Rounds
from gateway.observability import log
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.ratelimit import InFlight
from gateway.settings.schema import Settings
from gateway.tasks.dialects import (
    Lacking,
    extension,
    handlers,
    task_id_of,
    unscoped,
    watch_progress,
)
from gateway.tasks.engine import Handover, Intent, StoreFull, TaskEngine
from gateway.tasks.model import Task
from gateway.tasks.policy import Policies, Policy
from gateway.upstream import native_tasks
from gateway.upstream.connection import Connection
from gateway.upstream.correlator import Call
from gateway.upstream.isolation import Backend

INPUT_BATCH_S = 0.02  # server requests arriving this close together share one round


class ModernExchange(Exchange):
    """A modern request in flight: request-scoped notifications only, server requests turned
    into an `input_required` round, results made modern."""

    __slots__ = ("batch", "budget", "call", "caller", "digest", "era", "hidden", "inputs",
                 "method", "own_progress", "parked", "policy", "refused", "rounds", "tool",
                 "uri")
    takes_mrtr = True  # a modern-only upstream's input_required goes to the client as is

    def __init__(self, era: ModernEra, caller: Caller, method: str, digest_: str,
                 sse_ok: bool) -> None:
        super().__init__(sse_ok, lambda: sse.Stream("0", 0), {})
        self.era = era
        self.caller = caller
        self.method = method
        self.digest = digest_
        self.call: Call | None = None
        self.parked: Parked | None = None
        self.inputs: list[Message] = []
        self.refused: dict[str, dict[str, Any]] = {}  # capabilities asked for, not declared
        self.batch: asyncio.TimerHandle | None = None
        self.policy: Policy | None = None  # set when this call may become a task
        self.budget: asyncio.TimerHandle | None = None  # auto mode: then it becomes a task
        self.tool: Any = None
        self.uri: Any = None  # resources/read: named in a not-found error (sep-2164)
        self.own_progress = False  # the gateway asked for progress, not the client
        self.hidden: Lacking | None = None  # tools/list: the tools the caller may not call
        self.rounds = False  # a modern upstream's: its own input_required rounds come back

    def on_message(self, msg: Message) -> None:
        if "id" in msg:  # a server request, routed here because this call is in flight
            if self.call is not None:  # so it is: none is routed before it is sent
                self._input(self.call, msg)
        elif msg.get("method") == mcp.PROGRESS:
            if not self.own_progress:
                super().on_message(msg)
        elif msg.get("method") == mcp.LOG_MESSAGE:
            params = msg.get("params")
            level = params.get("level") if isinstance(params, dict) else None
            if shapes.log_wanted(level, self.caller.log_level):
                super().on_message(msg)
        # Anything else is not about this request; listen streams carry change notifications.

    def on_response(self, msg: Message) -> None:
        if self.batch is not None:
            self.batch.cancel()
        self.stop_budget()
        if self.refused and not self.inputs and "error" in msg and self.call is not None:
            self._missing_capability(self.call)  # it failed for want of what the client lacks
            return
        if self.rounds:
            self.era.rounds.seal_state(msg, self.caller.principal, self.method, self.digest)
        if self.method == mcp.TOOLS_LIST:
            self.era.backend.learn_tools(msg)
            if self.hidden is not None:
                msg = shapes.hide_tools(msg, self.hidden)
        msg, status = shapes.modern_response(self.method, msg, self.era.server_info,
                                             self.era.ttl_ms, self.era.scope, self.uri)
        self.answer(msg, status)

    def on_refused(self, capability: str) -> None:
        """The upstream asked for input this request's client did not declare (it got an
        error answer). Decided with the rest of the batch: see `_ask`."""
        self.refused[capability] = {}
        self._batch()

    def _missing_capability(self, call: Call) -> None:
        call.conn.cancel(call, "the client lacks a capability this call needs")
        err = errors.MissingCapability(
            f"Missing required client capability: {', '.join(self.refused)}",
            {"requiredCapabilities": self.refused})
        self.answer(err.to_message(call.client_id), err.http_status)

    def _input(self, call: Call, msg: Message) -> None:
        if self.method not in mcp.MRTR_METHODS:  # spec MRTR: only these may ask for input
            call.conn.reply(msg["id"], jsonrpc.error(
                msg["id"], jsonrpc.METHOD_NOT_FOUND, f"{self.method} cannot ask for input"),
                call.owner)
            return
        self.inputs.append(msg)
        # spec (tasks extension): resolve MRTR exchanges before creating a task.
        self.stop_budget()
        self._batch()

    def _batch(self) -> None:
        if self.batch is None:
            self.batch = asyncio.get_running_loop().call_later(INPUT_BATCH_S, self._ask)

    def _ask(self) -> None:
        """Park the upstream call and answer with an input_required round for the input the
        client declared. A request for what it did not declare was refused upstream; the
        call goes on, and only if it then fails is that -32021 (spec 2026-07-28 basic:
        MissingRequiredClientCapability; see on_response): servers ask for optional things
        (server-everything asks every client for its roots) and cope without them.
        """
        self.batch = None
        if self.response is not None or self.call is None or not self.inputs:
            return
        parked = self.parked or Parked(secrets.token_urlsafe(16), self.call,
                                       self.caller.principal, self.method, self.digest)
        for msg in self.inputs:
            parked.add_input(msg)
        self.inputs.clear()
        parked.done, self.done = self.done, None  # the call is not over: keep its process
        parked.policy, parked.own_progress = self.policy, self.own_progress
        self.era.rounds.ask(self, parked, self.call.client_id)

    async def handover(self, task: Task) -> Handover | None:
        """This call, for its new task; None if it answered while the store wrote."""
        if self.response is not None or self.call is None:
            return None
        # Input asked while the store wrote (a shared store takes a round trip) is the
        # task's now, not an input_required round of this request.
        if self.batch is not None:
            self.batch.cancel()
            self.batch = None
        pending, self.inputs = self.inputs, []
        handover = Handover(self.call, done=self.done, pending=pending)
        self.done = None
        return handover

    def start_budget(self) -> None:
        if self.policy is not None and self.response is None:
            self.budget = asyncio.get_running_loop().call_later(
                self.policy.sync_budget_ms / 1000, self.era.task_soon, self)

    def stop_budget(self) -> None:
        if self.budget is not None:
            self.budget.cancel()
            self.budget = None

    def time_out_after(self, seconds: float) -> None:
        """`request_timeout_ms`: the call is cancelled upstream if not answered by then."""
        self.timer = asyncio.get_running_loop().call_later(seconds, self._timed_out, seconds)

    def _timed_out(self, seconds: float) -> None:
        if self.response is not None or self.call is None:
            return
        self.stop_budget()
        self.call.conn.cancel(self.call, "timed out at the gateway")
        name = self.era.backend.name
        log.warning("request.timed_out", upstream=name, era="modern")
        self.answer(errors.UpstreamTimeout.timed_out(name, seconds).to_message(self.call.client_id))


class ModernEra:
    """Handles modern-era requests for one upstream."""

    def __init__(self, backend: Backend, conf: Settings, sealer: Sealer, engine: TaskEngine,
                 policies: Policies, inflight: InFlight,
                 exchanger: TokenExchanger | None = None,
                 seals: ReplicaSeals | None = None) -> None:
        self.backend = backend
        self.headers = UpstreamHeaders(backend, exchanger)
        self.inflight = inflight
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
        self._jobs: set[asyncio.Task[None]] = set()  # tasks being made after a budget ran out

    @property
    def server_info(self) -> Any:
        init = self.backend.primary.init_result
        return init.get("serverInfo") if init else None

    async def post(self, request: web.Request, msg: Message, kind: jsonrpc.Kind
                   ) -> web.StreamResponse:
        if kind == "notification":
            return web.Response(status=202)  # none are defined for HTTP in this revision
        if kind == "response":
            raise errors.InvalidRequest("Invalid Request: modern clients send no responses; "
                                        "answer input requests with inputResponses")
        caller = envelope.check(request, msg, self.backend.catalogue)
        lacking = scopes_checked(request, msg, self.policy)  # InsufficientScope: 403
        try:
            ready = await self.backend.for_principal(caller.principal)
        except errors.UpstreamError as exc:  # it cannot start: 503, as a legacy initialize
            return json_response(exc.to_message(msg["id"]), 503)
        conn = ready.conn
        # A related-task reference stays only for the caller's own task (references.py).
        await own_references(msg, caller.principal,
                             lambda task_id: conn.correlator.tasks.owns(task_id,
                                                                        caller.principal),
                             self.engine, self.backend.name)
        decision = await self.decide(msg, caller, conn)
        match decision:
            case router.Refuse(error=error):
                raise error
            case router.Discover():  # what the server said when found ready
                return json_response(jsonrpc.result(msg["id"], shapes.discover_result(
                    ready.init_result, self.ttl_ms, self.scope)))
            case router.ServeTasks():  # a finished task's result inlined: held, as an answer
                self.engine.admit(caller.principal)
                return await send_held(request, jsonrpc.result(
                    msg["id"], await handlers.extension_request(
                        self.engine, msg["method"], msg.get("params") or {}, caller.principal,
                        lacking or unscoped)), self.flow,
                    self.inflight.answers.hold(caller.principal))
            case router.Listen():
                return await self.listeners.listen(request, msg, caller, ready, self.engine)
            case router.Resume():
                return await self.resume(request, msg, caller)
            case router.Pass() | router.TaskCall():
                return await self.forward(request, msg, caller, conn, decision, lacking)
            case _:
                assert_never(decision)

    def policy(self, tool: Any) -> Policy:
        return self.policies.for_tool(self.backend.name, str(tool or ""))

    async def decide(self, msg: Message, caller: Caller, conn: Connection
                     ) -> router.ModernDecision:
        method, params = msg["method"], msg.get("params") or {}
        if conn.modern and self.rounds.gateways_own(msg, caller.principal):
            return router.Resume()  # its call is parked here: see `forward`, `ex.rounds`
        # Only a modern upstream has tasks of its own that tasks/* could name instead.
        theirs = method.startswith(router.TASKS_PREFIX) and conn.modern and \
            conn.correlator.tasks.owns(task_id_of(params), caller.principal)
        return router.modern(msg, capabilities=caller.capabilities,
                             modern_upstream=conn.modern, upstream_task=theirs,
                             catalogue=self.backend.catalogue, policy_for=self.policy)

    # -- forwarding ------------------------------------------------------------------------
    async def forward(self, request: web.Request, msg: Message, caller: Caller,
                      conn: Connection, decision: router.Pass | router.TaskCall,
                      lacking: Lacking | None
                      ) -> web.StreamResponse:
        json_ok, sse_ok = request[ACCEPTS]
        method, params = msg["method"], msg.get("params") or {}
        ex = ModernExchange(self, caller, method, digest(method, params), sse_ok)
        ex.hold = self.inflight.answers.hold(caller.principal)
        ex.hidden = lacking
        # Only a call the router let become a task has a policy (and may become one).
        task = decision if isinstance(decision, router.TaskCall) else None
        ex.policy = task.policy if task is not None else None
        ex.tool, ex.uri = params.get("name"), params.get("uri")
        # A modern upstream runs its own MRTR rounds: their fields go to it as they are, but
        # the state is the server's only under the gateway's seal (see `seal_state`).
        if conn.modern and "requestState" in params:
            params = {**params, "requestState": self.rounds.open_state(params, caller.principal,
                                                                       method)}
        headers = await self.headers.of(request)  # AuthUnavailable: 503
        self.inflight.take(caller.principal)  # TooManyRequests: 429
        try:
            used = await self.backend.for_request(conn, caller, method)
        except errors.UpstreamError as exc:  # nothing was sent: 503, as to an initialize
            self.inflight.release(caller.principal)
            return json_response(exc.to_message(msg["id"]), 503)
        except BaseException:  # cancelled while it waited for a process: its slot goes
            self.inflight.release(caller.principal)
            raise
        self._shape(ex, msg, params, used, decision.follow)
        try:
            ticket = queue_ticket(self.backend, caller.principal, msg, self.policy)  # 503
            ex.call = used.request(msg, caller, ex, headers, decision.follow, ticket)
        except errors.UpstreamError as exc:  # not sent: the upstream cannot take calls now
            self._done(caller, conn, used)
            return json_response(exc.to_message(msg["id"]), 503)
        except BaseException:  # QueueFull (503), or a fault of the gateway's: the slot goes
            self._done(caller, conn, used)
            raise
        ex.done = lambda: self._done(caller, conn, used)
        if not ex.own_progress:  # the client's own token: a quiet call tells it it runs
            ex.heartbeat(ex.call.progress_token, self.flow, ticket)
        # A call that must wait its turn is a task at once for a caller that can take one.
        if (task is not None and task.at_once) or (ticket is not None and ticket.queued):
            await self.to_task(ex)
        else:
            ex.start_budget()
        return await self._respond(request, ex, json_ok)

    @staticmethod
    def _shape(ex: ModernExchange, msg: Message, params: dict[str, Any], used: Connection,
               follow: bool) -> None:
        """`msg` as the connection `used` takes it: its params in that upstream's era, the
        tasks extension kept from a modern upstream where the gateway decides about tasks,
        and progress asked for where the call may become a task."""
        ex.rounds = used.modern  # `isolation: call`: a legacy process (Rounds.gateways_own)
        msg["params"] = upstream_params = shapes.to_upstream(params, used.modern)
        if ex.policy is not None and used.modern:
            # The gateway decides about tasks here: the upstream must not make its own.
            ex.caller.capabilities = extension.without(ex.caller.capabilities)
        if follow:
            native_tasks.ask_for_task(upstream_params)
        if ex.policy is not None:
            ex.own_progress = watch_progress(upstream_params)

    def _done(self, caller: Caller, conn: Connection, used: Connection) -> None:
        """The call is over (answered, or its task ended): its process and its slot go."""
        self.backend.done(conn, used)
        self.inflight.release(caller.principal)

    # -- tasks (the io.modelcontextprotocol/tasks extension) --------------------------------
    def task_soon(self, ex: ModernExchange) -> None:
        """The sync budget ran out: the call becomes a task (unless it answers first)."""
        job = asyncio.get_running_loop().create_task(self.to_task(ex))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def to_task(self, ex: ModernExchange) -> None:
        """Answer `ex` with a task and let its call go on in the background. The task is in
        the store before the CreateTaskResult is sent (spec: durably created)."""
        ex.budget = None
        if ex.response is not None or ex.call is None or ex.policy is None:
            return
        tool, client_id = str(ex.tool or ""), ex.call.client_id  # the call goes to its task
        intent = Intent(ex.caller.principal, tool, extension.NAME, self.backend.name, ex.policy)
        try:
            task = await self.engine.adopt(intent, ex.handover)
        except StoreFull as exc:  # never evict a live task: answer inline instead
            self.backend.counters.tasks_inline_store_full += 1
            log.warning("task.store_full", tool=tool, reason=str(exc),
                        upstream=self.backend.name)
            return
        except errors.StoreUnavailable as exc:  # the extension lets the gateway answer inline
            self.backend.counters.tasks_inline_store_unavailable += 1
            log.warning("task.store_unavailable", tool=tool, reason=exc.detail,
                        upstream=self.backend.name)
            return
        except errors.TooManyRequests as exc:  # the extension lets the gateway answer inline
            log.warning("task.rate_limited", tool=tool, reason=exc.message,
                        upstream=self.backend.name)
            return
        if task is not None:
            ex.answer(jsonrpc.result(client_id, extension.created(task)))

    async def _respond(self, request: web.Request, ex: ModernExchange, json_ok: bool
                       ) -> web.StreamResponse:
        if self.request_timeout_s is not None and ex.response is None and ex.call is not None:
            seconds = self.request_timeout_s  # from when the call runs: a queue is not counted
            ex.call.when_running(lambda: ex.time_out_after(seconds))
        try:
            return await ex.respond(request, json_ok, self.flow)
        except asyncio.CancelledError:
            # spec 2026-07-28 Streamable HTTP, Cancellation: closing the response stream
            # MUST be treated as cancelling the request.
            if ex.response is None and ex.call is not None:
                ex.call.conn.cancel(ex.call, "the client closed the request's stream")
                done, ex.done = ex.done, None  # once: it frees the call's process and slot
                if done is not None:
                    done()
            raise
        finally:
            # The call and its exchange name each other: a cycle only the garbage collector
            # frees, which may not run for a long time on a quiet gateway, and meanwhile the
            # answer stays held (many MiB for a big result a slow reader never took).
            ex.call = None

    # -- MRTR ------------------------------------------------------------------------------
    async def resume(self, request: web.Request, msg: Message, caller: Caller
                     ) -> web.StreamResponse:
        """A retry with `requestState`: its parked call goes on, on this replica's
        exchange for the retry, or the retry goes to the replica that holds it."""
        json_ok, sse_ok = request[ACCEPTS]
        method, params = msg["method"], msg["params"]
        parked = self.rounds.claim(msg, caller.principal)
        if isinstance(parked, Elsewhere):
            return await self.handoff.to(parked.replica, parked.url, request, msg,
                                         principal_of(request))
        call = parked.call
        call.conn.redirect(call, parked, client_id=msg["id"])  # parked hears it still
        ex = ModernExchange(self, caller, method, parked.digest, sse_ok)
        ex.hold = self.inflight.answers.hold(caller.principal)
        ex.call, ex.parked, ex.done, ex.policy = call, parked, parked.done, parked.policy
        ex.tool, ex.uri, ex.own_progress = params.get("name"), params.get("uri"), \
            parked.own_progress
        if parked.response is not None:
            ex.on_response({**parked.response, "id": msg["id"]})
        elif parked.inputs:  # answers missing: ask again for what is left (spec MRTR)
            ex.done = None
            self.rounds.ask(ex, parked, msg["id"])
        else:
            call.conn.redirect(call, ex)
            ex.start_budget()  # MRTR first, then the call may still become a task
        return await self._respond(request, ex, json_ok)

    def close(self) -> None:
        self.rounds.close()
        self.listeners.close()
