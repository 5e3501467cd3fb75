"""The event counts behind /metrics: kept as plain numbers on the request path, rendered by
prometheus_client only when scraped. prometheus_client's own Histogram is the oracle for
the buckets."""

from __future__ import annotations

from conftest import loaded_by
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from gateway.observability.metrics import REQUEST_BUCKETS, Metrics

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


def test_prometheus_client_is_loaded_for_the_pages_never_by_the_request_path() -> None:
    """Counting needs no prometheus_client; the operator pages load it at start (`prepare`),
    not at the first scrape: a lazy import failed once the installed package had changed
    beside a running gateway (issue 51: /metrics answered 500)."""
    counted = ("from gateway.observability.metrics import Metrics; m = Metrics(); "
               "m.request('main', 'tools/call', 'legacy', True, 0.1)")
    assert loaded_by(counted, ("prometheus_client",)) == []
    assert loaded_by(counted + "; m.prepare()", ("prometheus_client",)) == [
        "prometheus_client"]
    started = ("from gateway.app import create_app; from gateway.settings.load import "
               "from_mapping; create_app(from_mapping({'upstreams': {'main': "
               "{'command': 'true'}}}))")
    assert loaded_by(started, ("prometheus_client",)) == ["prometheus_client"]
