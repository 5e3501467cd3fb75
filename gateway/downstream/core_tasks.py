"""The 2025-11-25 core task dialect on legacy sessions: task-augmented `tools/call`, the
`tasks/*` requests the gateway serves itself, and a task's traffic to its session.

A running task is linked to the session that created it (its owner, who alone sees it) and
counted against that session's principal (issue 29: every bound is the principal's, so one
token's many sessions share one `max_tasks_per_owner`, creation rate, tasks/* rate and
`max_calls_per_owner`: a task's call is in flight until it ends). The server's input
requests reach the client with related-task `_meta` on an open tasks/result stream, else on
the GET stream (held until one opens); progress keeps the client's token until the task ends;
each status change is pushed as notifications/tasks/status on the GET stream.
spec: tasks-2025-11-25.md. Wire shapes live in tasks/dialects/core.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway import errors, router
from gateway.downstream import sse
from gateway.downstream.boundary import ACCEPTS, json_response, scopes_checked
from gateway.downstream.exchange import send_held
from gateway.downstream.leases import Lease, Leases
from gateway.downstream.session import Edit, Session, SessionExchange, SessionTask
from gateway.observability import log
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.tasks.dialects import Lacking, core, handlers, unscoped, watch_progress
from gateway.tasks.engine import (
    Handover,
    Intent,
    StoreFull,
    TaskEngine,
)
from gateway.tasks.keys import CallKey
from gateway.tasks.model import Task
from gateway.tasks.policy import Policies, Policy
from gateway.upstream.handshake import IGNORE
from gateway.upstream.isolation import Backend


class CoreTasks:
    """Serves core tasks for one upstream's legacy sessions."""

    def __init__(self, backend: Backend, engine: TaskEngine, policies: Policies,
                 flow: sse.Flow, leases: Leases) -> None:
        self.backend = backend
        self.engine = engine
        self.policies = policies
        self.flow = flow
        self.leases = leases

    def policy(self, tool: object) -> Policy:
        return self.policies.for_tool(self.backend.name, str(tool or ""))

    def support(self, tool: str) -> str:
        """A tool's taskSupport: the upstream's own when it runs the tool as a task itself
        (its tasks pass through: the gateway cannot run as a plain call what the server only
        runs as a task), else the gateway's from the tool's policy."""
        own = self.backend.catalogue.own_task_support(tool)
        return own or core.TASK_SUPPORT[self.policy(tool).mode]

    def marked_tools(self) -> Edit:
        """The change `router.Augment` asks for on an answer's way back: tools/list gains
        each tool's taskSupport (and the catalogue learns what the upstream said of them)."""
        return lambda m: core.mark_tools(self.backend.learn_tools(m), self.support)

    # -- tools/call --------------------------------------------------------------------------
    async def call(self, session: Session, msg: Message, decision: router.TaskCall,
                   headers: dict[str, str] | None, key: CallKey | None = None,
                   push: dict[str, Any] | None = None) -> web.StreamResponse:
        """A task-augmented tools/call: the task is created, the call goes upstream without
        `params.task`, and the CreateTaskResult is the answer at once (a keyed call's task,
        the same for every retry: tasks/keys.py)."""
        policy, client_id = decision.policy, msg["id"]  # sending rewrites msg's id
        core.strip_task(msg["params"])  # the upstream serves a plain call (it may know no tasks)
        made = await self._made(session, msg, policy, headers, decision.ttl, key, push=push)
        if not isinstance(made, Task):
            return made
        return json_response(jsonrpc.result(client_id,
                                            core.created(made, policy.immediate_response)))

    async def keyed(self, request: web.Request, session: Session, msg: Message,
                    key: CallKey, lacking: Lacking | None, headers: dict[str, str] | None,
                    push: dict[str, Any] | None = None) -> web.StreamResponse:
        """A plain tools/call with an Idempotency-Key: run once, as a task (what its key
        remembers), and answered with the call's own answer at the task's end as
        tasks/result would answer it (its server's requests on this request's stream),
        the first call and every retry alike; a heartbeat on the client's progress token
        meanwhile. A dropped request is not a cancel: the task runs on for the retry."""
        # The client's id and progress token: sending the call rewrites both in `msg`.
        client_id, token = msg["id"], mcp.progress_token(msg["params"])

        def answered(task: Task) -> Awaitable[web.StreamResponse]:
            return self.result(request, session, {**msg, "id": client_id},
                               {"taskId": task.id}, lacking or unscoped, token)
        made = await self._made(session, msg, self.policy(msg["params"].get("name")),
                                headers, None, key, joined=answered, push=push)
        return await answered(made) if isinstance(made, Task) else made

    async def _made(self, session: Session, msg: Message, policy: Policy,
                    headers: dict[str, str] | None, ttl: int | None, key: CallKey | None,
                    joined: Callable[[Task], Awaitable[web.StreamResponse]] | None = None,
                    push: dict[str, Any] | None = None) -> Task | web.StreamResponse:
        """The call's task: created, its call sent under a lease that goes with the task;
        or the keyed call's task already (nothing sent), which `joined` (a plain keyed
        call's: its wait) answers under the lease taken for the call, so a retry waiting
        counts among its principal's calls in flight. A refusal is a JSON-RPC error (HTTP
        200, as a server's)."""
        client_id = msg["id"]  # before the call is sent (which rewrites it)
        tool = str(msg["params"].get("name") or "")
        # Counted against the principal: owned by it (with auth), or a session's (without).
        quota = "" if session.task_owner == session.principal else session.principal
        intent = Intent(session.task_owner, tool, core.NAME, self.backend.name, policy, ttl,
                        quota=quota, key=key, push=push)
        try:  # a task's call is a call in flight: its lease goes with the task
            lease = self.leases.take(session.principal, mcp.TOOLS_CALL)
        except errors.TooManyRequests as exc:
            return json_response(exc.to_message(client_id))
        with lease:
            try:
                task = await self.engine.adopt(intent, self._attacher(
                    session, msg, headers, lease, plain=joined is not None))
            except StoreFull as exc:
                self.backend.counters.reject("store_full")
                log.warning("task.store_full", tool=tool, reason=str(exc),
                            upstream=self.backend.name)
                return json_response(jsonrpc.error(client_id, jsonrpc.INTERNAL_ERROR,
                                                   f"Cannot create task: {exc}"))
            except (errors.TooManyRequests, errors.StoreUnavailable, errors.StoreSettling,
                    errors.UpstreamError, errors.QueueFull, errors.IdempotencyKeyReused) as exc:
                return json_response(exc.to_message(client_id))
            if joined is not None and lease.call is None:  # not sent here: a retry's wait
                return await joined(task)
        return task

    def _attacher(self, session: Session, msg: Message, headers: dict[str, str] | None,
                  lease: Lease, plain: bool) -> Callable[[Task], Awaitable[Handover]]:
        """How the new task takes its call over: opened upstream under its `lease`, tied to
        the session, the lease going back when the task ends. `plain`: a keyed plain
        call's task, whose client made no task (no status notifications)."""
        relay_progress = not watch_progress(msg["params"])

        async def attach(task: Task) -> Handover:
            conn = await lease.connect(self.backend, session.conn, session, mcp.TOOLS_CALL)
            await conn.reachable()
            call = conn.request(msg, session, IGNORE, headers,
                                ticket=lease.queue(msg, self.policy))
            bound = SessionTask(self.engine, session, task, relay_progress, notify=not plain)
            session.tasks[task.id] = bound
            self.engine.watch(task.id, bound.changed)
            return Handover(call, done=lease.hand(call), relay=bound.relay, fail_on_is_error=True)
        return attach

    # -- tasks/* -----------------------------------------------------------------------------
    async def serve(self, request: web.Request, session: Session, msg: Message
                    ) -> web.StreamResponse:
        """tasks/*; their errors are JSON-RPC errors of the session's protocol (HTTP 200,
        as the upstream's would be: clients treat a 4xx as a transport failure)."""
        method, params = msg["method"], msg.get("params") or {}
        lacking = scopes_checked(request, msg, self.policy) or unscoped
        try:
            self.engine.admit(session.principal)  # the principal's rate, over its sessions
            if (kept := handlers.kept(self.engine, core.NAME, method, params,
                                      session.task_owner, lacking)) is not None:
                return await send_held(request, jsonrpc.result(msg["id"], kept), self.flow,
                                       self.leases.answers.hold(session.principal))
            if method == core.RESULT:
                return await self.result(request, session, msg, params, lacking)
            return json_response(jsonrpc.result(msg["id"], await handlers.CORE[method](
                self.engine, params, session.task_owner, lacking)))
        except (errors.InvalidParams, errors.TooManyRequests) as exc:
            return json_response(exc.to_message(msg["id"]))

    async def result(self, request: web.Request, session: Session, msg: Message,
                     params: dict[str, Any], lacking: Lacking, beat: RequestId | None = None
                     ) -> web.StreamResponse:
        """spec (Result Retrieval): blocks until the task is terminal. Its input requests
        travel on this response's stream meanwhile; `beat`: a progress token to tell the
        client, while the task is quiet, that it runs (a keyed call's)."""
        task = await handlers.core_named(self.engine, params, session.task_owner, lacking)
        bound = session.tasks.get(task.id)
        if task.terminal:
            await self.engine.delivered(task.id)
            answer = core.final(task, msg["id"])
            if "result" in answer:  # kept for the next reads (an error is not: it is short)
                answer["result"] = handlers.keep(self.engine, core.RESULT, task,
                                                 answer["result"])
            return await send_held(request, answer, self.flow,
                                   self.leases.answers.hold(session.principal))
        if bound is None:  # the principal's, made in another session or on another replica
            return await self._await_end(request, session, msg, task, beat)
        json_ok, sse_ok = request[ACCEPTS]
        ex = SessionExchange(session, msg["id"], sse_ok,
                             self.leases.answers.hold(session.principal))
        ex.heartbeat(beat, self.flow, None)
        bound.waiters.append(ex)
        for held in bound.held:
            ex.on_message(held)
        bound.held.clear()
        try:
            return await ex.respond(request, json_ok, self.flow)
        finally:
            if ex in bound.waiters:
                bound.waiters.remove(ex)
            await self._delivered(task.id, ex)

    async def _await_end(self, request: web.Request, session: Session, msg: Message,
                         task: Task, beat: RequestId | None) -> web.StreamResponse:
        """tasks/result of a task this session did not start: answered at its end, heard
        from the engine (another replica's changes reach it through the store's events);
        its input requests stay with the session that made it."""
        json_ok, sse_ok = request[ACCEPTS]
        ex = SessionExchange(session, msg["id"], sse_ok,
                             self.leases.answers.hold(session.principal))
        ex.heartbeat(beat, self.flow, None)

        def told(changed: Task) -> None:
            if changed.terminal and ex.response is None:
                ex.on_response(core.final(changed, msg["id"]))
        self.engine.watch(task.id, told)
        try:
            # An end written before the watch began is read now (it would not be told);
            # one forgotten meanwhile is answered as tasks/get would (the dialect's words).
            told(await handlers.core_lookup(self.engine, task.id, session.task_owner))
            return await ex.respond(request, json_ok, self.flow)
        finally:
            self.engine.unwatch(task.id, told)
            ex.close()  # also when the lookup failed (it never responded)
            await self._delivered(task.id, ex)

    async def _delivered(self, task_id: str, ex: SessionExchange) -> None:
        """A tasks/result answered with the task's end (not left by its client before it):
        the result was read (docs/limits.md: read results make room)."""
        if ex.response is not None:
            with contextlib.suppress(errors.StoreUnavailable):
                await self.engine.delivered(task_id)

    # -- session life ------------------------------------------------------------------------
    def opened_get(self, session: Session) -> None:
        """The session's GET stream has a reader again: held input requests go there."""
        for bound in session.tasks.values():
            bound.flush()

    async def end(self, session: Session) -> None:
        """Without auth nobody else can reach a session's tasks: those still running are
        cancelled. With auth they are the principal's, whose other sessions reach them:
        they run on (their input requests, asked of this session, go unanswered)."""
        for bound in list(session.tasks.values()):
            if bound.task.owner == session.owner:
                await self.engine.cancel(bound.task, "client session ended")
