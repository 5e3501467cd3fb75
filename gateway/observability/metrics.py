"""Prometheus metrics: the series README's Operations names, kept by one `Metrics` per app
(its own registry: two apps in one process, as in tests, never share counts).

Events are counted where they happen (`request`, `task_created`, `task_finished`); what is
a state rather than an event (live tasks, store bytes, upstream up, sessions, restarts,
rejections) is read at scrape time from the parts that own it (`Live`), so nothing here can
drift from what the gateway really holds.

Label values stay bounded whatever clients send: methods outside the protocol's own become
"other", and tool names outside the upstream's tools/list catalogue become "other".
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.errors import AuthCause, Rejection
from gateway.protocol import mcp

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OTHER = "other"
# Seconds: fast pass-through calls to tasks that run for minutes.
REQUEST_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60)
TASK_BUCKETS = (.1, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
QUEUE_BUCKETS = (.01, .05, .1, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class Live(Protocol):
    """The state the gauges show, read at each scrape."""

    def tasks_live(self) -> dict[str, int]: ...  # status -> tasks this replica runs
    def store_bytes(self) -> int: ...
    def store_outbox(self) -> int: ...  # task changes the shared store has not taken yet
    def upstreams(self) -> dict[str, tuple[bool, int]]: ...  # name -> (up, restarts)
    def sessions(self) -> int: ...
    def rejections(self) -> dict[tuple[Rejection, AuthCause | None], int]: ...  # -> count
    def queues(self) -> dict[tuple[str, str], int]: ...  # (upstream, tool) -> calls waiting


class Metrics:
    def __init__(self, known_tool: Callable[[str, str], bool] = lambda _u, _t: False,
                 named: Collection[str] = ()) -> None:
        self.registry = CollectorRegistry()
        self.known_tool = known_tool  # (upstream, tool): listed by that upstream
        self.named = frozenset(named)  # tool names and patterns the settings name
        # (upstream, method, era, ok) -> its counter and histogram: bounded, as the labels are
        self._series: dict[tuple[str, str, str, bool], tuple[Counter, Histogram]] = {}
        r = self.registry
        self.requests = Counter(
            "mcp_gateway_requests", "MCP requests served, by upstream, method, era, outcome",
            ["upstream", "method", "era", "outcome"], registry=r)
        self.request_duration = Histogram(
            "mcp_gateway_request_duration_seconds", "Time to answer an MCP request",
            ["upstream", "method"], buckets=REQUEST_BUCKETS, registry=r)
        self.tasks_created = Counter(
            "mcp_gateway_tasks_created", "Tasks created by this replica",
            ["upstream", "tool", "dialect"], registry=r)
        self.tasks_finished = Counter(
            "mcp_gateway_tasks_finished", "Tasks this replica ran to an end, by status",
            ["upstream", "tool", "status"], registry=r)
        self.task_duration = Histogram(
            "mcp_gateway_task_duration_seconds", "How long tasks ran, creation to end",
            ["upstream", "tool"], buckets=TASK_BUCKETS, registry=r)

        # Labelled by the limit's name: a tool pattern from the settings, or "*" for a
        # server's own limit (bounded whatever clients send).
        self.queue_wait = Histogram(
            "mcp_gateway_queue_wait_seconds", "How long calls waited for a concurrency slot",
            ["upstream", "tool"], buckets=QUEUE_BUCKETS, registry=r)

    def watch(self, live: Live) -> None:
        self.registry.register(_LiveCollector(live, self.lane))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # -- events ---------------------------------------------------------------------------
    def request(self, upstream: str, method: str, era: str, ok: bool, seconds: float) -> None:
        key = (upstream, method if method in mcp.METHODS else OTHER, era, ok)
        series = self._series.get(key)
        if series is None:  # labels() costs ~2 µs a call: each pair is looked up once
            series = self._series[key] = (
                self.requests.labels(*key[:3], "ok" if ok else "error"),
                self.request_duration.labels(*key[:2]))
        series[0].inc()
        series[1].observe(seconds)

    def task_created(self, upstream: str, tool: str, dialect: str) -> None:
        self.tasks_created.labels(upstream, self._tool(upstream, tool), dialect).inc()

    def task_finished(self, upstream: str, tool: str, status: str, seconds: float) -> None:
        tool = self._tool(upstream, tool)
        self.tasks_finished.labels(upstream, tool, status).inc()
        self.task_duration.labels(upstream, tool).observe(seconds)

    def queue_waited(self, upstream: str, label: str, seconds: float) -> None:
        self.queue_wait.labels(upstream, self.lane(upstream, label)).observe(seconds)

    def lane(self, upstream: str, label: str) -> str:
        """A concurrency limit's label: "*" (the server's), a pattern from the settings, or
        a tool's name (limits of the defaults), which clients choose: "other" unless listed."""
        if label == "*" or label in self.named or self.known_tool(upstream, label):
            return label
        return OTHER

    def _tool(self, upstream: str, tool: str) -> str:
        return tool if self.known_tool(upstream, tool) else OTHER


class _LiveCollector(Collector):
    def __init__(self, live: Live, lane: Callable[[str, str], str]) -> None:
        self.live = live
        self.lane = lane

    def collect(self) -> Iterator[Metric]:
        live = self.live
        yield _gauge("mcp_gateway_tasks_live", "Tasks this replica runs now, by status",
                     ["status"], ((s, n) for s, n in live.tasks_live().items()))
        yield _gauge("mcp_gateway_store_bytes", "Bytes of results the task store holds",
                     [], [((), live.store_bytes())])
        yield _gauge("mcp_gateway_store_outbox",
                     "Task changes kept until the shared store takes them", [],
                     [((), live.store_outbox())])
        ups = live.upstreams()
        yield _gauge("mcp_gateway_upstream_up", "1 when the upstream is initialized",
                     ["upstream"], ((n, int(up)) for n, (up, _) in ups.items()))
        restarts = CounterMetricFamily("mcp_gateway_upstream_restarts",
                                       "Times the upstream was started again",
                                       labels=["upstream"])
        for name, (_, count) in ups.items():
            restarts.add_metric([name], count)
        yield restarts
        yield _gauge("mcp_gateway_sessions", "Live legacy sessions", [],
                     [((), live.sessions())])
        rejections = CounterMetricFamily("mcp_gateway_rejections",
                                         "Requests refused, by reason (and cause, for auth)",
                                         labels=["reason", "cause"])
        for (reason, cause), count in live.rejections().items():
            rejections.add_metric([reason, cause or ""], count)
        yield rejections
        depth = GaugeMetricFamily("mcp_gateway_queue_depth",
                                  "Calls waiting for a concurrency slot",
                                  labels=["upstream", "tool"])
        depths: dict[tuple[str, str], int] = {}
        for (upstream, label), waiting in live.queues().items():
            key = (upstream, self.lane(upstream, label))
            depths[key] = depths.get(key, 0) + waiting
        for labels, waiting in depths.items():
            depth.add_metric(list(labels), waiting)
        yield depth


def _gauge(name: str, doc: str, labels: list[str],
           values: Iterable[tuple[str | tuple[()], int]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for label, value in values:
        family.add_metric([label] if isinstance(label, str) else [], value)
    return family
