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

from gateway.observability import log
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.queues import Ticket
from gateway.tasks.model import Status, Task
from gateway.tasks.policy import Policy, queued_poll_ms
from gateway.tasks.report import audit
from gateway.tasks.store import TaskStore
from gateway.tasks.watchers import Watchers

Relay = Callable[[Message], None]




@dataclass(frozen=True, slots=True)
class Intent:
    """A call that is to become a task: whose, of which tool, in which dialect."""

    owner: str
    tool: str
    dialect: str
    upstream: str
    policy: Policy
    ttl: int | None = None  # the ttl the client asked for (core dialect)
    # Whose bounds it takes (Task.quota): a legacy session's principal; empty: the owner.
    quota: str = ""


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

    def redirect(self, sink: Consumer) -> None:
        """From now on `sink` hears the call: its messages and its response (the task's run,
        once adopted)."""

    def cancel(self, why: str) -> None: ...

    def reply(self, asked_id: RequestId, msg: Message) -> None:
        """Answer a server request the call made (`msg` carries the server's own id)."""


class TaskRun:
    """A task's upstream call in the background: the call's sink from now on."""

    takes_mrtr = False  # a modern-only server's input_required becomes the task's inputs

    def __init__(self, task: Task, handover: Handover, changed: Callable[[TaskRun], None],
                 ended: Callable[[TaskRun, Message], None],
                 index: dict[RequestId, TaskRun]) -> None:
        self.task = task  # the working copy: the freshest state, told to watchers
        self.call: UpstreamCall | None = handover.call  # None once ended (TaskEngine._end)
        handover.call.redirect(self)  # the call's messages and response come here from now on
        self.index = index  # the engine's: id of an input request -> its run
        self.changed = changed
        self.respond = ended
        self.fail_on_is_error = handover.fail_on_is_error
        self.done = handover.done  # releases the call's process and slot
        self.relay = handover.relay
        self.asked: dict[str, RequestId] = {}  # input key -> the id the server asked under
        self.keys = 0
        self.used: set[str] = set()  # every key this task ever showed: never reused
        self.timers: list[asyncio.TimerHandle] = []
        self.started = time.monotonic()
        self.ending = False  # an end is being written: nothing else changes the task
        self.ended: asyncio.Future[Task] = asyncio.get_running_loop().create_future()
        self.dirty = False
        self.flusher: asyncio.Task[None] | None = None
        self.poll_ms = task.poll_interval_ms  # as suggested when the call runs
        ticket = handover.call.ticket
        if ticket is not None and ticket.queued:
            ticket.on_move = self.queued
            self._show_queue(ticket)

    def queued(self, ahead: int | None) -> None:
        """The call's place in its queue moved (None: it runs now)."""
        if self.ending or self.call is None:
            return
        if ahead is None:
            self.task.status_message, self.task.poll_interval_ms = None, self.poll_ms
        elif self.call.ticket is not None:
            self._show_queue(self.call.ticket)
        self.task.touch()
        self.changed(self)

    def _show_queue(self, ticket: Ticket) -> None:
        """The status says it waits and how many are ahead; polls follow the expected
        wait."""
        self.task.status_message = f"queued: {ticket.ahead} ahead"
        self.task.poll_interval_ms = queued_poll_ms(self.poll_ms, ticket.expected_wait_s())

    def on_message(self, msg: Message) -> None:
        if self.ending:
            return
        if "id" in msg and "method" in msg:
            self._input(msg)
        elif msg.get("method") == mcp.PROGRESS:
            params = msg.get("params") or {}
            done, total, note = params.get("progress"), params.get("total"), params.get("message")
            status = f"{_num(done)}/{_num(total)}" if total is not None else f"{_num(done)}"
            self.task.status_message = f"{status}: {note}" if note else status
            self.task.touch()
        else:
            return
        self.changed(self)
        if self.relay is not None:
            self.relay(msg)

    def _input(self, msg: Message) -> None:
        task = self.task
        self.keys += 1
        key = mcp.input_key(msg, self.keys, self.used)  # spec: unique for the task's life
        self.asked[key] = msg["id"]
        self.index[msg["id"]] = self
        task.inputs[key] = {"method": msg["method"], "params": msg.get("params", {})}
        if task.status is Status.WORKING:
            task.move(Status.INPUT_REQUIRED, "waiting for the client's input")
            audit("task.input_required", task)
        else:
            task.touch()

    def answered(self, key: str, msg: Message) -> None:
        """The client's answer to input `key`, sent upstream under the server's own id."""
        del self.task.inputs[key]
        asked_id = self.asked.pop(key)
        self.index.pop(asked_id, None)
        msg["id"] = asked_id
        assert self.call is not None  # answers reach running tasks only
        self.call.reply(asked_id, msg)

    def settle(self) -> None:
        """After answers: the task works again once nothing is outstanding."""
        if not self.task.inputs and self.task.status is Status.INPUT_REQUIRED:
            self.task.move(Status.WORKING)
        self.task.touch()
        self.changed(self)

    def on_response(self, msg: Message) -> None:
        if not self.ending:
            self.ending = True
            self.respond(self, msg)

    def outcome(self, msg: Message) -> Task:
        """The task as the call's response ends it (not yet written)."""
        error = msg.get("error")
        if error is not None:
            final = self.task.ended(Status.FAILED,
                                    str(error.get("message") or "the call failed"), error)
            final.size = len(jsonrpc.dumps(error))  # the server's error is kept like a result
            return final
        result = msg.get("result") or {}
        failed = self.fail_on_is_error and result.get("isError") is True
        final = self.task.ended(Status.FAILED if failed else Status.COMPLETED)
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
    """A run's changes: told to its watchers at once, written to the store behind them, in
    order, once per burst (a run's end waits for the write in flight: see the engine)."""

    def __init__(self, store: TaskStore, watchers: Watchers,
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]]) -> None:
        self.store = store
        self.watchers = watchers
        self.spawn = spawn

    def changed(self, run: TaskRun) -> None:
        run.dirty = True
        if run.flusher is None:
            run.flusher = self.spawn(self._flush(run))
        self.watchers.tell(run.task)

    async def _flush(self, run: TaskRun) -> None:
        try:
            while run.dirty and not run.ending:
                run.dirty = False
                await self.store.save(run.task.copy())
        finally:
            run.flusher = None


def _num(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


__all__ = ["Attach", "Background", "Handover", "Intent", "Relay", "TaskRun", "UpstreamCall",
           "WriteBehind"]
