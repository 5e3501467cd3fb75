"""A client's request names only its own principal's tasks (issue 41, item 6; docs/security.md,
Isolation between principals).

A request may carry the related-task `_meta` (`io.modelcontextprotocol/related-task`,
spec tasks 2025-11-25: the task it is about). The upstream sees one client, the gateway,
so a reference it takes at its word lets one principal speak for another's task: a server
that labels what it asks with its request's task (the TypeScript SDK does) sent Alice an
elicitation with Bob's text, and her answer became Bob's result. So before anything of a
client's goes upstream, a reference stays only when it names a task its sender created:
one of the gateway's own (the engine finds it for that owner) or one the upstream runs
itself (task_owners.py says who created it).

Any other reference is stripped, not refused: the request goes on as if it named no task,
which is what a reference to an unknown id would be worth, so Bob learns nothing of
whether Alice's id exists (a refusal "unknown task" would be as blind, but would fail a
client that echoes a reference to its own task that has since expired). Stripping is
logged for the audit trail, as a failed task look-up is.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.errors import GatewayError
from gateway.observability import log
from gateway.protocol import mcp
from gateway.protocol.jsonrpc import Message
from gateway.tasks.engine import TaskEngine

__all__ = ["names_a_task", "own_references", "reference", "without_reference"]

NO_TASK = object()  # what `reference` returns for a message that names none


def reference(msg: Message) -> object:
    """What the related-task `_meta` of `msg` holds as its task id (any JSON value: a
    malformed one is a reference too), or NO_TASK when it carries none."""
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or mcp.RELATED_TASK not in meta:
        return NO_TASK
    related = meta[mcp.RELATED_TASK]
    return related.get("taskId") if isinstance(related, dict) else None


def names_a_task(msg: Message) -> bool:
    """Whether `msg` carries a related-task reference: only then is `own_references` asked
    (most requests carry none, and are spared a coroutine and a lookup of the sender's
    tasks)."""
    return reference(msg) is not NO_TASK


def without_reference(msg: Message) -> Message:
    """`msg` without its related-task `_meta` (a new message; an emptied `_meta` goes too)."""
    params = msg["params"]
    meta = {k: v for k, v in params["_meta"].items() if k != mcp.RELATED_TASK}
    params = {**params, "_meta": meta} if meta else \
        {k: v for k, v in params.items() if k != "_meta"}
    return {**msg, "params": params}


async def own_references(msg: Message, owner: str, upstreams: Callable[[str], bool],
                         engine: TaskEngine, upstream: str) -> Message:
    """`msg`, or without its related-task reference unless that names a task of its
    sender's: one the engine holds for `owner` (the task owner: principal, or legacy
    session without auth), or one `upstreams` says the sender created on the upstream."""
    task_id = reference(msg)
    if task_id is NO_TASK:
        return msg
    if isinstance(task_id, str) and (upstreams(task_id) or await _engines(engine, task_id,
                                                                         owner)):
        return msg
    log.info("request.reference_stripped", audit=True, upstream=upstream,
             method=msg.get("method"), task=str(task_id)[:64])
    return without_reference(msg)


async def _engines(engine: TaskEngine, task_id: str, owner: str) -> bool:
    try:
        return await engine.holds(task_id, owner)
    except GatewayError:  # the store cannot say
        return False
