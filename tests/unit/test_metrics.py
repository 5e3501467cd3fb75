"""The event counts behind /metrics: kept as plain numbers on the request path, written in
Prometheus' text format by the gateway itself when scraped. prometheus_client (a test
dependency only) is the oracle: its Histogram for the buckets, its `generate_latest` for
the whole text."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import accumulate

from conftest import loaded_by
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.errors import AuthCause, Rejection
from gateway.observability.metrics import REQUEST_BUCKETS, Metrics
from gateway.observability.series import Counted, Live, Timed

SECONDS = st.one_of(st.sampled_from(REQUEST_BUCKETS),  # on a bound: `le` includes it
                    st.floats(min_value=0, max_value=120, allow_nan=False))


def samples(text: bytes, prefix: str) -> list[str]:
    return [line for line in text.decode().splitlines()
            if line.startswith(prefix) and "_created" not in line]


@given(st.lists(SECONDS, max_size=30))
def test_request_durations_fall_in_the_buckets_prometheus_client_would_choose(
        durations: list[float]) -> None:
    ours = Metrics()
    oracle_registry = CollectorRegistry()
    oracle = Histogram("mcp_gateway_request_duration_seconds", "Time to answer an MCP request",
                       ["upstream", "method"], buckets=REQUEST_BUCKETS,
                       registry=oracle_registry)
    for seconds in durations:
        ours.request("main", "tools/call", "legacy", True, seconds)
        oracle.labels("main", "tools/call").observe(seconds)
    name = "mcp_gateway_request_duration_seconds"
    assert samples(ours.exposition(), name) == samples(generate_latest(oracle_registry), name)


def test_methods_and_outcomes_are_counted_apart_and_unknown_methods_as_other() -> None:
    metrics = Metrics()
    for method, ok in (("tools/call", True), ("tools/call", True), ("tools/call", False),
                       ("made/up", True)):
        metrics.request("main", method, "legacy", ok, 0.01)
    text = metrics.exposition().decode()
    assert ('mcp_gateway_requests_total{era="legacy",method="tools/call",outcome="ok",'
            'upstream="main"} 2.0') in text
    assert 'method="tools/call",outcome="error",upstream="main"} 1.0' in text
    assert 'method="other",outcome="ok",upstream="main"} 1.0' in text
    assert "made/up" not in text


def test_prometheus_client_is_never_loaded_by_a_gateway() -> None:
    """Neither counting nor a scrape loads prometheus_client (~1.1 MiB resident, issue 54);
    the operator pages load the text format's writer at start (`prepare`), not at the first
    scrape: a lazy import failed once the installed package had changed beside a running
    gateway (issue 51: /metrics answered 500)."""
    heavy = ("prometheus_client", "gateway.observability.exposition")
    counted = ("from gateway.observability.metrics import Metrics; m = Metrics(); "
               "m.request('main', 'tools/call', 'legacy', True, 0.1)")
    assert loaded_by(counted, heavy) == []
    assert loaded_by(counted + "; m.prepare(); m.exposition()", heavy) == [
        "gateway.observability.exposition"]
    started = ("from gateway.app import create_app; from gateway.settings.load import "
               "from_mapping; create_app(from_mapping({'upstreams': {'main': "
               "{'command': 'true'}}}))")
    assert loaded_by(started, heavy) == ["gateway.observability.exposition"]


class _Live:
    """Gauge state with label values that need escaping, and numbers Go writes apart."""

    def tasks_live(self) -> dict[str, int]:
        return {"working": 3, "input_required": 0}

    def store_bytes(self) -> int:
        return 12_345_678

    def store_outbox(self) -> int:
        return 0

    def webhooks_pending(self) -> int:
        return 2

    def upstreams(self) -> dict[str, tuple[bool, int]]:
        return {"main": (True, 0), 'we"ird\\name\n': (False, 1_000_000)}

    def sessions(self) -> int:
        return 7

    def rejections(self) -> dict[tuple[Rejection, AuthCause | None], int]:
        return {("auth", "expired"): 4, ("origin", None): 1}

    def queues(self) -> dict[tuple[str, str], int]:
        return {("main", "slow*"): 2, ("main", "other"): 1, ("main", "unlisted"): 3}


def _oracle(families: tuple[Counted | Timed, ...], live: Live) -> bytes:
    """The same families rendered by prometheus_client's own collectors."""
    registry = CollectorRegistry()
    registry.register(_OracleCollector(families, live))
    return generate_latest(registry)


class _OracleCollector(Collector):
    def __init__(self, families: tuple[Counted | Timed, ...], live: Live) -> None:
        self.families, self.live = families, live

    def collect(self) -> Iterator[Metric]:
        for f in self.families:
            if isinstance(f, Counted):
                counter = CounterMetricFamily(f.name, f.doc, labels=list(f.labels))
                for labels, count in f.values.items():
                    counter.add_metric(list(labels), count)
                yield counter
                continue
            histogram = HistogramMetricFamily(f.name, f.doc, labels=list(f.labels))
            bounds = [repr(float(b)) for b in f.bounds] + ["+Inf"]
            for labels, (counts, total) in f.values.items():
                histogram.add_metric(list(labels), list(zip(bounds, accumulate(counts),
                                                            strict=True)), total[0])
            yield histogram
        yield from _oracle_live(self.live)


def _oracle_live(live: Live) -> Iterator[Metric]:
    def gauge(name: str, doc: str, labels: list[str], values: list[tuple[list[str], float]]
              ) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=labels)
        for label_values, value in values:
            family.add_metric(label_values, value)
        return family
    yield gauge("mcp_gateway_tasks_live", "Tasks this replica runs now, by status", ["status"],
                [([s], n) for s, n in live.tasks_live().items()])
    yield gauge("mcp_gateway_store_bytes", "Bytes of results the task store holds", [],
                [([], live.store_bytes())])
    yield gauge("mcp_gateway_store_outbox", "Task changes kept until the shared store takes "
                "them", [], [([], live.store_outbox())])
    yield gauge("mcp_gateway_webhooks_pending", "Webhook deliveries not made yet (due, or "
                "waiting to be tried again)", [], [([], live.webhooks_pending())])
    ups = live.upstreams()
    yield gauge("mcp_gateway_upstream_up", "1 when the upstream is initialized", ["upstream"],
                [([n], int(up)) for n, (up, _) in ups.items()])
    restarts = CounterMetricFamily("mcp_gateway_upstream_restarts",
                                   "Times the upstream was started again", labels=["upstream"])
    for name, (_, count) in ups.items():
        restarts.add_metric([name], count)
    yield restarts
    yield gauge("mcp_gateway_sessions", "Live legacy sessions", [], [([], live.sessions())])
    rejections = CounterMetricFamily("mcp_gateway_rejections", "Requests refused, by reason "
                                     "(and cause, for auth)", labels=["reason", "cause"])
    for (reason, cause), count in live.rejections().items():
        rejections.add_metric([reason, cause or ""], count)
    yield rejections
    yield gauge("mcp_gateway_queue_depth", "Calls waiting for a concurrency slot",
                ["upstream", "tool"], [([u, t], n) for u, t, n in _lanes(live)])


def _lanes(live: Live) -> list[tuple[str, str, int]]:
    """Queue depths by lane, as `Metrics.lane` names them: a tool outside the catalogue and
    the settings is "other"."""
    depths: dict[tuple[str, str], int] = {}
    for (upstream, tool), n in live.queues().items():
        key = (upstream, "other" if tool == "unlisted" else tool)
        depths[key] = depths.get(key, 0) + n
    return [(u, t, n) for (u, t), n in depths.items()]


def test_the_text_is_the_one_prometheus_client_writes_for_the_same_families() -> None:
    metrics = Metrics(known_tool=lambda _u, tool: tool != "unlisted", named=["slow*"])
    metrics.requests.values[("main", "tools/call", "legacy", "ok")] = 999_999  # Go: 1.000005e+06
    for seconds in (0.0004, 0.001, 0.7, 3.5, 59.9, 4000.0):
        metrics.request("main", "tools/call", "legacy", True, seconds)
        metrics.request('we"ird\\', "ping", "modern", False, seconds)
        metrics.queue_wait.observe(("main", "slow*"), seconds)
    metrics.tool_calls.inc(("main", "echo\nline", "ok"))
    live = _Live()
    metrics.watch(live)
    ours = metrics.exposition()
    assert ours == _oracle(metrics.families, live)
    assert b"} 1.000005e+06\n" in ours
    assert b'upstream="we\\"ird\\\\"' in ours  # we"ird\, escaped
