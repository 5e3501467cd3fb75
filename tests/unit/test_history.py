"""The status page's history (gateway/observability/history.py): the rings, the windows, the
quantiles from bucket deltas, and what a quarter of an hour of samples costs."""

from __future__ import annotations

import gc
import math
import tracemalloc
from bisect import bisect_left

from hypothesis import given
from hypothesis import strategies as st

from gateway.observability.history import (
    SAMPLES,
    SLOT_SAMPLES,
    History,
    Ring,
    Window,
    quantile,
)
from gateway.observability.metrics import MAX_TOOLS, REQUEST_BUCKETS, Metrics

BOUNDS = (1.0, 2.0, 4.0)


def test_a_quantile_is_interpolated_within_its_bucket_as_prometheus_does() -> None:
    counts = [1, 1, 1, 1]  # one in each of (0, 1], (1, 2], (2, 4], (4, +Inf)
    assert quantile(.25, BOUNDS, counts) == 1.0  # rank 1: the first bucket's top
    assert quantile(.1, BOUNDS, counts) == 0.4  # from 0 in the first bucket
    assert quantile(.5, BOUNDS, counts) == 2.0
    assert quantile(.625, BOUNDS, counts) == 3.0  # rank 2.5: half way through (2, 4]
    assert quantile(.99, BOUNDS, counts) == 4.0  # in +Inf's: the highest finite bound
    assert quantile(.5, BOUNDS, [0, 0, 4, 0]) == 3.0  # empty buckets below are skipped
    assert quantile(.5, BOUNDS, [0, 0, 0, 0]) is None  # no observation
    assert quantile(.5, (), [3]) is None  # +Inf alone: Prometheus says NaN


@given(st.lists(st.floats(min_value=0, max_value=70, allow_nan=False), min_size=1,
                max_size=200), st.sampled_from((.5, .9, .99)))
def test_a_quantile_lies_in_the_bucket_of_the_observation_at_its_rank(
        seen: list[float], q: float) -> None:
    counts = [0] * (len(REQUEST_BUCKETS) + 1)
    for v in seen:
        counts[bisect_left(REQUEST_BUCKETS, v)] += 1  # as series.Timed counts
    estimate = quantile(q, REQUEST_BUCKETS, counts)
    at_rank = sorted(seen)[math.ceil(q * len(seen)) - 1]
    bucket = bisect_left(REQUEST_BUCKETS, at_rank)
    assert estimate is not None
    if bucket == len(REQUEST_BUCKETS):
        assert estimate == REQUEST_BUCKETS[-1]
    else:
        lower = REQUEST_BUCKETS[bucket - 1] if bucket else 0.0
        assert lower <= estimate <= REQUEST_BUCKETS[bucket]


def test_a_ring_holds_the_last_values_oldest_first() -> None:
    ring = Ring(3)
    assert ring.values() == [None, None, None]  # no sample yet
    for v in (1, None, 3, 4):
        ring.push(v)
    assert ring.values() == [None, 3.0, 4.0]  # 1 went; a sample without a value stays a gap


def test_a_window_sums_its_slots_and_a_turn_lets_the_oldest_go() -> None:
    window = Window(3, 2)
    window.add([1, 0])
    window.add([2, 5])  # into the same slot
    window.turn()
    window.add([10, 0])
    window.turn()
    assert list(window.sums) == [13, 5] and not window.idle
    window.turn()  # the first slot leaves, and is filled next
    assert list(window.sums) == [10, 0]
    window.add([1, 1])
    assert list(window.sums) == [11, 1]
    window.turn()  # the 10 leaves
    window.turn()
    assert list(window.sums) == [1, 1]
    window.turn()
    assert window.idle


def history(metrics: Metrics, every_s: float = 10.0) -> History:
    return History(metrics.tool_calls, metrics.tool_duration, metrics.queue_wait, 0.0,
                   every_s)


def test_the_history_of_tool_calls_charts_and_tables_what_the_counters_grew_by() -> None:
    metrics = Metrics(lambda _u, _t: True)
    past = history(metrics)
    for _ in range(98):
        metrics.tool_called("main", "echo", "ok", 0.003)
    metrics.tool_called("main", "echo", "error", 0.3)
    metrics.tool_called("main", "sleep", "ok", 2.0)
    past.sample(10.0, ["main", "idle"], {"main": 2}, {})
    metrics.queue_waited("main", "sleep", 0.2)
    past.sample(20.0, ["main", "idle"], {"main": 1}, {"main": 3})

    figures = past.figures()
    echo, sleep = figures["main", "echo"], figures["main", "sleep"]
    assert (echo.calls, echo.errors) == (99, 1)
    assert echo.p50 is not None and 0.0025 < echo.p50 <= 0.005  # 98 of 99 in (2.5, 5] ms
    assert echo.p99 is not None and 0.25 < echo.p99 <= 0.5  # the slow one
    assert (sleep.calls, sleep.errors, sleep.wait_p99 is not None) == (1, 0, True)
    assert past.span_s == 20.0

    main = past.lines["main"]
    assert main.calls.values()[-2:] == [10.0, 0.0]  # 100 calls in 10 s, then none
    assert main.p99.values()[-2:] == [0.5, None]  # rank 99 of 100: (0.25, 0.5]; none answered
    assert main.live.values()[-2:] == [2.0, 1.0]
    assert main.queued.values()[-2:] == [0.0, 3.0]
    assert past.lines["idle"].calls.values()[-2:] == [0.0, 0.0]
    assert len(main.calls.values()) == SAMPLES


def test_a_row_leaves_the_table_a_quarter_of_an_hour_after_its_last_call() -> None:
    metrics = Metrics(lambda _u, _t: True)
    past = history(metrics)
    metrics.tool_called("main", "echo", "ok", 0.01)
    t = 0.0
    for _ in range(SAMPLES):
        t += 10.0
        past.sample(t, ["main"], {}, {})
    assert past.figures()["main", "echo"].calls == 1  # still in the window
    for _ in range(2 * SLOT_SAMPLES):
        t += 10.0
        past.sample(t, ["main"], {}, {})
    assert past.figures() == {}
    assert 15 * 60 <= past.span_s <= 16 * 60  # 15 whole minutes and the one being filled
    metrics.tool_called("main", "echo", "ok", 0.01)  # back: counted from where it was
    past.sample(t + 10, ["main"], {}, {})
    assert past.figures()["main", "echo"].calls == 1


def test_the_rate_is_over_the_time_a_sample_really_took() -> None:
    metrics = Metrics(lambda _u, _t: True)
    past = history(metrics, every_s=0.5)
    for _ in range(6):
        metrics.tool_called("main", "echo", "ok", 0.01)
    past.sample(2.0, ["main"], {}, {})  # late: 6 calls over 2 s, not 0.5
    assert past.lines["main"].calls.values()[-1] == 3.0


def test_what_the_history_costs_is_what_the_operations_page_says() -> None:
    """docs/operations.md, Status page: about 2 KiB an upstream, 2.4 KiB a tool row (a
    concurrency limit's row about 1.7 KiB), whatever the calls."""
    def cost(upstreams: int, tools: int, limits: int) -> int:
        metrics = Metrics(lambda _u, _t: True)
        names = [f"up{u}" for u in range(upstreams)]

        def traffic() -> None:
            for up in names:
                for t in range(tools):
                    metrics.tool_called(up, f"tool{t}", "ok", 0.01)
                    metrics.tool_called(up, f"tool{t}", "error", 700.0)
                for t in range(limits):
                    metrics.queue_waited(up, f"tool{t}", 0.3)
        traffic()
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            past = history(metrics)
            for i in range(1, 2 * SLOT_SAMPLES):  # every ring and window is whole at once
                traffic()
                past.sample(i * 10.0, names, {up: 5 for up in names}, {up: 1 for up in names})
            gc.collect()
            return tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()

    base = cost(1, 0, 0)
    assert cost(3, 0, 0) - base <= 2 * 2100  # an upstream's charts
    assert cost(1, 100, 0) - base <= 100 * 2500  # a tool's row
    assert cost(1, 0, 100) - base <= 100 * 1800  # a limit's row
    assert cost(1, MAX_TOOLS + 1, 0) <= 512 * 1024  # an upstream at its cap, "other" too
