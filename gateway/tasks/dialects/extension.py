"""The `io.modelcontextprotocol/tasks` extension (spec 2026-07-28,
26-ext-tasks-specification-draft-tasks.md): CreateTaskResult, tasks/get with the detailed
task, tasks/update, tasks/cancel, and `notifications/tasks`. tasks/result and tasks/list do not
exist in this dialect (-32601, by not being methods)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway import errors
from gateway.tasks.dialects import Lacking, check_scopes, task_fields, task_id_of, unscoped
from gateway.tasks.engine import TaskEngine, TaskExpired, TaskNotFound
from gateway.tasks.model import Status, Task

EXTENSION = "io.modelcontextprotocol/tasks"
NAME = "extension"
METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
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


async def handle(engine: TaskEngine, method: str, params: dict[str, Any], owner: str,
                 lacking: Lacking = unscoped) -> dict[str, Any]:
    """tasks/get, tasks/update, tasks/cancel for `owner`; the result to send."""
    task = check_scopes(await _task(engine, task_id_of(params), owner), lacking)
    if method == "tasks/get":
        return {**detailed(task), "resultType": "complete"}
    if method == "tasks/update":
        responses = params.get("inputResponses")
        if not isinstance(responses, dict):
            raise errors.InvalidParams("Invalid params: inputResponses must be an object")
        await engine.answer(task, responses)
    else:  # tasks/cancel: an ack, idempotent on terminal tasks (spec: eventual)
        await engine.cancel(task)
    return {"resultType": "complete"}


async def _task(engine: TaskEngine, task_id: Any, owner: str) -> Task:
    try:
        task = await engine.find(task_id, owner)
    except TaskExpired:
        raise errors.InvalidParams("Task has expired", {"taskId": task_id}) from None
    except TaskNotFound:
        raise errors.InvalidParams("Task not found", {"taskId": task_id}) from None
    if task.dialect != NAME:  # a task renders only in the dialect it was created in
        raise errors.InvalidParams("Task not found", {"taskId": task_id})
    return task
