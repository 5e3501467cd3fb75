"""Following an upstream's own tasks (protocol 2025-11-25 core tasks, which a server may run
for tools it declares with `execution.taskSupport`).

A tool the upstream runs only as a task (taskSupport "required") refuses plain calls, so a
caller that cannot take a task (a modern client: the gateway makes its own tasks) gets one
slow call: the call asks the upstream for its task, and once the CreateTaskResult comes, the
same call continues as that task's blocking `tasks/result`; cancelling it cancels the task.
spec: tasks-2025-11-25.md (Creating Tasks, Result Retrieval, Task Cancellation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from gateway.protocol.jsonrpc import Message
from gateway.upstream.task_owners import created_task

if TYPE_CHECKING:  # the router reads this module's names: it stays free of the correlator
    from gateway.upstream.correlator import Call

RESULT = "tasks/result"
CANCEL = "tasks/cancel"


def serves_tasks(init_result: dict[str, Any] | None) -> bool:
    """Whether a 2025-11-25 upstream runs task-augmented tools/call itself."""
    caps = (init_result or {}).get("capabilities")
    tasks = caps.get("tasks") if isinstance(caps, dict) else None
    requests = tasks.get("requests") if isinstance(tasks, dict) else None
    tools = requests.get("tools") if isinstance(requests, dict) else None
    return isinstance(tools, dict) and "call" in tools


def own_support(tool: dict[str, Any]) -> Any:
    """A listed tool's own `execution.taskSupport`, as the upstream declared it."""
    execution = tool.get("execution")
    return execution.get("taskSupport") if isinstance(execution, dict) else None


def ask_for_task(params: dict[str, Any]) -> None:
    """Make a tools/call's params task-augmented (spec: Creating Tasks)."""
    params["task"] = {}


def result_request(task_id: str) -> tuple[str, dict[str, Any]]:
    """tasks/result for a task: blocks until it ends, then returns what the call returned."""
    return RESULT, {"taskId": task_id}


def cancel_request(task_id: str) -> tuple[str, dict[str, Any]]:
    return CANCEL, {"taskId": task_id}


class Sender(Protocol):
    def resend(self, call: Call, method: str, params: dict[str, Any]) -> None: ...

    def send_own(self, method: str, params: dict[str, Any]) -> None: ...


def follow(conn: Sender, call: Call, msg: Message) -> bool:
    """True when `msg` is the CreateTaskResult of a call that asked for the upstream's own
    task: the caller sees one slow call, which goes on as that task's tasks/result."""
    if not call.follow_task or call.upstream_task is not None:
        return False
    created = created_task(msg.get("result"))
    if created is None:
        return False
    task_id = created[0]
    call.follows(task_id)
    conn.resend(call, *result_request(task_id))
    return True


def cancel(conn: Sender, call: Call) -> None:
    """A followed call that is cancelled cancels the upstream's task too."""
    if call.upstream_task is not None:
        conn.send_own(*cancel_request(call.upstream_task))
