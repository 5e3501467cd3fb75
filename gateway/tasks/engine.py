"""The task engine: the one owner of the task lifecycle, whichever dialect made the task.

It alone creates, finds, lists, answers, cancels, expires and ends tasks; eras and dialects
call it and never the store. An era hands it a call that is to become a task through
`adopt` (the task is created, the call handed over, the run started, or the task forgotten
if the call cannot be handed over); a `TaskRun` (run.py) is then the call's sink.
Changes are told to watchers at once and written to the store behind (one write per burst,
in order); an end is written first and told after, compare-and-set,
so nobody hears of a result the store does not hold. A running task ends by its response,
by cancel, by `timeout_ms`, or when its ttl passes (spec: a task MAY be deleted after its
ttl, whatever its status): its call is cancelled upstream, its process released, its
watchers told (a waiting tasks/result answers, a listen stream is notified), and only then
is its record forgotten.

No wire shapes here (dialects render tasks); no HTTP; upstream calls are reached through
the small `UpstreamCall` protocol (run.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from gateway.errors import StoreSettling
from gateway.observability import log
from gateway.observability.counters import Counters
from gateway.observability.metrics import Metrics
from gateway.protocol.jsonrpc import Message
from gateway.ratelimit import UNLIMITED, Admission
from gateway.tasks.inputs import Inputs
from gateway.tasks.model import CANCELLED_BY_CLIENT, Status, Task, failure, new_id
from gateway.tasks.policy import PollAdvisor
from gateway.tasks.replicas import STRANDED, Replicas
from gateway.tasks.report import Report, audit
from gateway.tasks.run import Attach, Background, Handover, Intent, TaskRun, WriteBehind
from gateway.tasks.store import ReplicaBus, ResultTooLarge, StoreFull, TaskStore
from gateway.tasks.watchers import Watchers


class TaskNotFound(KeyError):
    """Unknown, or another owner's (which must look exactly the same)."""


class TaskExpired(KeyError):
    """The owner's task, forgotten at its ttl a short while ago."""


class TaskEngine:
    def __init__(self, store: TaskStore, counters: Counters | None = None,
                 admission: Admission | None = None, replica: str = "",
                 metrics: Metrics | None = None, bus: ReplicaBus | None = None,
                 url: str = "", clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock  # when tasks are created and expire: the engine's alone
        self.replica = replica  # this process, among replicas sharing the store
        self._report = Report(metrics, counters)
        self._admission = admission or Admission(UNLIMITED, UNLIMITED, self._report.counters)
        self._runs: dict[str, TaskRun] = {}
        self._inputs = Inputs(self._report)
        self._watchers = Watchers()
        # Replicas sharing the store (a bus); a single process has none.
        self.replicas = None if bus is None else Replicas(
            bus, store, replica, url, self._runs, self._watchers,
            cancel=self.cancel, answer=self.answer,
            strand=lambda task: self.end_elsewhere(task, Status.FAILED, STRANDED, keep=False))
        self.poll = PollAdvisor()
        self._background = Background()
        self._spawn = self._background.spawn
        self._behind = WriteBehind(store, self._watchers, self._spawn)

    # -- adopting ------------------------------------------------------------------------
    async def adopt(self, intent: Intent, attach: Attach) -> Task | None:
        """The one way a call becomes a task. The task is created, in the store before
        anyone hears of it (spec: a task MUST be retrievable once CreateTaskResult is sent;
        StoreFull when a bound is hit, TooManyRequests when the owner creates tasks too
        fast; both counted per principal: `intent.quota`); `attach(task)` hands its call
        over (None: the call answered meanwhile; an error: it could not be opened; either
        way the task is forgotten); from then on the task runs in the background."""
        # Rate and bounds are the principal's (quota), whichever of its sessions asks.
        self._admission.creation(intent.quota or intent.owner)
        policy = intent.policy
        task = Task(new_id(), intent.owner, intent.tool, intent.dialect,
                    policy.ttl(intent.ttl), self.poll.suggest(intent.tool,
                                                              policy.poll_interval_ms),
                    upstream=intent.upstream, replica=self.replica, created_at=self._clock(),
                    quota=intent.quota)
        await self._store.create(task)
        try:
            handover = await attach(task)
        except Exception:
            await self._store.delete(task.id)
            raise
        if handover is None:
            await self._store.delete(task.id)
            return None
        self._start(task, handover, policy.timeout_ms)
        return task

    def _start(self, task: Task, handover: Handover, timeout_ms: int | None) -> None:
        run = self._runs[task.id] = TaskRun(task, handover, self._behind.changed,
                                            self._responded, self._inputs.asked)
        loop = asyncio.get_running_loop()
        if timeout_ms is not None:  # from when the call runs: a wait in a queue is not counted
            handover.call.when_running(lambda: self._time_out(run, timeout_ms))
        if task.expires_at is not None:  # a coroutine made only when the timer fires
            run.timers.append(loop.call_later(max(0.0, task.expires_at - self._clock()),
                                              lambda: self._spawn(self._expire(run))))
        self._report.created(task)
        for msg in handover.pending:
            run.on_message(msg)

    def _time_out(self, run: TaskRun, timeout_ms: int) -> None:
        why = f"timed out after {timeout_ms} ms"
        run.timers.append(asyncio.get_running_loop().call_later(
            timeout_ms / 1000, lambda: self._spawn(self._stop(
                run, Status.FAILED, why, f"Task {why}"))))

    # -- finding ------------------------------------------------------------------------------
    async def find(self, task_id: Any, owner: str) -> Task:
        """The owner's task; TaskExpired (its ttl passed: the engine's call, whatever the
        store still holds), or TaskNotFound for unknown and foreign ids; StoreSettling for
        those instead while a shared store that lost its records is being written back."""
        if isinstance(task_id, str):
            run = self._runs.get(task_id)
            task = run.task if run is not None else await self._store.get(task_id)
            if task is not None and run is None and task.due(now := self._clock()):
                if task.owner == owner and task.remembered(now):
                    raise TaskExpired(task_id)
                task = None
            if task is not None and task.owner == owner:
                if run is not None or self.replicas is None:
                    return task
                return await self.replicas.unless_stranded(task)
            if await self._store.expired_owner(task_id) == owner:
                raise TaskExpired(task_id)
            if self.replicas is not None and await self.replicas.unsettled():
                # The store lost what it held and its replica may not have written this
                # task back yet: "not found" would tell a poller to give up on a live task.
                # Unknown and foreign ids get the same (README, store incidents).
                raise StoreSettling(self.replicas.generation.retry_after_s())
        self._report.missed(owner, task_id)
        raise TaskNotFound(task_id)

    async def owned(self, owner: str, dialect: str) -> list[Task]:
        """The owner's tasks of one dialect, oldest first (running ones as they are now)."""
        now = self._clock()
        return [self._runs[t.id].task if t.id in self._runs else t
                for t in await self._store.owned_by(owner)
                if t.dialect == dialect and (t.id in self._runs or not t.due(now))]

    def running(self) -> list[Task]:
        """Copies of the tasks whose calls run here (ends being written left out)."""
        return [run.task.copy() for run in self._runs.values() if not run.ending]

    async def knows(self, task_id: Any) -> bool:
        """Whether `task_id` is (or lately was) a task of this gateway, whoever owns it."""
        return isinstance(task_id, str) and (task_id in self._runs
                                             or await self._store.knows(task_id))

    # -- from the client ----------------------------------------------------------------------
    async def answer(self, task: Task, responses: dict[str, Any]) -> None:
        """Answers go upstream under the server's own ids; unknown or already answered keys
        are ignored; the task works again once nothing is outstanding."""
        run = self._runs.get(task.id)
        if run is None and not task.terminal and task.replica != self.replica and \
                self.replicas is not None:
            await self.replicas.forward(task, {"op": "answer", "responses": responses})
        if run is not None and not run.ending:
            self._inputs.answer(run, responses)

    async def reply(self, msg: Message, owner: str) -> bool:
        """`owner`'s JSON-RPC answer (result or error) to an input request one of its
        tasks sent (core dialect); False when it answers no such request."""
        return self._inputs.reply(msg, owner)

    async def cancel(self, task: Task, why: str = CANCELLED_BY_CLIENT) -> Task:
        """Stop the upstream call and end the task cancelled, unless it ended already; the
        task as it ended."""
        run = self._runs.get(task.id)
        if run is not None:
            return await self._stop(run, Status.CANCELLED, why)
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
        final = task.ended(status, why, failure(why) if status is Status.FAILED else None)
        if not await self._store.save(final, keep=keep):
            return await self._store.get(task.id) or task
        self._report.ended(final, None, replica=task.replica)
        self._watchers.tell(final)
        return final

    # -- ending -------------------------------------------------------------------------------
    def _responded(self, run: TaskRun, msg: Message) -> None:
        self._spawn(self._commit(run, run.outcome(msg)))

    async def _stop(self, run: TaskRun, status: Status, message: str,
                    error_text: str | None = None) -> Task:
        """End a run that has not answered: its call is cancelled upstream."""
        if run.ending:
            return await asyncio.shield(run.ended)
        run.ending = True
        assert run.call is not None  # not ending, so not ended
        run.call.cancel(message)
        final = run.task.ended(status, message,
                               None if error_text is None else failure(error_text))
        return await self._commit(run, final)

    async def _expire(self, run: TaskRun) -> None:
        ttl = run.task.ttl_ms
        task = await self._stop(run, Status.FAILED, f"expired: its ttl of {ttl} ms passed",
                                f"Task expired: its ttl of {ttl} ms passed before it finished")
        await self._store.delete(task.id, expired=True)
        audit("task.expired", task)

    async def _commit(self, run: TaskRun, final: Task) -> Task:
        """Write the end (compare-and-set), then tell everyone: nobody hears of a result
        the store does not hold."""
        if run.flusher is not None:
            await asyncio.wait({run.flusher})  # its error, if any, is logged by itself
        try:
            final = await _write_end(self._store, run, final)
        except Exception as exc:  # the store failed: the end is still told, never a hang
            log.error("task.store_error", task=final.id, error=repr(exc))
        self._end(run, final)
        return final

    def _end(self, run: TaskRun, task: Task) -> None:
        run.task = task
        # The call names its run as sink: without this the pair (and the result) would wait
        # for the garbage collector, which a quiet gateway may not run for a long while.
        run.call = None
        for timer in run.timers:
            timer.cancel()
        self._inputs.forget(run)
        self._runs.pop(task.id, None)
        duration = time.monotonic() - run.started
        if task.status is not Status.CANCELLED:
            self.poll.record(task.tool, duration)
        if run.done is not None:
            run.done()
        self._report.ended(task, duration)
        run.ended.set_result(task)
        self._watchers.tell(task)

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
        self._watchers.watch(task_id, told)

    def unwatch(self, task_id: str, told: Callable[[Task], None]) -> None:
        self._watchers.unwatch(task_id, told)

    def admit(self, owner: str) -> None:
        """A tasks/* request of `owner`; TooManyRequests over its rate."""
        self._admission.request(owner)

    def live(self) -> list[Task]:
        """The tasks whose calls run here, as they are now (to read, not to change)."""
        return [run.task for run in self._runs.values()]

    def failures(self) -> list[tuple[float, str, str, str]]:
        """The latest failures, newest first: (when, upstream, tool, message)."""
        return list(reversed(self._report.failures))

    def stored_bytes(self) -> int:
        return self._store.stored_bytes()

    async def replica_address(self, replica: str) -> str | None:
        """Where another replica is reached (None: gone, did not say, or no replicas)."""
        return None if self.replicas is None else await self.replicas.address(replica)

    async def settle(self, timeout_s: float) -> int:
        """Wait (at most `timeout_s`) for the ends being written; how many tasks still run
        here afterwards (none, once their calls have been answered)."""
        await self._background.wait(timeout_s)
        return len(self._runs)


async def _write_end(store: TaskStore, run: TaskRun, final: Task) -> Task:
    """The end as stored: `final`, failed instead when its result is too big to keep, or
    the end another writer stored first (it stays)."""
    try:
        saved = await store.save(final)
    except ResultTooLarge as exc:
        final = run.task.ended(Status.FAILED, str(exc), failure(str(exc)))
        saved = await store.save(final)
    if not saved:  # the store holds another end already, or forgot the task
        stored = await store.get(final.id)
        if stored is not None and stored.terminal:  # an end is an end, never "working"
            final = stored
    return final


def watch_progress(params: dict[str, Any]) -> bool:
    """Ask the upstream for progress on a call that is, or may become, a task, so its
    statusMessage can tell how far it got. True when the gateway asked (the client did
    not, and its progress goes nowhere); False when the client asked itself."""
    meta = params.get("_meta")
    if isinstance(meta, dict) and "progressToken" in meta:
        return False
    params["_meta"] = {**(meta if isinstance(meta, dict) else {}), "progressToken": "task"}
    return True


__all__ = ["Handover", "Intent", "StoreFull", "TaskEngine", "TaskExpired", "TaskNotFound",
           "watch_progress"]
