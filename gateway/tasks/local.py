"""This process's side of the tasks: the calls that run here (each a `TaskRun`, started,
timed, stopped and ended here) and who here hears of tasks' changes.

A run's changes are told to watchers at once and written to the store behind (one write
per burst, in order); an end is written first and told after, compare-and-set, so nobody
hears of a result the store does not hold. A running task ends by its response, by
cancel, by its time bound (`timeout_ms`), or when its ttl passes first (spec: a task MAY be
deleted after its ttl, whatever its status): its call is cancelled upstream, its process
released, its watchers told (a waiting tasks/result answers, a listen stream is notified),
and its record is left for the store to forget as it forgets every expired one. The engine
(engine.py) decides; this keeps its runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.observability import log
from gateway.protocol.jsonrpc import Message
from gateway.tasks.inputs import Inputs
from gateway.tasks.model import Status, Task, failure
from gateway.tasks.policy import Policy, PollAdvisor
from gateway.tasks.report import Report, audit
from gateway.tasks.run import Background, Handover, Hooks, TaskRun, WriteBehind
from gateway.tasks.store import ResultTooLarge, TaskStore
from gateway.tasks.watchers import Watcher, Watchers


class Local:
    def __init__(self, store: TaskStore, report: Report, poll: PollAdvisor,
                 clock: Callable[[], float]) -> None:
        self._store = store
        self._report = report
        self._poll = poll  # learns how long each tool's tasks run
        self._clock = clock
        self._runs: dict[str, TaskRun] = {}
        self._inputs = Inputs(report)
        self._watchers = Watchers()
        self._background = Background()
        self._spawn = self._background.spawn
        self._behind = WriteBehind(store, self._watchers.tell, self._background.spawn)
        self._hooks = Hooks(self._behind.changed, self._responded, self._inputs.asked,
                            report.input_required, clock)

    # -- starting -----------------------------------------------------------------------------
    def start(self, task: Task, handover: Handover, policy: Policy) -> None:
        """`task`'s call runs here from now on, its run the call's sink."""
        run = self._runs[task.id] = TaskRun(task, handover, self._hooks)
        ticket = handover.call.ticket
        queued = ticket is not None and ticket.queued
        handover.call.when_running(lambda: self._running(run, policy, queued))
        self._expire_when_due(run)
        self._report.created(task)
        for msg in handover.pending:
            run.on_message(msg)

    def _running(self, run: TaskRun, policy: Policy, queued: bool) -> None:
        """Its call runs (at once, or out of its queue): its time bound starts now, and a
        wait in a queue pushes its ttl as long (within max_ttl_ms)."""
        if queued:
            run.extend(int((self._clock() - run.task.created_at) * 1000), policy.max_ttl_ms)
        if policy.timeout_ms is not None:
            self._time_out(run, policy.timeout_ms)

    def _expire_when_due(self, run: TaskRun) -> None:
        """At its ttl, end the task (a coroutine made only then), unless the ttl moved
        meanwhile: then at the new one."""
        end = run.task.expires_at
        if end is None:
            return

        def fire() -> None:
            if run.task.due(self._clock()):
                self._spawn(self._expire(run))
            else:
                self._expire_when_due(run)
        run.later(max(0.0, end - self._clock()), fire)

    def _time_out(self, run: TaskRun, timeout_ms: int) -> None:
        why = f"timed out after {timeout_ms} ms"
        run.later(timeout_ms / 1000, lambda: self._spawn(self._stop(
            run, Status.FAILED, why, f"Task {why}")))

    # -- what runs here -----------------------------------------------------------------------
    def task(self, task_id: str) -> Task | None:
        """The task whose call runs here, as it is now (to read, not to change), or None."""
        run = self._runs.get(task_id)
        return None if run is None else run.task

    def holds(self, task_id: str) -> bool:
        """Whether the task's call runs here (its end perhaps being written)."""
        return task_id in self._runs

    def working(self, task_id: str) -> bool:
        """Whether the task's call runs here and no end is being written."""
        run = self._runs.get(task_id)
        return run is not None and not run.ending

    def tasks(self, *, ending: bool = True) -> list[Task]:
        """Copies of the tasks whose calls run here (`ending=False`: those whose end is
        being written left out)."""
        return [run.task.copy() for run in self._runs.values() if ending or not run.ending]

    # -- from the client ----------------------------------------------------------------------
    def answer(self, task_id: str, responses: dict[str, Any]) -> bool:
        """Answers to the task's inputs, by key; False when its call does not run here."""
        run = self._runs.get(task_id)
        if run is not None and not run.ending:
            self._inputs.answer(run, responses)
        return run is not None

    def reply(self, msg: Message, owner: str) -> bool:
        """`owner`'s JSON-RPC answer to an input request a task sent (inputs.py)."""
        return self._inputs.reply(msg, owner)

    async def stop(self, task_id: str, status: Status, why: str) -> Task | None:
        """End the task whose call runs here (the call cancelled upstream); the task as it
        ended, or None when its call does not run here."""
        run = self._runs.get(task_id)
        return None if run is None else await self._stop(run, status, why)

    # -- who hears of changes -----------------------------------------------------------------
    def watch(self, task_id: str, told: Watcher) -> None:
        self._watchers.watch(task_id, told)

    def unwatch(self, task_id: str, told: Watcher) -> None:
        self._watchers.unwatch(task_id, told)

    def watching(self, task_id: str) -> bool:
        return self._watchers.watching(task_id)

    def watched(self) -> list[str]:
        """The ids of the tasks someone here watches."""
        return self._watchers.ids()

    def tell(self, task: Task) -> None:
        """A change of `task` made elsewhere (or an end written here), told to its
        watchers."""
        self._watchers.tell(task)

    # -- ending -------------------------------------------------------------------------------
    def _responded(self, run: TaskRun, msg: Message) -> None:
        self._spawn(self._commit(run, run.outcome(msg), answered=run.server_answered))

    async def _stop(self, run: TaskRun, status: Status, message: str,
                    error_text: str | None = None) -> Task:
        """End a run that has not answered: its call is cancelled upstream."""
        if not run.stop(message):
            return await run.ended()
        final = run.task.ended(status, message,
                               None if error_text is None else failure(error_text),
                               now=self._clock())
        return await self._commit(run, final)

    async def _expire(self, run: TaskRun) -> None:
        """Its ttl passed first (`max_ttl_ms` below its time bound): the call is cancelled
        and the task ends failed; its record stays for the store to forget like any
        expired one, so its id reads failed meanwhile (`Task.lapsed`), not an error."""
        ttl = run.task.ttl_ms
        task = await self._stop(run, Status.FAILED, f"expired: its ttl of {ttl} ms passed",
                                f"Task expired: its ttl of {ttl} ms passed before it finished")
        audit("task.expired", task)

    async def _commit(self, run: TaskRun, final: Task, *, answered: bool = False) -> Task:
        """Write the end (compare-and-set), then tell everyone: nobody hears of a result
        the store does not hold. `answered`: `final` is the server's answer (the report
        shows none of its words)."""
        await self._behind.written(final.id)
        written = final
        try:
            written = await self._write_end(run, final)
        except Exception as exc:  # the store failed: the end is still told, never a hang
            log.error("task.store_error", task=final.id, error=repr(exc))
        # Still the server's answer unless the end written is the gateway's (too big to
        # keep) or another writer's.
        self._end(run, written, answered=answered and written is final)
        return written

    async def _write_end(self, run: TaskRun, final: Task) -> Task:
        """The end as stored: `final`, failed instead when its result is too big to keep,
        or the end another writer stored first (it stays)."""
        try:
            saved = await self._store.save(final)
        except ResultTooLarge as exc:
            final = run.task.ended(Status.FAILED, str(exc), failure(str(exc)),
                                   now=self._clock())
            saved = await self._store.save(final)
        if not saved:  # the store holds another end already, or forgot the task
            stored = await self._store.get(final.id)
            if stored is not None and stored.terminal:  # an end is an end, never "working"
                final = stored
        return final

    def _end(self, run: TaskRun, task: Task, *, answered: bool) -> None:
        self._inputs.forget(run)
        self._runs.pop(task.id, None)
        duration = run.finish(task)
        if task.status is not Status.CANCELLED:
            self._poll.record(task.tool, duration)
        self._report.ended(task, duration, answered=answered)
        self._watchers.tell(task)

    async def settle(self, timeout_s: float) -> int:
        """Wait (at most `timeout_s`) for the ends being written; how many tasks still run
        here afterwards (none, once their calls have been answered)."""
        await self._background.wait(timeout_s)
        return len(self._runs)


__all__ = ["Local"]
