"""What the outside learns of tasks: audit events, metrics, and the recent failures the status
page lists. The engine and the replicas call it at each step of a task's life; nothing here
changes a task.

Audit events are structlog events with stable names (`task.created`, `task.input_required`,
`task.input_answered`, `task.completed` / `failed` / `cancelled`, `task.expired`,
`task.lookup_failed`) and `audit=true`; owners appear as a short hash, never as the token
or session id they stand for. Look-ups of unknown or foreign task ids are counted per
owner, the count kept while misses come less than 10 minutes apart, so a caller guessing
ids shows up as one owner with a growing count.

The recent failures hold the gateway's own words only (`shown`): what a server answered may
quote the call's arguments, or a secret the tool was handed, and operators read /status.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from cachetools import TTLCache

from gateway import redact
from gateway.observability import log, owner_hash, tracing
from gateway.observability.counters import Counters
from gateway.observability.metrics import Metrics
from gateway.tasks.model import Status, Task

MISS_WINDOW_S = 600.0
MISS_OWNERS = 10_000  # owners whose misses are counted at once (the least recent go first)
RECENT_FAILURES = 20


def shown(task: Task, answered: bool) -> str:
    """What /status (its "Recent failures" row) and webhooks show of a failed task. The
    gateway's own words whole: a timeout, an expiry, a replica gone, a result too big, an
    upstream whose transport failed the call (`answered` False: the call itself says so,
    upstream/correlator.py `Call.failure`). Of what the server answered, never its words:
    a server's error message, or the text of a tool's isError result, may quote an argument
    value or a secret the tool was handed (issue 42), and a server may shape its error as
    the gateway's (a review with one token: judging by shape let its text through); so
    only its JSON-RPC code, or that the tool said isError. The client reads the server's
    own words, in its task."""
    error = task.error
    if not answered:
        return redact.text(task.status_message or "failed")
    if error is None:  # core dialect: a tool result with isError fails the task
        return "the tool's result has isError: true"
    return f"the server answered JSON-RPC error {error.get('code')}"


def _error_type(task: Task) -> str:
    """A failed task's semconv error.type: its error's (tracing.error_type), or
    `tool_error` for a core-dialect task whose result had isError."""
    if task.error is None:
        return tracing.TOOL_ERROR
    return tracing.error_type({"error": task.error}) or tracing.OTHER_ERROR


def audit(event: str, task: Task, **extra: Any) -> None:
    log.info(event, audit=True, task=task.id, tool=task.tool, upstream=task.upstream,
             owner=owner_hash(task.owner), **extra)


class Report:
    def __init__(self, metrics: Metrics | None = None,
                 counters: Counters | None = None) -> None:
        self.metrics = metrics if metrics is not None else Metrics()
        self.counters = counters if counters is not None else Counters()
        self.misses: TTLCache[str, int] = TTLCache(MISS_OWNERS, MISS_WINDOW_S)
        # (unix time, upstream, tool, `shown`) of the last failed tasks run here.
        self.failures: deque[tuple[float, str, str, str]] = deque(maxlen=RECENT_FAILURES)
        self.spans: dict[str, Any] = {}  # task id -> its trace span, while it runs here
        # Told each status written here that may be pushed (gateway/push: webhooks), with
        # the status message as it may be shown; None: no webhooks.
        self.push: Callable[[Task, str | None], None] | None = None

    def created(self, task: Task) -> None:
        self.counters.tasks_created += 1
        self.metrics.task_created(task.upstream, task.tool, task.dialect)
        if (traced := tracing.active()) is not None:
            self.spans[task.id] = traced.task(task.id, task.tool, task.upstream, task.dialect,
                                              task.owner)
        audit("task.created", task, dialect=task.dialect)

    def answered(self, task: Task, key: str) -> None:
        audit("task.input_answered", task, key=key)

    def input_required(self, task: Task) -> None:
        audit("task.input_required", task)
        if self.push is not None:  # it never raises (gateway/push/pusher.py `told`)
            self.push(task, task.status_message)

    def ended(self, task: Task, seconds: float | None, *, answered: bool = False,
              **extra: Any) -> None:
        """`task` ended; `seconds` it ran here, None when it ran on another replica (which
        counts it in its own metrics); `answered`: its end is the server's answer."""
        self.counters.tasks_ended[task.status] += 1
        if seconds is not None:
            self.metrics.task_finished(task.upstream, task.tool, task.status, seconds)
            extra["duration_s"] = round(seconds, 3)
        if task.status is Status.FAILED:
            self.failures.append((time.time(), task.upstream, task.tool,
                                  shown(task, answered)))
        if (span := self.spans.pop(task.id, None)) is not None:
            failed = task.status is Status.FAILED
            tracing.end(span, _error_type(task) if failed else None,
                        shown(task, answered) if failed else None,
                        **{"mcp.task.status": str(task.status)})
        audit(f"task.{task.status}", task, **extra)
        if self.push is not None:  # a failure in the gateway's own words only, as above
            self.push(task, shown(task, answered) if task.status is Status.FAILED
                      else task.status_message)

    def missed(self, owner: str, task_id: str) -> None:
        """A look-up of a task id that `owner` does not have."""
        who = owner_hash(owner)
        self.misses[who] = count = self.misses.get(who, 0) + 1
        log.info("task.lookup_failed", audit=True, owner=who, task=task_id[:64],
                 failures=count)
