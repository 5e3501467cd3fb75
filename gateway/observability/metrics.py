"""Prometheus metrics: the series docs/operations.md names, kept by one `Metrics` per app
(its own registry: two apps in one process, as in tests, never share counts).

Events are counted where they happen (`request`, `tool_called`, `task_created`,
`task_finished`); what is
a state rather than an event (live tasks, store bytes, upstream up, sessions, restarts,
rejections) is read at scrape time from the parts that own it (`Live`), so nothing here can
drift from what the gateway really holds.

Label values stay bounded whatever clients send: methods outside the protocol's own become
"other", and tool names outside the upstream's tools/list catalogue become "other", as do
those past MAX_TOOLS an upstream (a server may list many).

Per tool (issue 44): every tools/call, inline or a task, counts once in
mcp_gateway_tool_calls_total{outcome} and mcp_gateway_tool_call_duration_seconds: an
inline one when it is answered (`tool_called`), one answered with a task when the task
ends, by its end (`task_finished`). The endpoint learns that a call became a task from
`task_created`, in the same request's context (`calling`): a ContextVar, so that no era's
code has to say so.

Events are plain counts here (no lock, nothing rendered on the request path);
gateway/observability/exposition.py writes them in Prometheus' text format, with the state
read from `Live`, at each scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextvars import ContextVar, Token
from dataclasses import dataclass

from gateway.observability.series import Counted, Live, Timed
from gateway.protocol import mcp

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OTHER = "other"
# exposition.render: the families, the gauges' state, the queue lanes -> the text
Render = Callable[[tuple[Counted | Timed, ...], Live | None, Callable[[str, str], str]], bytes]
MAX_TOOLS = 200  # tool label values an upstream's series may hold; more are "other"
# The tools/call being answered in this context: [whether it became a task] (`calling`).
_CALL: ContextVar[list[bool] | None] = ContextVar("tool_call", default=None)
OUTCOMES = {"completed": "ok", "failed": "error", "cancelled": "cancelled"}  # a task's end
# Seconds: fast pass-through calls to tasks that run for minutes.
REQUEST_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60)
TASK_BUCKETS = (.1, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
QUEUE_BUCKETS = (.01, .05, .1, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)

@dataclass(frozen=True, slots=True)
class Calling:
    """A tools/call being answered: its tool, whether it became a task, its context."""

    tool: str
    tasked: list[bool]
    token: Token[list[bool] | None]


class Metrics:
    def __init__(self, known_tool: Callable[[str, str], bool] = lambda _u, _t: False,
                 named: Collection[str] = ()) -> None:
        self.known_tool = known_tool  # (upstream, tool): listed by that upstream
        self.named = frozenset(named)  # tool names and patterns the settings name
        self.live: Live | None = None
        self._render: Render | None = None  # loaded by `prepare`
        self.requests = Counted(
            "mcp_gateway_requests", "MCP requests served, by upstream, method, era, outcome",
            ("upstream", "method", "era", "outcome"))
        self.request_duration = Timed(
            "mcp_gateway_request_duration_seconds", "Time to answer an MCP request",
            ("upstream", "method"), REQUEST_BUCKETS)
        self.tasks_created = Counted(
            "mcp_gateway_tasks_created", "Tasks created by this replica",
            ("upstream", "tool", "dialect"))
        self.tasks_finished = Counted(
            "mcp_gateway_tasks_finished", "Tasks this replica ran to an end, by status",
            ("upstream", "tool", "status"))
        self.task_duration = Timed(
            "mcp_gateway_task_duration_seconds", "How long tasks ran, creation to end",
            ("upstream", "tool"), TASK_BUCKETS)
        self.tool_calls = Counted(
            "mcp_gateway_tool_calls", "tools/call answered, inline or by their task's end, "
            "by upstream, tool, outcome (ok, error, cancelled)", ("upstream", "tool", "outcome"))
        self.tool_duration = Timed(
            "mcp_gateway_tool_call_duration_seconds", "Time to a tools/call's answer, inline "
            "or its task's end", ("upstream", "tool"), REQUEST_BUCKETS + TASK_BUCKETS[7:])
        self._tools: dict[str, set[str]] = {}  # upstream -> tool label values in use
        # Labelled by the limit's name: a tool pattern from the settings, or "*" for a
        # server's own limit (bounded whatever clients send).
        self.queue_wait = Timed(
            "mcp_gateway_queue_wait_seconds", "How long calls waited for a concurrency slot",
            ("upstream", "tool"), QUEUE_BUCKETS)
        # Labelled by the operator's endpoints (host and path: bounded by the settings).
        self.webhook_deliveries = Counted(
            "mcp_gateway_webhook_deliveries", "Webhook delivery attempts, by endpoint and "
            "outcome (delivered, failed, gone, abandoned, dropped)", ("endpoint", "outcome"))
        self.webhook_latency = Timed(
            "mcp_gateway_webhook_delivery_seconds", "From a task's status written to its "
            "webhook delivered", ("endpoint",), QUEUE_BUCKETS)

    @property
    def families(self) -> tuple[Counted | Timed, ...]:
        return (self.requests, self.request_duration, self.tasks_created,
                self.tasks_finished, self.task_duration, self.queue_wait, self.tool_calls,
                self.tool_duration, self.webhook_deliveries, self.webhook_latency)

    def watch(self, live: Live) -> None:
        self.live = live

    def prepare(self) -> None:
        """Load what a scrape needs (the text format's writer) now: the operator pages call
        it at start. The request path never needs it; loaded at the first scrape instead, a
        module failed once the package on disk had changed beside a running gateway (issue
        51: /metrics answered 500)."""
        from gateway.observability import exposition

        self._render = exposition.render

    def exposition(self) -> bytes:
        if self._render is None:
            self.prepare()
        assert self._render is not None
        return self._render(self.families, self.live, self.lane)

    # -- events ---------------------------------------------------------------------------
    def request(self, upstream: str, method: str, era: str, ok: bool, seconds: float) -> None:
        method = method if method in mcp.METHODS else OTHER
        self.requests.inc((upstream, method, era, "ok" if ok else "error"))
        self.request_duration.observe((upstream, method), seconds)

    @staticmethod
    def calling(tool: object) -> Calling:
        """A tools/call of `tool` (the name as the client sent it) is answered in this
        context from now until `called`."""
        marker = [False]
        return Calling(tool if isinstance(tool, str) else OTHER, marker, _CALL.set(marker))

    @staticmethod
    def uncalled(call: Calling) -> None:
        """The tools/call `calling` began ends with no answer (the handler raised): its
        context's marker goes, uncounted."""
        _CALL.reset(call.token)

    def called(self, upstream: str, call: Calling, ok: bool, seconds: float) -> None:
        """The tools/call `calling` began is answered: counted unless a task took it."""
        _CALL.reset(call.token)
        if not call.tasked[0]:
            self.tool_called(upstream, call.tool, "ok" if ok else "error", seconds)

    def tool_called(self, upstream: str, tool: str, outcome: str, seconds: float) -> None:
        self._tool_called(upstream, self.tool_label(upstream, tool), outcome, seconds)

    def _tool_called(self, upstream: str, tool: str, outcome: str, seconds: float) -> None:
        """`tool_called`, its label found already."""
        self.tool_calls.inc((upstream, tool, outcome))
        self.tool_duration.observe((upstream, tool), seconds)

    def task_created(self, upstream: str, tool: str, dialect: str) -> None:
        if (marker := _CALL.get()) is not None:
            marker[0] = True  # the call's answer is its task's end (`task_finished`)
        self.tasks_created.inc((upstream, self.tool_label(upstream, tool), dialect))

    def task_finished(self, upstream: str, tool: str, status: str, seconds: float) -> None:
        tool = self.tool_label(upstream, tool)
        self.tasks_finished.inc((upstream, tool, status))
        self.task_duration.observe((upstream, tool), seconds)
        self._tool_called(upstream, tool, OUTCOMES.get(status, "error"), seconds)

    def webhook_delivered(self, endpoint: str, outcome: str, seconds: float | None = None
                          ) -> None:
        """A webhook attempt's `outcome`; `seconds` from the status to its delivery."""
        self.webhook_deliveries.inc((endpoint, outcome))
        if seconds is not None:
            self.webhook_latency.observe((endpoint,), seconds)

    def queue_waited(self, upstream: str, label: str, seconds: float) -> None:
        self.queue_wait.observe((upstream, self.lane(upstream, label)), seconds)

    def lane(self, upstream: str, label: str) -> str:
        """A concurrency limit's label: "*" (the server's), a pattern from the settings, or
        a tool's name (limits of the defaults), which clients choose: "other" unless listed."""
        if label == "*" or label in self.named or self.known_tool(upstream, label):
            return label
        return OTHER

    def tool_label(self, upstream: str, tool: str) -> str:
        """`tool` as a label value: a tool its upstream listed, within MAX_TOOLS of them."""
        if tool == OTHER or not self.known_tool(upstream, tool):
            return OTHER
        seen = self._tools.setdefault(upstream, set())
        if tool not in seen:
            if len(seen) >= MAX_TOOLS:
                return OTHER
            seen.add(tool)
        return tool
