"""Modern calls made tasks (the io.modelcontextprotocol/tasks extension, protocol 2026-07-28):
at once, stored before the call is sent (`first`: modes always and required); or when the
sync budget runs out, the exchange's call handed over to its task (`soon`, `adopt`: mode
auto, and a call that must wait its turn). When no task can be made (the store full or
away, the creation rate), the call is answered inline, as the extension allows. The era
(modern.py) forwards requests; this makes tasks of the calls it forwards.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from gateway import errors, router
from gateway.downstream import sse
from gateway.downstream.boundary import ACCEPTS, json_response
from gateway.downstream.envelope import ModernRequest
from gateway.downstream.exchange import Exchange
from gateway.downstream.leases import Lease, Leases
from gateway.downstream.modern_exchange import ModernExchange
from gateway.observability import log
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.tasks.dialects import extension
from gateway.tasks.engine import Handover, Intent, StoreFull, TaskEngine
from gateway.tasks.keys import CallKey
from gateway.tasks.model import Status, Task
from gateway.tasks.policy import Policy
from gateway.upstream.connection import Connection
from gateway.upstream.handshake import IGNORE
from gateway.upstream.isolation import Backend


@dataclass(frozen=True, slots=True)
class Asked:
    """What a keyed call's client asked that sending it rewrites: its progress token, and
    a retry's answers to the inputs its task asked for (MRTR inputResponses)."""

    token: str | int | None
    answers: dict[str, Any] | None

    @classmethod
    def of(cls, params: dict[str, Any]) -> Asked:
        answers = params.get("inputResponses")
        return cls(mcp.progress_token(params), answers if isinstance(answers, dict) else None)


@dataclass(frozen=True, slots=True)
class Keyed:
    """A keyed tools/call (tasks/keys.py), as the era forwards it."""

    key: CallKey
    asked: Asked
    home: Connection
    headers: dict[str, str] | None
    decision: router.Pass | router.TaskCall


class ModernTasks:
    """Makes tasks of one upstream's modern calls."""

    def __init__(self, backend: Backend, engine: TaskEngine, policy_for: router.PolicyFor,
                 flow: sse.Flow, leases: Leases) -> None:
        self.backend = backend
        self.engine = engine
        self.policy_for = policy_for
        self.flow = flow
        self.leases = leases
        self._jobs: set[asyncio.Task[None]] = set()  # tasks being made after a budget ran out

    async def first(self, msg: Message, described: ModernRequest, home: Connection,
                    headers: dict[str, str] | None, decision: router.TaskCall, lease: Lease
                    ) -> web.StreamResponse | None:
        """A call that is a task at once (mode always or required): its task is stored
        first, then its call is sent under its `lease` with the task's run as its sink, as
        core tasks do (core_tasks.py). Nothing the call says can race the store write (a
        shared store takes a round trip: docs/tasks.md, Task modes), and no exchange is
        built for an answer that is the task's handle. None when no task could be made:
        the call goes on inline, under the same lease."""
        attach = self._attacher(msg, described, home, headers, decision.follow, lease)
        try:
            task = await self.engine.adopt(self._intent(described, decision.policy), attach)
        except (StoreFull, errors.StoreUnavailable, errors.TooManyRequests) as exc:
            self._inline(described.tool, exc)
            return None
        except errors.UpstreamError as exc:  # nothing was sent: 503, as to an initialize
            return json_response(exc.to_message(described.id), 503)
        return json_response(jsonrpc.result(described.id, extension.created(task)))

    def _attacher(self, msg: Message, described: ModernRequest, home: Connection,
                  headers: dict[str, str] | None, follow: bool, lease: Lease
                  ) -> Callable[[Task], Awaitable[Handover]]:
        """How a task made first takes its call: sent under its `lease` (QueueFull: 503),
        the task's run its sink from the start."""
        async def attach(task: Task) -> Handover:
            used = await lease.connect(self.backend, home, described.caller, described.method)
            ticket = lease.queue(msg, self.policy_for)
            call = used.request(msg, described.caller, IGNORE, headers, follow, ticket)
            return Handover(call, done=lease.hand(call))
        return attach

    # -- keyed calls (tasks/keys.py) -------------------------------------------------------
    async def keyed(self, request: web.Request, msg: Message, described: ModernRequest,
                    keyed: Keyed) -> web.StreamResponse:
        """A tools/call with an Idempotency-Key: run once, as a task made first (what the
        key remembers), whichever caller asks. A caller that takes tasks (the router let
        the call become one) gets its handle at once, every time; another waits for the
        call's answer, and its retries too (a dropped request is not a cancel here: the
        task runs on for the retry). When no task can be made the call is refused, never
        run unkeyed."""
        decision, principal = keyed.decision, described.caller.principal
        policy = decision.policy if isinstance(decision, router.TaskCall) else \
            self.policy_for(described.tool)
        intent = replace(self._intent(described, policy), key=keyed.key)
        # TooManyRequests, IdempotencyKeyReused, GatewayStopping, StoreSettling: raised
        # (nothing sent). A retry that waits holds the lease taken for the call while it
        # waits (it counts among its principal's calls in flight); the first caller's went
        # with its task.
        with self.leases.take(principal, described.method) as lease:
            try:
                task = await self.engine.adopt(intent, self._attacher(
                    msg, described, keyed.home, keyed.headers, decision.follow, lease))
            except (StoreFull, errors.StoreUnavailable) as exc:
                self.backend.counters.reject("store_full")
                return json_response(jsonrpc.error(
                    described.id, jsonrpc.INTERNAL_ERROR, f"Cannot run the keyed call as a "
                    f"task: {exc}"), 503)
            except errors.UpstreamError as exc:  # nothing was sent: 503, as to an initialize
                return json_response(exc.to_message(described.id), 503)
            if isinstance(decision, router.TaskCall):
                return json_response(jsonrpc.result(described.id, extension.created(task)))
            if keyed.asked.answers and task.status is Status.INPUT_REQUIRED:
                await self.engine.answer(task, keyed.asked.answers)  # its round's retry
            return await self._answered(request, described, task, keyed.asked.token)

    async def _answered(self, request: web.Request, described: ModernRequest, task: Task,
                        token: str | int | None) -> web.StreamResponse:
        """The keyed call's answer to a caller that made no task: at the task's end, or an
        InputRequiredResult when it waits for input (the retry, with the same key, brings
        the answers); a heartbeat on the client's token while it is quiet."""
        json_ok, sse_ok = request[ACCEPTS]
        ex = Exchange(described.id, sse_ok, lambda: sse.Stream("0", 0), {},
                      self.leases.answers.hold(described.caller.principal))
        ex.heartbeat(token, self.flow, None)

        ended: list[Task] = []

        def told(now: Task) -> None:
            if now.terminal:
                ended.append(now)
                answer = extension.final(now, described.id)
                ex.answer(answer, mcp.modern_error_status(answer.get("error")))
            elif now.status is Status.INPUT_REQUIRED and now.inputs:
                ex.answer(extension.input_required(now, described.id))
        self.engine.watch(task.id, told)
        try:  # an end (or a round) before the watch began is read now
            told(await self.engine.find(task.id, described.caller.principal))
            return await ex.respond(request, json_ok, self.flow)
        finally:
            self.engine.unwatch(task.id, told)
            ex.close()  # also when the lookup failed (it never responded)
            if ex.response is not None and ended:  # its end was answered: read
                with contextlib.suppress(errors.StoreUnavailable):
                    await self.engine.delivered(task.id)

    def soon(self, ex: ModernExchange) -> None:
        """The sync budget ran out: the call becomes a task (unless it answers first)."""
        job = asyncio.get_running_loop().create_task(self.adopt(ex))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def adopt(self, ex: ModernExchange) -> None:
        """Answer `ex` with a task and let its call go on in the background. The task is in
        the store before the CreateTaskResult is sent (spec: durably created)."""
        described, policy = ex.request, ex.request.policy
        if policy is None or not ex.forwarding:
            return
        try:
            task = await self.engine.adopt(self._intent(described, policy), ex.handover)
        except (StoreFull, errors.StoreUnavailable, errors.TooManyRequests) as exc:
            self._inline(described.tool, exc)
            return
        if task is not None:
            ex.answer(jsonrpc.result(described.id, extension.created(task)))

    def _intent(self, described: ModernRequest, policy: Policy) -> Intent:
        """What the engine is asked to make of the call: its caller's task of its tool."""
        return Intent(described.caller.principal, described.tool, extension.NAME,
                      self.backend.name, policy, push=described.push)

    def _inline(self, tool: str, exc: Exception) -> None:
        """No task could be made for a call that was to become one: it is answered inline
        (the extension lets the gateway), counted and said why."""
        counters, upstream = self.backend.counters, self.backend.name
        if isinstance(exc, StoreFull):  # never evict a live task
            counters.tasks_inline_store_full += 1
            log.warning("task.store_full", tool=tool, reason=str(exc), upstream=upstream)
        elif isinstance(exc, errors.StoreUnavailable):
            counters.tasks_inline_store_unavailable += 1
            log.warning("task.store_unavailable", tool=tool, reason=exc.detail,
                        upstream=upstream)
        else:
            log.warning("task.rate_limited", tool=tool, reason=str(exc), upstream=upstream)
