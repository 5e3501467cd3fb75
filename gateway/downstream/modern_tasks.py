"""Modern calls made tasks (the io.modelcontextprotocol/tasks extension, protocol 2026-07-28):
at once, stored before the call is sent (`first`: modes always and required); or when the
sync budget runs out, the exchange's call handed over to its task (`soon`, `adopt`: mode
auto, and a call that must wait its turn). When no task can be made (the store full or
away, the creation rate), the call is answered inline, as the extension allows. The era
(modern.py) forwards requests; this makes tasks of the calls it forwards.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway import errors, router
from gateway.downstream.boundary import json_response
from gateway.downstream.envelope import ModernRequest
from gateway.downstream.leases import Lease
from gateway.downstream.modern_exchange import ModernExchange
from gateway.observability import log
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.tasks.dialects import extension
from gateway.tasks.engine import Handover, Intent, StoreFull, TaskEngine
from gateway.tasks.model import Task
from gateway.tasks.policy import Policy
from gateway.upstream.connection import Connection
from gateway.upstream.handshake import IGNORE
from gateway.upstream.isolation import Backend


class ModernTasks:
    """Makes tasks of one upstream's modern calls."""

    def __init__(self, backend: Backend, engine: TaskEngine, policy_for: router.PolicyFor
                 ) -> None:
        self.backend = backend
        self.engine = engine
        self.policy_for = policy_for
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
        async def attach(task: Task) -> Handover:
            used = await lease.connect(self.backend, home, described.caller, described.method)
            ticket = lease.queue(msg, self.policy_for)  # QueueFull: 503
            call = used.request(msg, described.caller, IGNORE, headers, decision.follow,
                                ticket)
            return Handover(call, done=lease.hand(call))

        try:
            task = await self.engine.adopt(self._intent(described, decision.policy), attach)
        except (StoreFull, errors.StoreUnavailable, errors.TooManyRequests) as exc:
            self._inline(described.tool, exc)
            return None
        except errors.UpstreamError as exc:  # nothing was sent: 503, as to an initialize
            return json_response(exc.to_message(described.id), 503)
        return json_response(jsonrpc.result(described.id, extension.created(task)))

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
                      self.backend.name, policy)

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
