"""The task engine: owns the upstream calls that became tasks, whichever dialect made them.

A `TaskRun` is the `Sink` of one upstream `tools/call`: the server's input requests become the
task's outstanding inputs (keys unique for the task's life), progress is folded into its
status message, the response ends it. The engine answers inputs, cancels, enforces
`timeout_ms`, tells watchers of every change, and learns how long each tool takes to suggest
poll intervals. No wire shapes here: dialects render tasks; no HTTP: the era adapters call in.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from gateway.observability import log, metrics, owner_hash
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.tasks.model import Status, Task
from gateway.tasks.store import ResultTooLarge, TaskStore

if TYPE_CHECKING:  # the connection knows nothing of tasks; a core upstream's own tasks aside
    from gateway.upstream.base import Call

POLL_FLOOR_MS = 250  # never suggest polling faster than this
POLL_CEILING_MS = 30_000
HISTORY = 20  # durations remembered per tool
Watcher = Callable[[Task], None]
Relay = Callable[[Message], None]


class TaskRun:
    """One task's upstream call in the background: the call's `Sink` from now on."""

    def __init__(self, engine: TaskEngine, task: Task, call: Call, fail_on_is_error: bool,
                 done: Callable[[], None] | None, relay: Relay | None) -> None:
        self.engine = engine
        self.task = task
        self.call = call
        self.fail_on_is_error = fail_on_is_error  # core dialect: isError fails the task
        self.done = done  # releases the call's process
        self.relay = relay  # core dialect: input requests and progress go on to the client
        self.asked: dict[str, Any] = {}  # input key -> the id the server asked under
        self.keys = 0
        self.used: set[str] = set()  # every key this task ever showed: never reused
        self.timer: asyncio.TimerHandle | None = None
        self.started = time.monotonic()

    # -- Sink --------------------------------------------------------------------------------
    def on_message(self, msg: Message) -> None:
        task = self.task
        if task.terminal:
            return
        if "id" in msg and "method" in msg:
            self.keys += 1
            key = mcp.input_key(msg, self.keys, self.used)  # spec: unique for the task's life
            self.asked[key] = msg["id"]
            self.engine.asked[msg["id"]] = self
            task.inputs[key] = {"method": msg["method"], "params": msg.get("params", {})}
            if task.status is Status.WORKING:
                task.move(Status.INPUT_REQUIRED, "waiting for the client's input")
                log.info("task.input_required", task=task.id, tool=task.tool,
                         upstream=self.call.conn.name,
                         owner=owner_hash(task.owner))
            else:
                task.touch()
            self.engine.changed(task)
        elif msg.get("method") == mcp.PROGRESS:
            params = msg.get("params") or {}
            done, total, note = params.get("progress"), params.get("total"), params.get("message")
            status = f"{_num(done)}/{_num(total)}" if total is not None else f"{_num(done)}"
            task.status_message = f"{status}: {note}" if note else status
            task.touch()
            self.engine.changed(task)
        else:
            return
        if self.relay is not None:
            self.relay(msg)

    def on_response(self, msg: Message) -> None:
        if self.task.terminal:
            return
        error = msg.get("error")
        if error is not None:
            self.engine.finish(self, error=error)
        else:
            result = msg.get("result") or {}
            failed = self.fail_on_is_error and result.get("isError") is True
            self.engine.finish(self, result=result, failed=failed)


class TaskEngine:
    def __init__(self, store: TaskStore) -> None:
        self.store = store
        self.runs: dict[str, TaskRun] = {}
        self.asked: dict[str, TaskRun] = {}  # id of an input request sent on -> its task
        self.watchers: defaultdict[str, set[Watcher]] = defaultdict(set)
        self.durations: defaultdict[str, deque[float]] = defaultdict(lambda: deque(maxlen=HISTORY))

    def adopt(self, task: Task, call: Call, *, fail_on_is_error: bool = False,
              timeout_ms: int | None = None, done: Callable[[], None] | None = None,
              pending: list[Message] = (),  # type: ignore[assignment]
              relay: Relay | None = None) -> TaskRun:
        """Make `task` the owner of `call`, from now on in the background."""
        run = TaskRun(self, task, call, fail_on_is_error, done, relay)
        call.sink = run
        self.runs[task.id] = run
        if timeout_ms is not None:
            run.timer = asyncio.get_running_loop().call_later(
                timeout_ms / 1000, self._timed_out, run, timeout_ms)
        metrics["tasks.created"] += 1
        log.info("task.created", task=task.id, tool=task.tool, upstream=call.conn.name,
                 owner=owner_hash(task.owner),
                 dialect=task.dialect)
        for msg in pending:
            run.on_message(msg)
        return run

    def suggest_poll_ms(self, tool: str, configured: int) -> int:
        """From the policy until a tool has history; then a quarter of its median duration,
        within [POLL_FLOOR_MS, POLL_CEILING_MS]: fast tools are polled soon, slow ones
        less often."""
        seen = self.durations.get(tool)
        if not seen or len(seen) < 3:
            return configured
        median_ms = statistics.median(seen) * 1000
        return int(min(POLL_CEILING_MS, max(POLL_FLOOR_MS, median_ms / 4)))

    # -- from the client ----------------------------------------------------------------------
    def answer(self, task: Task, responses: dict[str, Any]) -> None:
        """Answers go upstream under the server's own ids; unknown or already answered keys
        are ignored; the task works again once nothing is outstanding."""
        run = self.runs.get(task.id)
        if run is None or task.terminal:
            return
        for key in [k for k in task.inputs if k in responses]:
            self._answered(run, key, jsonrpc.result(None, responses[key]))
        self._settle(task)

    def reply(self, msg: Message) -> bool:
        """A client's JSON-RPC answer (result or error) to an input request a task sent
        (core dialect); False when it answers no task's request."""
        run = self.asked.get(msg["id"])
        if run is None:
            return False
        key = next(k for k, v in run.asked.items() if v == msg["id"])
        self._answered(run, key, msg)
        self._settle(run.task)
        return True

    def _answered(self, run: TaskRun, key: str, msg: Message) -> None:
        """Send an answer upstream under the server's own id (the connection maps it)."""
        del run.task.inputs[key]
        asked_id = run.asked.pop(key)
        self.asked.pop(asked_id, None)
        msg["id"] = asked_id
        run.call.conn.reply(asked_id, msg)

    def _settle(self, task: Task) -> None:
        if not task.inputs and task.status is Status.INPUT_REQUIRED:
            task.move(Status.WORKING)
        task.touch()
        self.changed(task)

    def cancel(self, task: Task, why: str = "cancelled by the client") -> None:
        """Ask the upstream to stop, and end the task cancelled unless it already ended."""
        run = self.runs.get(task.id)
        if task.terminal or run is None:
            return
        run.call.conn.cancel(run.call, why)
        self._end(run, Status.CANCELLED, why)

    # -- ending -------------------------------------------------------------------------------
    def finish(self, run: TaskRun, *, result: dict[str, Any] | None = None,
               error: dict[str, Any] | None = None, failed: bool = False) -> None:
        task = run.task
        raw = jsonrpc.dumps(result if error is None else error)
        try:
            self.store.keep(task, len(raw))
        except ResultTooLarge as exc:
            result, error = None, {"code": jsonrpc.INTERNAL_ERROR, "message": str(exc)}
        if error is not None:
            task.error = error
            self._end(run, Status.FAILED, str(error.get("message", "the call failed")))
        else:
            # Kept serialized, as an exact-size copy (orjson's own buffer keeps 4 KiB even
            # for small results): ~100 bytes instead of ~450 as dicts, and a tasks/get
            # embeds it without serializing it again.
            task.result = orjson.Fragment(bytes(memoryview(raw)))
            self._end(run, Status.FAILED if failed else Status.COMPLETED, None)

    def _timed_out(self, run: TaskRun, timeout_ms: int) -> None:
        if run.task.terminal:
            return
        run.call.conn.cancel(run.call, "the task timed out")
        run.task.error = {"code": jsonrpc.INTERNAL_ERROR,
                          "message": f"Task timed out after {timeout_ms} ms"}
        self._end(run, Status.FAILED, f"timed out after {timeout_ms} ms")

    def _end(self, run: TaskRun, status: Status, message: str | None) -> None:
        task = run.task
        task.inputs.clear()
        self._forget_inputs(run)
        task.move(status, message)
        if run.timer is not None:
            run.timer.cancel()
        self.runs.pop(task.id, None)
        duration = time.monotonic() - run.started
        if status is not Status.CANCELLED:
            self.durations[task.tool].append(duration)
        if run.done is not None:
            run.done()
        metrics[f"tasks.{status}"] += 1
        log.info(f"task.{status}", task=task.id, tool=task.tool, upstream=run.call.conn.name,
                 owner=owner_hash(task.owner),
                 duration_s=round(duration, 3))
        self.changed(task)

    def _forget_inputs(self, run: TaskRun) -> None:
        for asked_id in run.asked.values():
            self.asked.pop(asked_id, None)
        run.asked.clear()

    # -- watchers -----------------------------------------------------------------------------
    def watch(self, task_id: str, fn: Watcher) -> None:
        self.watchers[task_id].add(fn)

    def unwatch(self, task_id: str, fn: Watcher) -> None:
        fns = self.watchers.get(task_id)
        if fns is not None:
            fns.discard(fn)
            if not fns:
                del self.watchers[task_id]

    def changed(self, task: Task) -> None:
        for fn in list(self.watchers.get(task.id, ())):
            fn(task)

    def expire(self) -> None:
        """Drop expired tasks; a run still going is cancelled upstream."""
        for task in self.store.sweep():
            run = self.runs.pop(task.id, None)
            if run is not None:
                self._forget_inputs(run)
                run.call.conn.cancel(run.call, "the task expired")
                if run.done is not None:
                    run.done()
            log.info("task.expired", task=task.id, tool=task.tool, owner=owner_hash(task.owner),
                     upstream=run.call.conn.name if run is not None else None)
            self.watchers.pop(task.id, None)


def watch_progress(params: dict[str, Any]) -> bool:
    """Ask the upstream for progress on a call that is, or may become, a task, so its
    statusMessage can tell how far it got. True when the gateway asked (the client did
    not, and its progress goes nowhere); False when the client asked itself."""
    meta = params.get("_meta")
    if isinstance(meta, dict) and "progressToken" in meta:
        return False
    params["_meta"] = {**(meta if isinstance(meta, dict) else {}), "progressToken": "task"}
    return True


def _num(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
