"""A task's upstream call running in this process (`TaskRun`, the call's sink once the
engine adopted it), what the engine needs of such a call (`UpstreamCall`), and what an era
hands over with it (`Intent`, `Handover`).

The server's input requests become the task's outstanding inputs (keys unique for the
task's life), answered here under the server's own ids; progress is folded into the status
message; the response is the task's outcome (written and told by the engine).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.laggards import Deferring, Laggards
from gateway.observability import log
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.queues import Ticket
from gateway.tasks.curation import MASK, unmask
from gateway.tasks.keys import CallKey
from gateway.tasks.model import Dialect, Status, Task
from gateway.tasks.policy import Policy, queued_poll_ms
from gateway.tasks.store import TaskStore

Relay = Callable[[Message], None]


@dataclass(frozen=True, slots=True)
class Intent:
    """A call that is to become a task: whose, of which tool, in which dialect."""

    owner: str
    tool: str
    dialect: Dialect
    upstream: str
    policy: Policy
    ttl: int | None = None  # the ttl the client asked for (core dialect)
    # Whose bounds it takes (Task.quota): a legacy session's principal; empty: the owner.
    quota: str = ""
    key: CallKey | None = None  # an Idempotency-Key's (tasks/keys.py): run once
    push: dict[str, Any] | None = None  # a webhook its client asked for (gateway/push)


@dataclass(slots=True)
class Handover:
    """The call a new task takes over, and how its run treats it."""

    call: UpstreamCall
    done: Callable[[], None] | None = None  # releases the call's process and slot
    relay: Relay | None = None  # core dialect: inputs and progress to the session
    pending: list[Message] = field(default_factory=list)  # inputs asked before it
    fail_on_is_error: bool = False  # core dialect: isError fails the task


Attach = Callable[[Task], Awaitable[Handover | None]]


class Consumer(Protocol):
    """What takes a call's messages and its response (upstream/'s `Sink`, seen from here)."""

    @property
    def takes_mrtr(self) -> bool: ...

    def on_message(self, msg: Message) -> None: ...

    def on_response(self, msg: Message) -> None: ...

    def on_refused(self, capability: str) -> None: ...


class UpstreamCall(Protocol):
    """What the engine needs of an upstream call: upstream/ provides it."""

    ticket: Ticket | None  # its place under a concurrency limit, if one applies

    def when_running(self, run: Callable[[], None]) -> None:
        """`run()` once the call is sent: at once, unless it waits in a queue."""

    @property
    def upstream(self) -> str: ...

    def adopt(self, sink: Consumer) -> None:
        """From now on `sink` (the task's run) hears the call, its messages and its
        response; it is the task's, which alone ends it (its client's session ending does
        not)."""

    def cancel(self, why: str) -> None: ...

    def reply(self, asked_id: RequestId, msg: Message) -> None:
        """Answer a server request the call made (`msg` carries the server's own id)."""

    @property
    def failure(self) -> Exception | None:
        """The gateway's error that ended the call (its transport failed it), None when its
        answer is the server's."""


@dataclass(frozen=True, slots=True)
class Hooks:
    """What every run tells the one that keeps it (tasks/local.py), and by which clock."""

    changed: Callable[[TaskRun], None]  # its task changed: told now, written behind
    responded: Callable[[TaskRun, Message], None]  # the call's response: the end to write
    asked: Callable[[TaskRun, Any], None]  # the server asked for input under this id
    waiting: Callable[[Task], None]  # its task now waits for the client's input (report)
    clock: Callable[[], float]  # the engine's: when the task changed
    late: Laggards = field(default_factory=Laggards)  # its timers wait to be armed here


class TaskRun(Deferring):
    """A task's upstream call in the background: the call's sink from now on. It alone
    changes its working copy of the task; its keeper reads it and asks through verbs."""

    takes_mrtr = False  # a modern-only server's input_required becomes the task's inputs

    def __init__(self, task: Task, handover: Handover, hooks: Hooks) -> None:
        super().__init__()
        self._task = task  # the working copy: the freshest state, told to watchers
        self._call: UpstreamCall | None = handover.call  # None once ended (`finish`)
        handover.call.adopt(self)  # the call's messages and response come here from now on
        self._hooks = hooks
        self._fail_on_is_error = handover.fail_on_is_error
        self._done = handover.done  # releases the call's process and slot
        self._relay = handover.relay
        self._asked: dict[str, RequestId] = {}  # input key -> the id the server asked under
        self._keys = 0
        self._used: set[str] = set()  # every key this task ever showed: never reused
        self._timers: list[asyncio.TimerHandle] = []
        self._deferred: list[tuple[float, Callable[[], object]]] = []  # (due, fire): `later`
        self._started = time.monotonic()
        self._ending = False  # an end is being written: nothing else changes the task
        self._ended: asyncio.Future[Task] = asyncio.get_running_loop().create_future()
        self._poll_ms = task.poll_interval_ms  # as suggested when the call runs
        ticket = handover.call.ticket
        if ticket is not None and ticket.queued:
            ticket.on_move = self.queued
            self._show_queue(ticket)

    @property
    def task(self) -> Task:
        """The task as it is now (to read: only the run changes it)."""
        return self._task

    @property
    def ending(self) -> bool:
        """Whether an end is being written (or was): the task changes no more here."""
        return self._ending

    def later(self, delay_s: float, fire: Callable[[], object]) -> None:
        """`fire()` after `delay_s`, unless the run has ended by then: armed once the run
        has lasted a tick (laggards.py), as most end sooner."""
        if (due := self._due(delay_s, self._hooks.late)) is None:
            self._timers.append(asyncio.get_running_loop().call_later(delay_s, fire))
        else:
            self._deferred.append((due, fire))

    def late(self) -> None:
        """It has lasted a tick: the timers it deferred are armed."""
        super().late()
        if not self._ended.done():
            self._timers.extend(self._at(due, fire) for due, fire in self._deferred)
        self._deferred.clear()

    def extend(self, ms: int, cap_ms: int) -> None:
        """Its ttl grows by `ms`, within `cap_ms` (it never shrinks): its call waited that
        long in a queue, which its time bound does not count (issue 40: a wait must not eat
        into the run nor into its result's retention). Every task answer reports it."""
        task = self._task
        if self._ending or task.ttl_ms is None:
            return
        ttl = max(task.ttl_ms, min(task.ttl_ms + ms, cap_ms))
        if ttl != task.ttl_ms:
            task.ttl_ms = ttl
            task.touch(self._hooks.clock())
            self._hooks.changed(self)

    def queued(self, ahead: int | None) -> None:
        """The call's place in its queue moved (None: it runs now)."""
        if self._ending or self._call is None:
            return
        if ahead is None:
            self._task.status_message, self._task.poll_interval_ms = None, self._poll_ms
        elif self._call.ticket is not None:
            self._show_queue(self._call.ticket)
        self._task.touch(self._hooks.clock())
        self._hooks.changed(self)

    def _show_queue(self, ticket: Ticket) -> None:
        """The status says it waits and how many are ahead; polls follow the expected
        wait."""
        self._task.status_message = f"queued: {ticket.ahead} ahead"
        self._task.poll_interval_ms = queued_poll_ms(self._poll_ms, ticket.expected_wait_s())

    def on_message(self, msg: Message) -> None:
        if self._ending:
            return
        if "id" in msg and "method" in msg:
            self._input(msg)
        elif msg.get("method") == mcp.PROGRESS:
            params = msg.get("params") or {}
            done, total, note = params.get("progress"), params.get("total"), params.get("message")
            status = f"{_num(done)}/{_num(total)}" if total is not None else f"{_num(done)}"
            self._task.status_message = f"{status}: {note}" if note else status
            self._task.touch(self._hooks.clock())
        else:
            return
        self._hooks.changed(self)
        if self._relay is not None:
            self._relay(msg)

    def _input(self, msg: Message) -> None:
        task = self._task
        self._keys += 1
        key = mcp.input_key(msg, self._keys, self._used)  # spec: unique for the task's life
        self._asked[key] = msg["id"]
        self._hooks.asked(self, msg["id"])
        task.inputs[key] = {"method": msg["method"], "params": msg.get("params", {})}
        if task.status is Status.WORKING:
            task.move(Status.INPUT_REQUIRED, "waiting for the client's input",
                      now=self._hooks.clock())
            self._hooks.waiting(task)
        else:
            task.touch(self._hooks.clock())

    def key_of(self, asked_id: Any) -> str | None:
        """The input key of the server's request `asked_id`, while it is outstanding."""
        return next((k for k, v in self._asked.items() if v == asked_id), None)

    def asked_ids(self) -> list[Any]:
        """The ids of the server's input requests still outstanding."""
        return list(self._asked.values())

    def answer(self, key: str, msg: Message) -> RequestId:
        """The client's answer to input `key`, sent upstream under the server's own id
        (returned)."""
        del self._task.inputs[key]
        asked_id = self._asked.pop(key)
        msg["id"] = asked_id
        if self._call is not None:  # answers reach running tasks only
            self._call.reply(asked_id, msg)
        return asked_id

    def settle(self) -> None:
        """After answers: the task works again once nothing is outstanding."""
        now = self._hooks.clock()
        if not self._task.inputs and self._task.status is Status.INPUT_REQUIRED:
            self._task.move(Status.WORKING, now=now)
        self._task.touch(now)
        self._hooks.changed(self)

    def on_response(self, msg: Message) -> None:
        if not self._ending:
            self._ending = True
            if self._task.tool.endswith(MASK):  # a call of a tool not exposed: answered as
                # an unknown tool is, under the name called (tasks/curation.py)
                msg = unmask(msg, self._task.tool.removesuffix(MASK))
            self._hooks.responded(self, msg)

    def stop(self, why: str) -> bool:
        """Cancel the call upstream: its end is to be written. False when an end is being
        written already (`ended` tells it)."""
        if self._ending:
            return False
        self._ending = True
        if self._call is not None:
            self._call.cancel(why)
        return True

    async def ended(self) -> Task:
        """The task as its end was written (or as it ended when the store failed)."""
        return await asyncio.shield(self._ended)

    def finish(self, task: Task) -> float:
        """The end is written: `task` is final, the call and its process let go, timers
        off, whoever waits on `ended` told. The seconds it ran."""
        self._task = task
        # The call names its run as sink: without this the pair (and the result) would wait
        # for the garbage collector, which a quiet gateway may not run for a long while.
        self._call = None
        self._unwatch()
        self._deferred.clear()
        for timer in self._timers:
            timer.cancel()
        self._asked.clear()
        if self._done is not None:
            self._done()
        self._ended.set_result(task)
        return time.monotonic() - self._started

    @property
    def server_answered(self) -> bool:
        """Whether the call's answer is the server's own, not the gateway's error for a
        transport that failed it (the report shows none of a server's words)."""
        return self._call is None or self._call.failure is None

    def outcome(self, msg: Message) -> Task:
        """The task as the call's response ends it (not yet written)."""
        now = self._hooks.clock()
        error = msg.get("error")
        if error is not None:
            final = self._task.ended(Status.FAILED,
                                     str(error.get("message") or "the call failed"), error,
                                     now=now)
            final.size = len(jsonrpc.dumps(error))  # the server's error is kept like a result
            return final
        result = msg.get("result") or {}
        failed = self._fail_on_is_error and result.get("isError") is True
        final = self._task.ended(Status.FAILED if failed else Status.COMPLETED, now=now)
        # An exact-size copy: orjson's own buffer keeps 4 KiB even for small results.
        final.result = bytes(memoryview(jsonrpc.dumps(result)))
        final.size = len(final.result)
        return final

    def on_refused(self, capability: str) -> None:
        pass  # the call goes on without it, and fails by itself if it must


class Background:
    """The engine's own asyncio tasks (writes, timed ends): kept until done, errors logged."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task.engine_error", error=repr(task.exception()))

    async def wait(self, timeout_s: float) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)


class WriteBehind:
    """Runs' changes: told to their watchers at once, written to the store behind them, in
    order, once per burst (a run's end waits for the write in flight: `written`)."""

    def __init__(self, store: TaskStore, tell: Callable[[Task], None],
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]]) -> None:
        self._store = store
        self._tell = tell
        self._spawn = spawn
        self._dirty: set[str] = set()  # tasks changed since their last write began
        self._flushers: dict[str, asyncio.Task[None]] = {}  # a write in flight, by task

    def changed(self, run: TaskRun) -> None:
        task_id = run.task.id
        self._dirty.add(task_id)
        if task_id not in self._flushers:
            self._flushers[task_id] = self._spawn(self._flush(run))
        self._tell(run.task)

    async def written(self, task_id: str) -> None:
        """Once the write in flight for the task, if any, is done (its error, if any, is
        logged by itself)."""
        flusher = self._flushers.get(task_id)
        if flusher is not None:
            await asyncio.wait({flusher})

    async def _flush(self, run: TaskRun) -> None:
        task_id = run.task.id
        try:
            while task_id in self._dirty and not run.ending:
                self._dirty.discard(task_id)
                await self._store.save(run.task.copy())
        finally:
            self._dirty.discard(task_id)
            del self._flushers[task_id]


def _num(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


__all__ = ["Attach", "Background", "Handover", "Hooks", "Intent", "Relay", "TaskRun",
           "UpstreamCall", "WriteBehind"]
