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
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Final, assert_never

from aiohttp import web

from gateway import errors, router
from gateway.answer_bytes import Hold
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
from gateway.downstream.envelope import Caller, ModernRequest
from gateway.downstream.exchange import Exchange, send_held
from gateway.downstream.handoff import Handoff
from gateway.downstream.listen import Listeners
from gateway.downstream.mrtr import Parked, ParkedCalls, Sealer, digest
from gateway.downstream.references import own_references
from gateway.downstream.rounds import Elsewhere, Rounds, TheirRound
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
from gateway.upstream.isolation import Backend, Route

INPUT_BATCH_S = 0.02  # server requests arriving this close together share one round


class Life(enum.Enum):
    """Where a modern request's upstream call is, as its exchange sees it."""

    FORWARDING = "forwarding"  # in flight, its exchange the Sink (or about to be sent)
    TASK = "task"  # handed over to a task of its own: the answer is the task's handle
    PARKED = "parked"  # parked for an MRTR round: the answer is input_required
    ANSWERED = "answered"  # its answer is in (the server's, or the gateway's), or its
    # client went away and it was cancelled: either way, over for this request


# h11's `_state.py` way: every move of a request's life in one table, an end moving nowhere.
# A verb whose move is not here does nothing: an answer and a task hand-over race, and the
# first one wins.
MOVES: Final[Mapping[Life, frozenset[Life]]] = MappingProxyType({
    Life.FORWARDING: frozenset({Life.TASK, Life.PARKED, Life.ANSWERED}),
    Life.TASK: frozenset(),
    Life.PARKED: frozenset(),
    Life.ANSWERED: frozenset(),
})


class ModernExchange(Exchange):
    """A modern request in flight: request-scoped notifications only, server requests turned
    into an `input_required` round, results made modern.

    Built whole from its `request` (frozen: what the era decided) and, for an MRTR retry,
    the call it resumes (`parked`); its life (`Life`) changes only by its verbs, along
    `MOVES`."""

    __slots__ = ("_batch", "_budget", "_call", "_inputs", "_life", "_parked", "_refused",
                 "era", "request")
    takes_mrtr = True  # a modern-only upstream's input_required goes to the client as is

    def __init__(self, era: ModernEra, request: ModernRequest, sse_ok: bool, hold: Hold,
                 parked: Parked | None = None) -> None:
        super().__init__(sse_ok, lambda: sse.Stream("0", 0), {})
        self.era = era
        self.request = request
        self.hold = hold
        self._life = Life.FORWARDING
        self._parked = parked  # a retry's: re-parked if the server asks again
        self._call: Call | None = parked.call if parked is not None else None
        self.done = parked.done if parked is not None else None
        self._inputs: list[Message] = []
        self._refused: dict[str, dict[str, Any]] = {}  # capabilities asked, not declared
        self._batch: asyncio.TimerHandle | None = None
        self._budget: asyncio.TimerHandle | None = None  # auto mode: then it becomes a task

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

    def sent(self, call: Call, done: Callable[[], None]) -> None:
        """Its call was sent; `done` frees the call's process and slot once it is over."""
        self._call, self.done = call, done

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
            call.conn.redirect(call, self)
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
    def time_out(self, seconds: float) -> None:
        """`request_timeout_ms`: counted from when the call runs (a queue is not counted),
        the call is cancelled upstream if not answered by then."""
        call = self._call
        if call is not None and self._life is Life.FORWARDING:
            call.when_running(lambda: self._time_out_after(seconds))

    def _time_out_after(self, seconds: float) -> None:
        self.timer = asyncio.get_running_loop().call_later(seconds, self._timed_out, seconds)

    def _timed_out(self, seconds: float) -> None:
        call = self._call
        if call is None or not self._move(Life.ANSWERED):
            return
        self.stop_budget()
        call.conn.cancel(call, "timed out at the gateway")
        name = self.era.backend.name
        log.warning("request.timed_out", upstream=name, era="modern")
        self.answer(errors.UpstreamTimeout.timed_out(name, seconds).to_message(self.request.id))

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

    def let_go(self) -> None:
        """The request is over: the call and its exchange name each other, a cycle only the
        garbage collector frees, which may not run for a long time on a quiet gateway, and
        meanwhile the answer stays held (many MiB for a big result a slow reader never
        took)."""
        self._call = None


@dataclass(frozen=True, slots=True)
class Forward:
    """How one decided request is forwarded: who asks, by which route, what the router
    decided and what the caller may not see, and a modern upstream's own round it retries."""

    caller: Caller
    route: Route
    decision: router.Pass | router.TaskCall
    lacking: Lacking | None
    theirs: TheirRound | None


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
        caller = envelope.check(request, msg, self.backend.catalogue)
        lacking = scopes_checked(request, msg, self.policy)  # InsufficientScope: 403
        try:  # the route first: the decision depends on its era
            route = await self.backend.for_principal(caller.principal)
        except errors.UpstreamError as exc:  # it cannot start: 503, as a legacy initialize
            return json_response(exc.to_message(msg["id"]), 503)
        # Its requestState, opened here once (InvalidParams: forged, expired, another's).
        retry = self.rounds.opened(msg, caller.principal, route.modern)
        conn = route.conn
        # A related-task reference stays only for the caller's own task (references.py).
        await own_references(msg, caller.principal,
                             lambda task_id: conn.correlator.tasks.owns(task_id,
                                                                        caller.principal),
                             self.engine, self.backend.name)
        decision = self.decide(msg, caller, route, retry)
        match decision:
            case router.Refuse(error=error):
                raise error
            case router.Discover():  # what the server said when found ready
                return json_response(jsonrpc.result(msg["id"], shapes.discover_result(
                    route.init_result, self.ttl_ms, self.scope)))
            case router.ServeTasks():  # a finished task's result inlined: held, as an answer
                self.engine.admit(caller.principal)
                return await send_held(request, jsonrpc.result(
                    msg["id"], await handlers.extension_request(
                        self.engine, msg["method"], msg.get("params") or {}, caller.principal,
                        lacking or unscoped)), self.flow,
                    self.inflight.answers.hold(caller.principal))
            case router.Listen():
                return await self.listeners.listen(request, msg, caller, route, self.engine)
            case router.Resume(round=retried):
                return await self.resume(request, msg, caller, retried)
            case router.Pass() | router.TaskCall():
                theirs = retry if isinstance(retry, TheirRound) else None
                return await self.forward(request, msg, Forward(caller, route, decision,
                                                                lacking, theirs))
            case _:
                assert_never(decision)

    def policy(self, tool: str) -> Policy:
        return self.policies.for_tool(self.backend.name, tool)

    def decide(self, msg: Message, caller: Caller, route: Route,
               retry: router.OwnRound | TheirRound | None) -> router.ModernDecision:
        """The router's decision on the facts found before it: the route's era, whose
        task a tasks/* names, and the round a retry's state names."""
        method, params = msg["method"], msg.get("params") or {}
        # Only a modern upstream has tasks of its own that tasks/* could name instead.
        theirs = method.startswith(router.TASKS_PREFIX) and route.modern and \
            route.conn.correlator.tasks.owns(task_id_of(params), caller.principal)
        return router.modern(msg, capabilities=caller.capabilities,
                             modern_upstream=route.modern, upstream_task=theirs,
                             catalogue=self.backend.catalogue, policy_for=self.policy,
                             retry=retry if isinstance(retry, router.OwnRound) else None)

    # -- forwarding ------------------------------------------------------------------------
    async def forward(self, request: web.Request, msg: Message, how: Forward
                      ) -> web.StreamResponse:
        json_ok, sse_ok = request[ACCEPTS]
        principal, decision = how.caller.principal, how.decision
        described = self._described(msg, how)  # msg["params"] as the upstream takes them
        headers = await self.headers.of(request)  # AuthUnavailable: 503
        self.inflight.take(principal)  # TooManyRequests: 429
        home = how.route.conn
        try:
            used = await self.backend.for_request(home, described.caller, described.method)
        except errors.UpstreamError as exc:  # nothing was sent: 503, as to an initialize
            self.inflight.release(principal)
            return json_response(exc.to_message(described.id), 503)
        except BaseException:  # cancelled while it waited for a process: its slot goes
            self.inflight.release(principal)
            raise
        ex = ModernExchange(self, described, sse_ok, self.inflight.answers.hold(principal))
        try:
            ticket = queue_ticket(self.backend, principal, msg, self.policy)  # 503
            call = used.request(msg, described.caller, ex, headers, decision.follow, ticket)
        except errors.UpstreamError as exc:  # not sent: the upstream cannot take calls now
            self._done(principal, home, used)
            return json_response(exc.to_message(described.id), 503)
        except BaseException:  # QueueFull (503), or a fault of the gateway's: the slot goes
            self._done(principal, home, used)
            raise
        ex.sent(call, lambda: self._done(principal, home, used))
        if not described.own_progress:  # the client's own token: a quiet call tells it it runs
            ex.heartbeat(call.progress_token, self.flow, ticket)
        # A call that must wait its turn is a task at once for a caller that can take one.
        if (isinstance(decision, router.TaskCall) and decision.at_once) or \
                (ticket is not None and ticket.queued):
            await self.to_task(ex)
        else:
            ex.start_budget()
        return await self._respond(request, ex, json_ok)

    @staticmethod
    def _described(msg: Message, how: Forward) -> ModernRequest:
        """The request as its exchange holds it, and `msg`'s params as the route's upstream
        takes them: in its era, a modern upstream's own state out of the gateway's seal,
        the tasks extension kept from a modern upstream where the gateway decides about
        tasks, and progress asked for where the call may become a task."""
        method, params = msg["method"], msg.get("params") or {}
        policy = how.decision.policy if isinstance(how.decision, router.TaskCall) else None
        digest_ = digest(method, params)  # the client's params, as its retry repeats them
        if how.theirs is not None:  # a modern upstream runs its own rounds: its own state
            params = {**params, "requestState": how.theirs.state}
        msg["params"] = upstream_params = shapes.to_upstream(params, how.route.modern)
        if how.decision.follow:
            native_tasks.ask_for_task(upstream_params)
        # The gateway decides about tasks here: a modern upstream must not make its own.
        caller = how.caller.without_tasks() if policy is not None and how.route.modern \
            else how.caller
        name, uri = params.get("name"), params.get("uri")
        return ModernRequest(
            msg["id"], caller, method, digest_, str(name or ""),
            uri if isinstance(uri, str) else None, how.route.modern, policy, how.lacking,
            own_progress=policy is not None and watch_progress(upstream_params))

    def _done(self, principal: str, conn: Connection, used: Connection) -> None:
        """The call is over (answered, or its task ended): its process and its slot go."""
        self.backend.done(conn, used)
        self.inflight.release(principal)

    # -- tasks (the io.modelcontextprotocol/tasks extension) --------------------------------
    def task_soon(self, ex: ModernExchange) -> None:
        """The sync budget ran out: the call becomes a task (unless it answers first)."""
        job = asyncio.get_running_loop().create_task(self.to_task(ex))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def to_task(self, ex: ModernExchange) -> None:
        """Answer `ex` with a task and let its call go on in the background. The task is in
        the store before the CreateTaskResult is sent (spec: durably created)."""
        described, policy = ex.request, ex.request.policy
        if policy is None or not ex.forwarding:
            return
        tool = described.tool  # the call goes to its task
        intent = Intent(described.caller.principal, tool, extension.NAME, self.backend.name,
                        policy)
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
            ex.answer(jsonrpc.result(described.id, extension.created(task)))

    async def _respond(self, request: web.Request, ex: ModernExchange, json_ok: bool
                       ) -> web.StreamResponse:
        if self.request_timeout_s is not None:
            ex.time_out(self.request_timeout_s)
        try:
            return await ex.respond(request, json_ok, self.flow)
        except asyncio.CancelledError:
            ex.abandon("the client closed the request's stream")
            raise
        finally:
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
        call.conn.redirect(call, parked, client_id=msg["id"])  # parked hears it still
        # The same request as the one parked (its digest checked): described anew for
        # this retry's id and caller (its log level, its capabilities).
        described = replace(parked.request, id=msg["id"], caller=caller)
        ex = ModernExchange(self, described, sse_ok,
                            self.inflight.answers.hold(caller.principal), parked)
        ex.resume()
        return await self._respond(request, ex, json_ok)

    def close(self) -> None:
        self.rounds.close()
        self.listeners.close()
