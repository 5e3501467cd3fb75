"""The `io.modelcontextprotocol/tasks` extension (spec 2026-07-28,
26-ext-tasks-specification-draft-tasks.md): CreateTaskResult, tasks/get with the detailed
task, tasks/update, tasks/cancel, and `notifications/tasks`. tasks/result and tasks/list do not
exist in this dialect (-32601, by not being methods)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway import errors
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.tasks.dialects import call_answer, task_fields
from gateway.tasks.model import Dialect, Status, Task

EXTENSION = "io.modelcontextprotocol/tasks"
NAME: Dialect = "extension"
GET = "tasks/get"
METHODS = frozenset({GET, "tasks/update", "tasks/cancel"})
NOTIFICATION = "notifications/tasks"


def declared(capabilities: dict[str, Any]) -> bool:
    extensions = capabilities.get("extensions")
    return isinstance(extensions, dict) and EXTENSION in extensions


def without(capabilities: dict[str, Any]) -> dict[str, Any]:
    """`capabilities` minus this extension."""
    if not declared(capabilities):
        return capabilities
    extensions = {k: v for k, v in capabilities["extensions"].items() if k != EXTENSION}
    return {**capabilities, "extensions": extensions}


def missing() -> errors.MissingCapability:
    """spec: requests that need the extension without declaring it get -32021."""
    return errors.MissingCapability(
        "Missing required client capability: the tasks extension",
        {"requiredCapabilities": {"extensions": {EXTENSION: {}}}})


def fields(task: Task) -> dict[str, Any]:
    return task_fields(task, "ttlMs", "pollIntervalMs")


def created(task: Task) -> dict[str, Any]:
    return {"resultType": "task", **fields(task)}


def final(task: Task, id_: RequestId) -> Message:
    """A keyed call's answer at its task's end (tasks/keys.py): what the call answered,
    a result marked complete."""
    answer = call_answer(task, id_)
    if "result" in answer:
        answer["result"].setdefault("resultType", "complete")
    return answer


def input_required(task: Task, id_: RequestId) -> Message:
    """A keyed call's task waits for input its caller, which made no task, can give: the
    MRTR InputRequiredResult of its outstanding inputs (spec 2026-07-28, MRTR), without
    requestState (the key names the call); the retry's inputResponses answer them."""
    return jsonrpc.result(id_, {"resultType": "input_required",
                                "inputRequests": dict(task.inputs)})


def detailed(task: Task) -> dict[str, Any]:
    """The DetailedTask: result, error or inputRequests inlined by status."""
    out = fields(task)
    if task.status is Status.COMPLETED:
        # kept serialized (model): embedded as it is, never parsed again
        out["result"] = orjson.Fragment(task.result) if task.result is not None else {}
    elif task.status is Status.FAILED:
        out["error"] = task.error or {"code": -32603, "message": task.status_message or ""}
    elif task.status is Status.INPUT_REQUIRED:
        out["inputRequests"] = dict(task.inputs)
    return out
