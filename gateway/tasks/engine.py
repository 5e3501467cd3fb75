"""The task engine: the one owner of the task lifecycle, whichever dialect made the task.

It alone creates, finds, lists, answers, cancels, expires and ends tasks; eras and dialects
call it and never the store. An era hands it a call that is to become a task through
`adopt` (the task is created, the call handed over, the run started, or the task forgotten
if the call cannot be handed over); a `TaskRun` (run.py) is then the call's sink, kept
with the other runs of this process and their watchers in `Local` (local.py: how a run's
changes are written and its end told). Tasks run by other replicas are reached through
`Replicas` (replicas.py).

No wire shapes here (dialects render tasks); no HTTP; upstream calls are reached through
the small `UpstreamCall` protocol (run.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, overload

from gateway.errors import GatewayError, IdempotencyKeyReused, StoreSettling, StoreUnavailable
from gateway.observability import log
from gateway.observability.counters import Counters
from gateway.observability.metrics import Metrics
from gateway.protocol.jsonrpc import Message
from gateway.ratelimit import UNLIMITED, Admission
from gateway.tasks.kept import KeptAnswers
from gateway.tasks.local import Local
from gateway.tasks.model import CANCELLED_BY_CLIENT, Dialect, Status, Task, failure, new_id
from gateway.tasks.policy import PollAdvisor
from gateway.tasks.replicas import STRANDED, Replicas
from gateway.tasks.report import Report
from gateway.tasks.run import Attach, Handover, Intent
from gateway.tasks.store import KeyBound, ReplicaBus, StoreFull, TaskStore


class TaskNotFound(KeyError):
    """Unknown, or another owner's (which must look exactly the same)."""


class TaskEngine:
    def __init__(self, store: TaskStore, counters: Counters | None = None,
                 admission: Admission | None = None, replica: str = "",
                 metrics: Metrics | None = None, bus: ReplicaBus | None = None,
                 url: str = "", clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock  # when tasks are created, change and expire: the engine's alone
        self.replica = replica  # this process, among replicas sharing the store
        self._report = Report(metrics, counters)
        self._admission = admission or Admission(UNLIMITED, UNLIMITED, self._report.counters)
        self.poll = PollAdvisor()
        # Finished tasks' answers, by the dialects' hands, while the store holds the task.
        self.kept = KeptAnswers(store.holds, clock)
        self._local = Local(store, self._report, self.poll, clock)
        # Replicas sharing the store (a bus); a single process has none.
        self.replicas = None if bus is None else Replicas(
            bus, store, replica, url, self._local,
            strand=lambda task: self.end_elsewhere(task, Status.FAILED, STRANDED, keep=False))

    # -- adopting ------------------------------------------------------------------------
    @overload
    async def adopt(self, intent: Intent, attach: Callable[[Task], Awaitable[Handover]], *,
                    rejoin: bool = True) -> Task: ...
    @overload
    async def adopt(self, intent: Intent, attach: Attach, *, rejoin: bool = True
                    ) -> Task | None: ...

    async def adopt(self, intent: Intent, attach: Attach, *, rejoin: bool = True
                    ) -> Task | None:
        """The one way a call becomes a task. The task is created, in the store before
        anyone hears of it (spec: a task MUST be retrievable once CreateTaskResult is sent;
        StoreFull when a bound is hit, TooManyRequests when the owner creates tasks too
        fast; both counted per principal: `intent.quota`); `attach(task)` hands its call
        over (None: the call answered meanwhile; an error: it could not be opened; either
        way the task is forgotten); from then on the task runs in the background."""
        # Rate and bounds are the principal's (quota), whichever of its sessions asks.
        self._admission.creation(intent.quota or intent.owner)
        policy, key = intent.policy, intent.key
        task = Task(new_id(), intent.owner, intent.tool, intent.dialect,
                    policy.ttl(intent.ttl), self.poll.suggest(intent.tool,
                                                              policy.poll_interval_ms),
                    upstream=intent.upstream, replica=self.replica, created_at=self._clock(),
                    quota=intent.quota, key=key.slot if key else "",
                    asked=key.digest if key else "", push=intent.push)
        try:
            # StoreSettling for a key while a store that lost its records gets them back
            # (redis_scripts.py `settling`): a run now could be the call's second.
            await self._store.create(task)
        except KeyBound as bound:
            return await self._keyed(intent, bound.task_id, attach, rejoin)
        try:
            handover = await attach(task)
        except Exception as exc:
            await self._store.delete(task.id)
            if key is not None:  # retries that joined it meanwhile hear why it never ran
                await self._tell_unstarted(self._unstarted(task, exc))
            raise
        if handover is None:
            await self._store.delete(task.id)
            return None
        self._local.start(task, handover, policy)
        return task

    async def _tell_unstarted(self, task: Task) -> None:
        """Retries that joined `task`, here and (a shared store) on other replicas, hear
        its end; its record is gone (nothing to read), so the end travels whole in the
        announcement an end makes. A store away loses it: joined retries elsewhere wait on,
        as for any end not heard, until their client gives up."""
        self._local.tell(task)
        if self.replicas is not None:
            with contextlib.suppress(StoreUnavailable):
                await self.replicas.tell_ended(task)

    def _unstarted(self, task: Task, exc: Exception) -> Task:
        """`task` as a keyed call's retries that joined it hear of it when its call could
        not be opened: failed, with the error its first caller got (its key is free again:
        the next retry runs it)."""
        error = exc.to_message()["error"] if isinstance(exc, GatewayError) else failure(
            "the call could not be started")
        return task.ended(Status.FAILED, str(error.get("message")), error, now=self._clock())

    async def _keyed(self, intent: Intent, task_id: str, attach: Attach, rejoin: bool
                     ) -> Task | None:
        """A keyed call whose key names task `task_id` (tasks/keys.py): that task is the
        call's, running (joined) or ended (its end, at once), and nothing is sent upstream;
        IdempotencyKeyReused when it was another call. Gone since (forgotten in between):
        the call is made anew, once."""
        assert intent.key is not None
        try:
            task = await self.find(task_id, intent.owner)
        except TaskNotFound:
            if not rejoin:
                raise
            return await self.adopt(intent, attach, rejoin=False)
        if task.asked != intent.key.digest:
            log.info("task.key_reused", tool=intent.tool, upstream=intent.upstream)
            raise IdempotencyKeyReused(intent.key.key)
        log.info("task.key_joined", task=task.id[:8], tool=intent.tool,
                 upstream=intent.upstream, status=str(task.status))
        return task

    def on_status(self, push: Callable[[Task, str | None], None]) -> None:
        """`push(task, message)` at each status written here that may be pushed (an end,
        input_required), with its status message as it may be shown (gateway/push)."""
        self._report.push = push

    # -- finding ------------------------------------------------------------------------------
    async def find(self, task_id: str, owner: str) -> Task:
        """The owner's task; past its ttl (the engine's call, whatever the store still
        holds) as it lapsed (`Task.lapsed`: a terminal status) while its id is remembered;
        TaskNotFound for unknown and foreign ids, and once forgotten; StoreSettling for
        those instead while a shared store that lost its records is being written back."""
        here = self._local.task(task_id)
        task = here if here is not None else await self._store.get(task_id)
        if task is not None and here is None and task.due(now := self._clock()):
            task = task.lapsed() if task.remembered(now) else None
        if task is not None and task.owner == owner:
            if here is not None or self.replicas is None:
                return task
            return await self.replicas.unless_stranded(task)
        if self.replicas is not None and await self.replicas.unsettled():
            # The store lost what it held and its replica may not have written this task
            # back yet: "not found" would tell a poller to give up on a live task. Unknown
            # and foreign ids get the same (docs/replicas.md).
            raise StoreSettling(self.replicas.generation.retry_after_s())
        self._report.missed(owner, task_id)
        raise TaskNotFound(task_id)

    async def holds(self, task_id: str | None, owner: str) -> bool:
        """Whether `task_id` names a task of `owner`'s here (running, finished or lapsed
        while remembered): what `find` would answer without "not found"."""
        if task_id is None:
            return False
        try:
            await self.find(task_id, owner)
        except TaskNotFound:
            return False
        return True

    async def owned(self, owner: str, dialect: Dialect) -> list[Task]:
        """The owner's tasks of one dialect, oldest first (running ones as they are now);
        StoreSettling instead while a shared store that lost its records is being written
        back: the list could lack tasks not written back yet."""
        now = self._clock()
        out = []
        for stored in await self._store.owned_by(owner):
            here = self._local.task(stored.id)
            if stored.dialect == dialect and (here is not None or not stored.due(now)):
                out.append(stored if here is None else here)
        # Asked after the read: a store that lost its records before it, or while it was
        # read, shows then (docs/replicas.md: a client that misses a task in its
        # list may conclude it is gone).
        if self.replicas is not None and await self.replicas.unsettled():
            raise StoreSettling(self.replicas.generation.retry_after_s(), "some tasks")
        return out

    def running(self, *, ending: bool = True) -> list[Task]:
        """Copies of the tasks whose calls run here (`ending=False`: those whose end is
        being written left out, as it is written anyway)."""
        return self._local.tasks(ending=ending)

    # -- from the client ----------------------------------------------------------------------
    async def delivered(self, task_id: str) -> None:
        """The owner has had the result of `task_id`, ended (core tasks/result answered it,
        an extension tasks/get showed it): it may now leave before its ttl to make room
        for its principal's newer tasks (docs/limits.md). Call it for a finished task only:
        a shared store writes the mark once (a round trip on its first read)."""
        await self._store.read(task_id)

    async def answer(self, task: Task, responses: dict[str, Any]) -> None:
        """Answers go upstream under the server's own ids; unknown or already answered keys
        are ignored; the task works again once nothing is outstanding."""
        if not self._local.answer(task.id, responses) and not task.terminal and \
                task.replica != self.replica and self.replicas is not None:
            await self.replicas.forward(task, {"op": "answer", "responses": responses})

    async def reply(self, msg: Message, owner: str) -> bool:
        """`owner`'s JSON-RPC answer (result or error) to an input request one of its
        tasks sent (core dialect); False when it answers no such request."""
        return self._local.reply(msg, owner)

    async def cancel(self, task: Task, why: str = CANCELLED_BY_CLIENT) -> Task:
        """Stop the upstream call and end the task cancelled, unless it ended already; the
        task as it ended."""
        ended = await self._local.stop(task.id, Status.CANCELLED, why)
        if ended is not None:
            return ended
        if task.terminal:
            return task
        # Another replica runs it: the end is written here (compare-and-set), so the ack
        # shows it, and that replica is asked to cancel the call (its own end is refused).
        ended = await self.end_elsewhere(task, Status.CANCELLED, why)
        if self.replicas is not None:
            await self.replicas.forward(task, {"op": "cancel", "why": why})
        return ended

    async def end_elsewhere(self, task: Task, status: Status, why: str, keep: bool = True) -> Task:
        """End `task`, whose call does not run here: cancelled by its client (kept through
        a store outage, like any change), or failed for a replica gone (`keep=False`: judged
        from a read a stale primary may have served, so written now or not at all). The
        task as it ended, or as whoever ended it first left it."""
        final = task.ended(status, why, failure(why) if status is Status.FAILED else None,
                           now=self._clock())
        if not await self._store.save(final, keep=keep):
            return await self._store.get(task.id) or task
        self._report.ended(final, None, replica=task.replica)
        self._local.tell(final)
        return final

    # -- housekeeping -------------------------------------------------------------------------
    async def sweep(self) -> int:
        """The store forgets finished tasks past their ttl (running ones end by timer), and
        tasks whose replica is gone are failed."""
        if self.replicas is not None:
            await self.replicas.fail_stranded()
        return await self._store.sweep()

    # -- what others may ask -------------------------------------------------------------
    def watch(self, task_id: str, told: Callable[[Task], None]) -> None:
        """`told(task)` at each change of the task, until `unwatch`."""
        self._local.watch(task_id, told)

    def unwatch(self, task_id: str, told: Callable[[Task], None]) -> None:
        self._local.unwatch(task_id, told)

    def admit(self, owner: str) -> None:
        """A tasks/* request of `owner`; TooManyRequests over its rate."""
        self._admission.request(owner)

    def failures(self) -> list[tuple[float, str, str, str]]:
        """The latest failures, newest first: (when, upstream, tool, message)."""
        return list(reversed(self._report.failures))

    def stored_bytes(self) -> int:
        return self._store.stored_bytes()

    async def settle(self, timeout_s: float) -> int:
        """Wait (at most `timeout_s`) for the ends being written; how many tasks still run
        here afterwards (none, once their calls have been answered)."""
        return await self._local.settle(timeout_s)


__all__ = ["Handover", "Intent", "StoreFull", "TaskEngine", "TaskNotFound"]
