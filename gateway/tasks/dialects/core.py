"""Core tasks of protocol 2025-11-25 (spec/tasks-2025-11-25.md) for legacy sessions: the
server capability, `execution.taskSupport` in tools/list, CreateTaskResult, tasks/get,
tasks/list, tasks/cancel, the final message of tasks/result, notifications/tasks/status.

Wire shapes and checks only: no engine here (handlers.py serves tasks/* from it), so the
router that reads these names stays light; the legacy era (downstream/core_tasks.py) does
the waiting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway import errors
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.tasks.dialects import call_answer, task_fields
from gateway.tasks.model import Dialect, Task

NAME: Dialect = "core"
VERSION = "2025-11-25"  # the only revision with core tasks (the extension replaces them)
RESULT = "tasks/result"
METHODS = frozenset({"tasks/get", "tasks/list", "tasks/cancel", RESULT})
RELATED_TASK = mcp.RELATED_TASK
IMMEDIATE_RESPONSE = "io.modelcontextprotocol/model-immediate-response"
STATUS_NOTIFICATION = "notifications/tasks/status"
# spec (Capabilities, Server Capabilities): what the gateway serves for every upstream.
CAPABILITY: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
# spec (Tool-Level Negotiation): how each policy mode reads to a client.
TASK_SUPPORT = {"never": "forbidden", "auto": "optional", "always": "optional",
                "required": "required"}
PAGE_SIZE = 50  # tasks per tasks/list page


def offered(version: str) -> bool:
    return version == VERSION


def fields(task: Task) -> dict[str, Any]:
    return task_fields(task, "ttl", "pollInterval")


def created(task: Task, immediate: str | None) -> dict[str, Any]:
    """CreateTaskResult; the immediate response is the tool's configured text for the model
    (spec: Creating Tasks, `model-immediate-response`)."""
    out: dict[str, Any] = {"task": fields(task)}
    if immediate:
        out["_meta"] = {IMMEDIATE_RESPONSE: immediate}
    return out


def is_task_call(params: dict[str, Any]) -> bool:
    """A task-augmented request (spec: Creating Tasks)."""
    return "task" in params


def strip_task(params: dict[str, Any]) -> None:
    """A task-augmented call's params as a plain call's."""
    del params["task"]


def requested_ttl(params: dict[str, Any]) -> int | None:
    """The TTL a task-augmented call asks for (`params.task.ttl`), None when it asks none."""
    task = params["task"]
    if not isinstance(task, dict):
        raise errors.InvalidParams("Invalid params: task must be an object")
    ttl = task.get("ttl")
    if ttl is not None and (not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0):
        raise errors.InvalidParams("Invalid params: task.ttl must be a non-negative integer")
    return ttl


def mark_tools(msg: Message, support: Callable[[str], str]) -> Message:
    """tools/list: every tool gains `execution.taskSupport`; all else (pagination, other
    execution fields) stays as the upstream sent it."""
    for tool in mcp.listed_tools(msg):
        execution = tool.get("execution")
        tool["execution"] = {**(execution if isinstance(execution, dict) else {}),
                             "taskSupport": support(str(tool.get("name", "")))}
    return msg


def final(task: Task, id_: RequestId) -> Message:
    """tasks/result of a terminal task: exactly what the call returned, result or JSON-RPC
    error; a result carries the related-task `_meta` (spec: Result Retrieval)."""
    return call_answer(task, id_, {RELATED_TASK: {"taskId": task.id}})


def related(msg: Message, task: Task) -> Message:
    """spec (Associating Task-Related Messages): a request the task sent carries its id."""
    params = msg.get("params")
    if not isinstance(params, dict):
        params = msg["params"] = {}
    meta = params.get("_meta")
    params["_meta"] = {**(meta if isinstance(meta, dict) else {}),
                       RELATED_TASK: {"taskId": task.id}}
    return msg


def status_notification(task: Task) -> Message:
    return jsonrpc.notification(STATUS_NOTIFICATION, fields(task))


# The tasks/* the gateway answers at once, by method (tasks/result waits: the era serves it).
