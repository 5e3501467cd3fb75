"""/metrics in Prometheus' text format (0.0.4): the event counts `Metrics` keeps, and the
state read from `Live` at each scrape, written here line by line.

The gateway writes the format itself rather than through prometheus_client: that package
cost a serving gateway ~1.1 MiB resident (its modules and the stdlib's wsgiref, http.server
and email they pull in, issue 54), for a few counters, gauges and histograms. The output is
the one prometheus_client's `generate_latest` gives for the same families (the unit tests
hold it as the oracle): `# HELP` and `# TYPE` per family, a counter's samples named
`_total`, label names sorted, values as Go formats floats. Loaded at start with the
operator pages (`Metrics.prepare`), never first at a scrape (issue 51)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate

from gateway.observability.series import Counted, Labels, Live, Timed

Families = tuple[Counted | Timed, ...]
Sample = tuple[Labels, float]  # label values (in the family's label order) -> value


def render(families: Families, live: Live | None, lane: Callable[[str, str], str]) -> bytes:
    out: list[str] = []
    for family in families:
        if isinstance(family, Counted):
            _family(out, family.name, family.doc, "counter", family.labels,
                    family.values.items())
        else:
            _histogram(out, family)
    if live is not None:
        for name, doc, kind, labels, samples in _live(live, lane):
            _family(out, name, doc, kind, labels, samples)
    return "".join(out).encode()


def _family(out: list[str], name: str, doc: str, kind: str, labels: Labels,
            samples: Iterable[Sample]) -> None:
    if kind == "counter":
        name += "_total"
    _head(out, name, doc, kind)
    for values, value in samples:
        out.append(_line(name, dict(zip(labels, values, strict=True)), value))


def _histogram(out: list[str], family: Timed) -> None:
    name = family.name
    _head(out, name, family.doc, "histogram")
    # `le` as prometheus_client's Histogram writes bounds under a million: .0025 -> "0.0025"
    bounds = [repr(float(b)) for b in family.bounds] + ["+Inf"]
    for values, (counts, total) in family.values.items():
        labels = dict(zip(family.labels, values, strict=True))
        cumulative = list(accumulate(counts))
        for bound, count in zip(bounds, cumulative, strict=True):
            out.append(_line(f"{name}_bucket", {**labels, "le": bound}, count))
        out.append(_line(f"{name}_count", labels, cumulative[-1]))
        out.append(_line(f"{name}_sum", labels, total[0]))


def _head(out: list[str], name: str, doc: str, kind: str) -> None:
    shown = doc.replace("\\", "\\\\").replace("\n", "\\n")
    out.append(f"# HELP {name} {shown}\n")
    out.append(f"# TYPE {name} {kind}\n")


def _line(name: str, labels: dict[str, str], value: float) -> str:
    if not labels:
        return f"{name} {go_float(value)}\n"
    pairs = ",".join(f'{k}="{_escaped(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{pairs}}} {go_float(value)}\n"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def go_float(value: float) -> str:
    """A sample's value as Go (and so Prometheus, and prometheus_client) writes a float:
    2 -> "2.0", 1e6 -> "1e+06", infinities as +Inf and -Inf."""
    d = float(value)
    if math.isinf(d):
        return "+Inf" if d > 0 else "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:  # Go turns to an exponent sooner than Python
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


LiveFamily = tuple[str, str, str, Labels, Iterable[Sample]]


def _live(live: Live, lane: Callable[[str, str], str]) -> Iterator[LiveFamily]:
    """The state the gauges show, read from the parts that own it at each scrape."""
    yield ("mcp_gateway_tasks_live", "Tasks this replica runs now, by status", "gauge",
           ("status",), [((s,), n) for s, n in live.tasks_live().items()])
    yield ("mcp_gateway_store_bytes", "Bytes of results the task store holds", "gauge", (),
           [((), live.store_bytes())])
    yield ("mcp_gateway_store_outbox", "Task changes kept until the shared store takes them",
           "gauge", (), [((), live.store_outbox())])
    yield ("mcp_gateway_webhooks_pending", "Webhook deliveries not made yet (due, or "
           "waiting to be tried again)", "gauge", (), [((), live.webhooks_pending())])
    ups = live.upstreams()
    yield ("mcp_gateway_upstream_up", "1 when the upstream is initialized", "gauge",
           ("upstream",), [((n,), int(up)) for n, (up, _) in ups.items()])
    yield ("mcp_gateway_upstream_restarts", "Times the upstream was started again", "counter",
           ("upstream",), [((n,), count) for n, (_, count) in ups.items()])
    yield ("mcp_gateway_sessions", "Live legacy sessions", "gauge", (), [((), live.sessions())])
    yield ("mcp_gateway_rejections", "Requests refused, by reason (and cause, for auth)",
           "counter", ("reason", "cause"),
           [((reason, cause or ""), n) for (reason, cause), n in live.rejections().items()])
    depths: dict[Labels, int] = {}
    for (upstream, label), waiting in live.queues().items():
        key = (upstream, lane(upstream, label))
        depths[key] = depths.get(key, 0) + waiting
    yield ("mcp_gateway_queue_depth", "Calls waiting for a concurrency slot", "gauge",
           ("upstream", "tool"), list(depths.items()))
