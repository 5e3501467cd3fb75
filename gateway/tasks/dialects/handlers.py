"""tasks/* served from the engine, in each dialect's shapes (core.py, extension.py): look
the task up for its owner (a foreign id answers exactly like an unknown one), check the
scopes of its tool, and answer, update, cancel or list."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from gateway import errors
from gateway.tasks.dialects import Lacking, check_scopes, core, extension, task_id_of, unscoped
from gateway.tasks.engine import TaskEngine, TaskNotFound
from gateway.tasks.model import Dialect, Task

# -- core tasks (2025-11-25) -------------------------------------------------------------
CORE_WORDING = "Failed to retrieve task: "  # before "Task not found" (core tasks' words)


async def core_named(engine: TaskEngine, params: dict[str, Any], owner: str,
                     lacking: Lacking = unscoped) -> Task:
    """The owner's core task that a tasks/* request names (see `core_lookup`); an id that
    is not a string is refused as an unknown one is."""
    return await core_lookup(engine, _named(params, CORE_WORDING), owner, lacking)


async def core_lookup(engine: TaskEngine, task_id: str, owner: str,
                      lacking: Lacking = unscoped) -> Task:
    """The owner's core task; -32602 for unknown, expired, foreign or other-dialect ids,
    InsufficientScope (403) when the caller may not use its tool."""
    return await _lookup(engine, task_id, owner, core.NAME, lacking, CORE_WORDING)


async def core_get(engine: TaskEngine, params: dict[str, Any], owner: str,
                   lacking: Lacking = unscoped) -> dict[str, Any] | orjson.Fragment:
    task = await core_named(engine, params, owner, lacking)
    return keep(engine, "tasks/get", task, core.fields(task)) if task.terminal \
        else core.fields(task)


async def core_cancel(engine: TaskEngine, params: dict[str, Any], owner: str,
                      lacking: Lacking = unscoped) -> dict[str, Any]:
    """spec (Task Cancellation): -32602 for a terminal task; otherwise the task is cancelled
    before the answer, which shows it."""
    task = await core_named(engine, params, owner, lacking)
    if task.terminal:
        raise errors.InvalidParams(
            f"Cannot cancel task: already in terminal status '{task.status}'",
            {"taskId": task.id})
    return core.fields(await engine.cancel(task))


async def core_list(engine: TaskEngine, params: dict[str, Any], owner: str,
                    lacking: Lacking = unscoped) -> dict[str, Any]:
    """spec (Task Listing): the owner's tasks (of tools it may use), oldest first, PAGE_SIZE at
    a time; the cursor is opaque (the position after the last task shown, so tasks
    expiring between pages do not shift the next one)."""
    tasks = sorted((t for t in await engine.owned(owner, core.NAME) if not lacking(t.tool)),
                   key=_position)
    cursor = params.get("cursor")
    if cursor is not None:
        after = _read_cursor(cursor)
        tasks = [t for t in tasks if _position(t) > after]
    page = tasks[:core.PAGE_SIZE]
    out: dict[str, Any] = {"tasks": [core.fields(t) for t in page]}
    if len(tasks) > core.PAGE_SIZE:
        out["nextCursor"] = base64.urlsafe_b64encode(
            orjson.dumps(list(_position(page[-1])))).decode()
    return out


def _position(task: Task) -> tuple[float, str]:
    return task.created_at, task.id


def _read_cursor(cursor: object) -> tuple[float, str]:
    try:
        created_at, task_id = orjson.loads(base64.urlsafe_b64decode(str(cursor).encode()))
        if isinstance(created_at, int | float) and isinstance(task_id, str):
            return float(created_at), task_id
    except (binascii.Error, ValueError, TypeError):
        pass
    raise errors.InvalidParams("Invalid params: invalid or nonexistent cursor",
                               {"cursor": cursor})


CORE = {"tasks/get": core_get, "tasks/list": core_list, "tasks/cancel": core_cancel}


# -- the tasks extension (2026-07-28) ------------------------------------------------------
async def extension_request(engine: TaskEngine, method: str, params: dict[str, Any],
                            owner: str, lacking: Lacking = unscoped
                            ) -> dict[str, Any] | orjson.Fragment:
    """tasks/get, tasks/update, tasks/cancel for `owner`; the result to send."""
    task = await _lookup(engine, _named(params), owner, extension.NAME, lacking)
    if method == "tasks/get":
        detailed = {**extension.detailed(task), "resultType": "complete"}
        if not task.terminal:
            return detailed
        await engine.delivered(task.id)  # its result (or error) inlined: its owner has it now
        return keep(engine, method, task, detailed)
    if method == "tasks/update":
        responses = params.get("inputResponses")
        if not isinstance(responses, dict):
            raise errors.InvalidParams("Invalid params: inputResponses must be an object")
        await engine.answer(task, responses)
    else:  # tasks/cancel: an ack, idempotent on terminal tasks (spec: eventual)
        await engine.cancel(task)
    return {"resultType": "complete"}


# -- both ---------------------------------------------------------------------------------
def kept(engine: TaskEngine, dialect: Dialect, method: str, params: dict[str, Any],
         owner: str, lacking: Lacking = unscoped) -> orjson.Fragment | None:
    """The owner's finished task's answer to `method` as its first read rendered it
    (tasks/kept.py), or None: the ordinary path answers (a task not finished, not read yet,
    another's, unknown, or of a tool whose scopes the caller lacks: refused there)."""
    task_id = task_id_of(params)
    found = None if task_id is None else engine.kept.get(dialect, method, task_id, owner)
    if found is None or lacking(found.tool):
        return None
    return orjson.Fragment(found.answer)


def keep(engine: TaskEngine, method: str, task: Task, result: dict[str, Any]
         ) -> orjson.Fragment:
    """`result`, the finished `task`'s answer to `method`, serialized once and kept for
    its owner's next reads."""
    answer = orjson.dumps(result)
    engine.kept.keep(method, task, answer)
    return orjson.Fragment(answer)


def _named(params: dict[str, Any], wording: str = "") -> str:
    """The id a tasks/* request names, where it enters (`task_id_of`): a value that is no
    string names no task, and gets what an unknown id gets (the value sent echoed back)."""
    if (task_id := task_id_of(params)) is None:
        raise _not_found(params.get("taskId"), wording)
    return task_id


def _not_found(task_id: object, wording: str) -> errors.InvalidParams:
    return errors.InvalidParams(f"{wording}Task not found", {"taskId": task_id})


async def _lookup(engine: TaskEngine, task_id: str, owner: str, dialect: Dialect,
                  lacking: Lacking, wording: str = "") -> Task:
    """The owner's task of `dialect` (a task renders only in the dialect it was created
    in); -32602 for unknown, forgotten, foreign or other-dialect ids, each dialect in its own
    `wording`; InsufficientScope (403) when the caller may not use its tool."""
    try:
        task: Task | None = await engine.find(task_id, owner)
    except TaskNotFound:
        task = None
    if task is None or task.dialect != dialect:
        raise _not_found(task_id, wording)
    return check_scopes(task, lacking)
