"""Core tasks of protocol 2025-11-25 (spec/tasks-2025-11-25.md) for legacy sessions: the
server capability, `execution.taskSupport` in tools/list, CreateTaskResult, tasks/get,
tasks/list, tasks/cancel, the final message of tasks/result, notifications/tasks/status.

Wire shapes and checks only; the legacy era (downstream/core_tasks.py) does the waiting.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

import orjson

from gateway import errors
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.tasks.dialects import Lacking, check_scopes, task_fields, task_id_of, unscoped
from gateway.tasks.engine import TaskEngine, TaskExpired, TaskNotFound
from gateway.tasks.model import Status, Task

NAME = "core"
VERSION = "2025-11-25"  # the only revision with core tasks (the extension replaces them)
RESULT = "tasks/result"
METHODS = frozenset({"tasks/get", "tasks/list", "tasks/cancel", RESULT})
RELATED_TASK = "io.modelcontextprotocol/related-task"
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


# -- tasks/* ---------------------------------------------------------------------------------
async def lookup(engine: TaskEngine, task_id: Any, owner: str,
        lacking: Lacking = unscoped) -> Task:
    """The owner's core task; -32602 for unknown, expired, foreign or other-dialect ids,
    InsufficientScope (403) when the caller may not use its tool."""
    try:
        task = await engine.find(task_id, owner)
    except TaskExpired:
        raise errors.InvalidParams("Failed to retrieve task: Task has expired",
                                   {"taskId": task_id}) from None
    except TaskNotFound:
        task = None
    if task is None or task.dialect != NAME:  # a task renders only in its own dialect
        raise errors.InvalidParams("Failed to retrieve task: Task not found",
                                   {"taskId": task_id})
    return check_scopes(task, lacking)


async def get(engine: TaskEngine, params: dict[str, Any], owner: str,
        lacking: Lacking = unscoped) -> dict[str, Any]:
    return fields(await lookup(engine, task_id_of(params), owner, lacking))


async def cancel(engine: TaskEngine, params: dict[str, Any], owner: str,
        lacking: Lacking = unscoped) -> dict[str, Any]:
    """spec (Task Cancellation): -32602 for a terminal task; otherwise the task is cancelled
    before the answer, which shows it."""
    task = await lookup(engine, task_id_of(params), owner, lacking)
    if task.terminal:
        raise errors.InvalidParams(
            f"Cannot cancel task: already in terminal status '{task.status}'",
            {"taskId": task.id})
    return fields(await engine.cancel(task, "The task was cancelled by request."))


async def list_page(engine: TaskEngine, params: dict[str, Any], owner: str,
        lacking: Lacking = unscoped) -> dict[str, Any]:
    """spec (Task Listing): the owner's tasks (of tools it may use), oldest first, PAGE_SIZE
    at a time; the cursor is opaque (the position after the last task shown, so tasks
    expiring between pages do not shift the next one)."""
    tasks = sorted((t for t in await engine.owned(owner, NAME) if not lacking(t.tool)),
                   key=_position)
    cursor = params.get("cursor")
    if cursor is not None:
        after = _read_cursor(cursor)
        tasks = [t for t in tasks if _position(t) > after]
    page = tasks[:PAGE_SIZE]
    out: dict[str, Any] = {"tasks": [fields(t) for t in page]}
    if len(tasks) > PAGE_SIZE:
        out["nextCursor"] = base64.urlsafe_b64encode(
            orjson.dumps(list(_position(page[-1])))).decode()
    return out


def _position(task: Task) -> tuple[float, str]:
    return task.created_at, task.id


def _read_cursor(cursor: Any) -> tuple[float, str]:
    try:
        created_at, task_id = orjson.loads(base64.urlsafe_b64decode(str(cursor).encode()))
        if isinstance(created_at, int | float) and isinstance(task_id, str):
            return float(created_at), task_id
    except (binascii.Error, ValueError, TypeError):
        pass
    raise errors.InvalidParams("Invalid params: invalid or nonexistent cursor",
                               {"cursor": cursor})


def final(task: Task, id_: Any) -> Message:
    """tasks/result of a terminal task: exactly what the call returned, result or JSON-RPC
    error; a result carries the related-task `_meta` (spec: Result Retrieval)."""
    related = {RELATED_TASK: {"taskId": task.id}}
    if task.status is Status.CANCELLED:
        return jsonrpc.error(id_, jsonrpc.REQUEST_CANCELLED, "Task was cancelled",
                             {"taskId": task.id})
    if task.result is None:
        error = task.error or {"code": jsonrpc.INTERNAL_ERROR,
                               "message": task.status_message or "the task failed"}
        return {"jsonrpc": "2.0", "id": id_, "error": error}
    result = orjson.loads(task.result)  # kept serialized (model)
    meta = result.get("_meta")
    result["_meta"] = {**(meta if isinstance(meta, dict) else {}), **related}
    return jsonrpc.result(id_, result)


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
HANDLERS = {"tasks/get": get, "tasks/list": list_page, "tasks/cancel": cancel}
