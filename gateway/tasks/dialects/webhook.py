"""The webhook dialect (gateway/push): what a webhook is sent of a task, the thin event of
one task status in Standard Webhooks' shape (`type`, `timestamp`, `data`), and its id, the
same for every attempt at one task's status (the receiver's dedupe key).

Never the result, the arguments, a token, or what the server said (a failure's message is
the gateway's own words: tasks/report.py `shown`): push is a hint, tasks/get is the truth,
and a receiver may not be the task's owner (an operator's endpoint hears every principal's
tasks). The owner is the pseudonymous digest audit events carry.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import orjson

from gateway.observability import owner_hash
from gateway.tasks.model import Task, iso


def webhook_id(task_id: str, status: str) -> str:
    """Stable per task and status: a retry, from any replica, carries the same one."""
    digest = hashlib.sha256(f"{task_id}\0{status}".encode()).digest()[:16]
    return "msg_" + base64.b32encode(digest).decode().rstrip("=").lower()


def event(task: Task, message: str | None, now: float) -> bytes:
    """The JSON body for `task` as it is now; `message`: its status message as it may be
    shown (None: none)."""
    data: dict[str, Any] = {
        "taskId": task.id, "status": str(task.status), "upstream": task.upstream,
        "tool": task.tool, "createdAt": iso(task.created_at),
        "lastUpdatedAt": iso(task.updated_at or task.created_at), "ttl": task.ttl_ms,
        "pollInterval": task.poll_interval_ms, "owner": owner_hash(task.owner)}
    if message:
        data["statusMessage"] = message
    return orjson.dumps({"type": f"task.{task.status}", "timestamp": iso(now), "data": data})
