"""/metrics in Prometheus' text format: the event counts `Metrics` keeps, and the state read
from `Live` at each scrape, rendered by prometheus_client. Imported at the first scrape, so a
gateway nobody scrapes never loads prometheus_client (~1 MiB resident: bench/README.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.observability.series import Counted, Live, Timed

Families = tuple[Counted | Timed, ...]


def registry(families: Families, live: Live | None, lane: Callable[[str, str], str]
             ) -> CollectorRegistry:
    """A registry of its own per `Metrics` (two apps in one process never share counts)."""
    made = CollectorRegistry()
    made.register(_Events(families))
    if live is not None:
        made.register(_LiveCollector(live, lane))
    return made


def render(made: CollectorRegistry) -> bytes:
    return generate_latest(made)


class _Events(Collector):
    def __init__(self, families: Families) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            yield _counter(family) if isinstance(family, Counted) else _histogram(family)


def _counter(family: Counted) -> CounterMetricFamily:
    made = CounterMetricFamily(family.name, family.doc, labels=list(family.labels))
    for labels, count in family.values.items():
        made.add_metric(list(labels), count)
    return made


def _histogram(family: Timed) -> HistogramMetricFamily:
    made = HistogramMetricFamily(family.name, family.doc, labels=list(family.labels))
    # As prometheus_client's Histogram writes `le` (its floatToGoString, for bounds under
    # a million): 1 -> "1.0", .0025 -> "0.0025".
    bounds = [repr(float(b)) for b in family.bounds] + ["+Inf"]
    for labels, (counts, total) in family.values.items():
        made.add_metric(list(labels), list(zip(bounds, accumulate(counts), strict=True)),
                        total[0])
    return made


class _LiveCollector(Collector):
    """The state the gauges show, read from the parts that own it at each scrape."""

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
        yield _gauge("mcp_gateway_webhooks_pending", "Webhook deliveries not made yet "
                     "(due, or waiting to be tried again)", [], [((), live.webhooks_pending())])
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
