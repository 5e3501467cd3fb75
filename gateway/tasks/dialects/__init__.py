"""Wire adapters of the task engine: each parses its dialect's requests into engine calls and
renders engine state into its wire shapes, and nothing else."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from gateway import errors
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.tasks.model import Status, Task, iso

# A tool's name -> the scopes it needs that the caller does not hold (auth.oauth and the
# tool's `scopes`): tasks/* of a task need the scopes of its tool.
Lacking = Callable[[str], frozenset[str]]


def unscoped(_tool: str) -> frozenset[str]:
    return frozenset()


def check_scopes(task: Task, lacking: Lacking) -> Task:
    if missing := lacking(task.tool):
        raise errors.InsufficientScope(f"a task of tool {errors.shown(task.tool)}", missing)
    return task


def task_id_of(params: dict[str, Any]) -> str | None:
    """The task a tasks/* request names (both dialects: `taskId`), narrowed where it enters
    as the MCP SDK's `as_request_id` narrows request ids: a string, as every task id is;
    None for anything else (absent, or another JSON value), which names no task."""
    task_id = params.get("taskId")
    return task_id if isinstance(task_id, str) else None


def watch_progress(params: dict[str, Any]) -> bool:
    """Ask the upstream for progress on a call that is, or may become, a task, so its
    statusMessage can tell how far it got. True when the gateway asked (the client did
    not, and its progress goes nowhere); False when the client asked itself."""
    meta = params.get("_meta")
    if isinstance(meta, dict) and "progressToken" in meta:
        return False
    params["_meta"] = {**(meta if isinstance(meta, dict) else {}), "progressToken": "task"}
    return True


def call_answer(task: Task, id_: RequestId, meta: dict[str, Any] | None = None) -> Message:
    """What the call a terminal task ran answered, as the call's own answer: its result
    (with `meta` merged into its `_meta`) or its JSON-RPC error; cancelled, the error that
    says so (both dialects: core tasks/result, a keyed call's caller: tasks/keys.py)."""
    if task.status is Status.CANCELLED:
        return jsonrpc.error(id_, jsonrpc.REQUEST_CANCELLED, "Task was cancelled",
                             {"taskId": task.id})
    if task.result is None:
        error = task.error or {"code": jsonrpc.INTERNAL_ERROR,
                               "message": task.status_message or "the task failed"}
        return {"jsonrpc": "2.0", "id": id_, "error": error}
    result = orjson.loads(task.result)  # kept serialized (model)
    if meta:
        held = result.get("_meta")
        result["_meta"] = {**(held if isinstance(held, dict) else {}), **meta}
    return jsonrpc.result(id_, result)


def task_fields(task: Task, ttl_key: str, poll_key: str) -> dict[str, Any]:
    """The Task object both dialects share; they differ only in the names of two fields."""
    created = iso(task.created_at)
    updated = created if task.updated_at == task.created_at else iso(task.updated_at)
    out: dict[str, Any] = {"taskId": task.id, "status": str(task.status),
                           "createdAt": created, "lastUpdatedAt": updated,
                           ttl_key: task.ttl_ms, poll_key: task.poll_interval_ms}
    if task.status_message:
        out["statusMessage"] = task.status_message
    return out
