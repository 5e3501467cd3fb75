"""Wire adapters of the task engine: each parses its dialect's requests into engine calls and
renders engine state into its wire shapes, and nothing else."""

from __future__ import annotations

from typing import Any

from gateway.tasks.model import Task, iso


def task_id_of(params: dict[str, Any]) -> Any:
    """The task a tasks/* request names (both dialects: `taskId`)."""
    return params.get("taskId")


def task_fields(task: Task, ttl_key: str, poll_key: str) -> dict[str, Any]:
    """The Task object both dialects share; they differ only in the names of two fields."""
    out: dict[str, Any] = {"taskId": task.id, "status": str(task.status),
                           "createdAt": iso(task.created_at),
                           "lastUpdatedAt": iso(task.updated_at), ttl_key: task.ttl_ms,
                           poll_key: task.poll_interval_ms}
    if task.status_message:
        out["statusMessage"] = task.status_message
    return out
