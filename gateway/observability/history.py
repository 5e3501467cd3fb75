"""The last quarter of an hour for /status: what the counts the gateway already keeps (the
families of metrics.py) did, sampled into fixed rings (issue 44, item 2).

A `History` is sampled every `every_s` (10 s by default; admin.py runs the sampling from the
app's start to its stop) and holds:
- per upstream, `Lines`: four rings of `samples` values (90: 15 minutes) for its charts:
  tools/call answers a second, their p99 time within that sample, tasks live and calls
  queued at it;
- per row of the tools table (an upstream's tool label, or a concurrency limit's label), a
  `Window` of per-minute slots (`SLOT_SAMPLES` samples each) of counts: calls, errors and
  the duration histogram's buckets (the queue wait histogram's for a limit), summed over
  the slots held: the last 15 minutes and the one being filled.

Bounded: rows are the label sets the metrics keep, which are bounded (MAX_TOOLS tool names
an upstream, then "other"); a row idle for a whole window is dropped. The bytes a row and
an upstream cost are in docs/operations.md (Status page), held by tests/unit/test_history.py.

Quantiles are Prometheus's `histogram_quantile` over the buckets' deltas (`quantile`).

Pure: no I/O, no asyncio; the caller says when each sample is taken.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gateway.observability.series import Counted, Labels, Timed

SAMPLES = 90  # the charts' length: 15 minutes at
EVERY_S = 10.0  # one sample every 10 s
SLOT_SAMPLES = 6  # a tools table window's slot: a minute of samples
_MOST = 2**32 - 1  # what a slot's count holds (4 bytes)
Row = tuple[str, str]  # (upstream, tool or limit label)


def quantile(q: float, bounds: Sequence[float], counts: Sequence[int]) -> float | None:
    """The `q`-quantile (0 < q < 1) of the observations a histogram counted, as Prometheus's
    histogram_quantile computes it: `counts` per bucket (not cumulative; the last is +Inf's,
    one more than `bounds`), the rank found by linear interpolation within its bucket (the
    first bucket's from 0); a rank in the +Inf bucket is the highest finite bound. None: no
    observation."""
    total = sum(counts)
    if total == 0 or not bounds:
        return None
    rank = q * total
    below = 0
    for i, n in enumerate(counts):
        if n and below + n >= rank:
            if i >= len(bounds):
                return bounds[-1]
            lower = bounds[i - 1] if i else 0.0
            return lower + (bounds[i] - lower) * (rank - below) / n
        below += n
    return bounds[-1]


class Ring:
    """The last `size` values pushed; None where there was none (before the first sample,
    or a sample without one: a p99 with no call)."""

    __slots__ = ("_at", "_values")

    def __init__(self, size: int) -> None:
        self._values = array("f", [math.nan]) * size  # 4 bytes a value
        self._at = 0  # where the next value goes: over the oldest

    def push(self, value: float | None) -> None:
        self._values[self._at] = math.nan if value is None else value
        self._at = (self._at + 1) % len(self._values)

    def values(self) -> list[float | None]:
        """Oldest first."""
        ordered = self._values[self._at:] + self._values[:self._at]
        return [None if math.isnan(v) else v for v in ordered]


class Window:
    """Counts of a fixed width, summed over the last `slots` slots: `add` counts into the
    slot being filled; `turn` empties the oldest and fills it next (it leaves the sums)."""

    __slots__ = ("_at", "_slots", "sums", "width")

    def __init__(self, slots: int, width: int) -> None:
        self.width = width
        self._slots = array("I", [0]) * (slots * width)  # 4 bytes a count
        self.sums = array("Q", [0]) * width
        self._at = 0  # the slot being filled

    def add(self, counts: Sequence[int]) -> None:
        base = self._at * self.width
        for i, n in enumerate(counts):
            if n > 0:
                held = self._slots[base + i]
                now = min(held + n, _MOST)
                self._slots[base + i] = now
                self.sums[i] += now - held

    def turn(self) -> None:
        self._at = (self._at + 1) % (len(self._slots) // self.width)
        base = self._at * self.width
        for i in range(self.width):
            self.sums[i] -= self._slots[base + i]
            self._slots[base + i] = 0

    @property
    def idle(self) -> bool:
        """Nothing was counted in the slots held."""
        return not any(self.sums)


class Lines:
    """One upstream's charts, a value a sample."""

    __slots__ = ("calls", "live", "p99", "queued")

    def __init__(self, samples: int) -> None:
        self.calls = Ring(samples)  # tools/call answers a second
        self.p99 = Ring(samples)  # seconds: the p99 of those answered within the sample
        self.live = Ring(samples)  # tasks live at the sample
        self.queued = Ring(samples)  # calls waiting for a concurrency slot at the sample


@dataclass(frozen=True, slots=True)
class Figures:
    """A tools table row over the window: None where nothing was counted."""

    calls: int = 0
    errors: int = 0
    p50: float | None = None  # seconds to the answer
    p99: float | None = None
    wait_p99: float | None = None  # seconds waited for a concurrency slot


class History:
    """The samples of `calls` (mcp_gateway_tool_calls), `durations`
    (mcp_gateway_tool_call_duration_seconds) and `waits` (mcp_gateway_queue_wait_seconds),
    and of the gauges the caller reads, since `now` (when counting began)."""

    def __init__(self, calls: Counted, durations: Timed, waits: Timed, now: float,
                 every_s: float = EVERY_S, samples: int = SAMPLES) -> None:
        self.every_s = every_s
        self.samples = samples
        self._calls, self._durations, self._waits = calls, durations, waits
        self._slots = -(-samples // SLOT_SAMPLES) + 1  # the window's and the one filling
        self._seen: dict[Labels, array[int]] = {}  # counts as they were at the last sample
        self._tools: dict[Row, Window] = {}
        self._queues: dict[Row, Window] = {}
        self.lines: dict[str, Lines] = {}
        self._last = now  # when the last sample was taken
        self._starts: deque[float] = deque([now], maxlen=self._slots)  # each slot's start
        self._filled = 0  # samples in the slot being filled

    @property
    def span_s(self) -> float:
        """The time the tools table's figures cover."""
        return self._last - self._starts[0]

    def sample(self, now: float, upstreams: Iterable[str], live: Mapping[str, int],
               queued: Mapping[str, int]) -> None:
        """Take a sample at `now`: the counts since the last, and, by upstream, the tasks
        `live` and the calls `queued` at this moment."""
        before, self._last = self._last, now
        seconds = max(now - before, 1e-9)
        if self._filled == SLOT_SAMPLES:
            self._turn(before)  # this sample's counts are since `before`
        self._filled += 1
        calls, durations = self._tool_counts()
        for up in upstreams:
            lines = self.lines.get(up) or self.lines.setdefault(up, Lines(self.samples))
            lines.calls.push(calls.get(up, 0) / seconds)
            lines.p99.push(quantile(.99, self._durations.bounds, durations.get(up, ())))
            lines.live.push(live.get(up, 0))
            lines.queued.push(queued.get(up, 0))
        for (up, label), (buckets, _) in self._waits.values.items():
            self._count(self._queues, (up, label), ("wait", up, label), buckets)

    def figures(self) -> dict[Row, Figures]:
        """Each row with counts in the window."""
        out = {}
        for row, window in self._tools.items():
            buckets = window.sums[2:]
            out[row] = Figures(window.sums[0], window.sums[1],
                               quantile(.5, self._durations.bounds, buckets),
                               quantile(.99, self._durations.bounds, buckets))
        for row, window in self._queues.items():
            tool = out.get(row, Figures())
            out[row] = Figures(tool.calls, tool.errors, tool.p50, tool.p99,
                               quantile(.99, self._waits.bounds, window.sums))
        return out

    def _tool_counts(self) -> tuple[dict[str, int], dict[str, list[int]]]:
        """Count each tool's calls, errors and durations since the last sample into its
        window; what its upstream answered: calls, and their durations' buckets."""
        totals: dict[Row, list[int]] = {}
        for (up, tool, outcome), n in self._calls.values.items():
            counts = totals.get((up, tool)) or totals.setdefault((up, tool), [0, 0])
            counts[0] += n
            if outcome == "error":
                counts[1] += n
        calls: dict[str, int] = {}
        durations: dict[str, list[int]] = {}
        for row, counts in totals.items():
            seen = self._seen.get(row)
            if seen is not None and seen[0] == counts[0]:
                continue  # no call since; nor a duration (metrics.tool_called counts both)
            timed = self._durations.values.get(row)
            counts.extend(timed[0] if timed else [0] * (len(self._durations.bounds) + 1))
            delta = self._count(self._tools, row, row, counts)
            if delta is not None:
                calls[row[0]] = calls.get(row[0], 0) + delta[0]
                summed = durations.get(row[0]) or durations.setdefault(
                    row[0], [0] * (len(counts) - 2))
                for i, n in enumerate(delta[2:]):
                    if n:
                        summed[i] += n
        return calls, durations

    def _count(self, windows: dict[Row, Window], row: Row, key: Labels,
               counts: Sequence[int]) -> list[int] | None:
        """Add what `counts` (as they are now) grew by since the last sample to `row`'s
        window; that growth, None when nothing grew."""
        seen = self._seen.get(key)
        if seen is None:
            seen = self._seen[key] = array("Q", [0]) * len(counts)
        delta = [n - was for n, was in zip(counts, seen, strict=True)]
        if not any(delta):
            return None
        seen[:] = array("Q", counts)
        window = windows.get(row) or windows.setdefault(row, Window(self._slots, len(counts)))
        window.add(delta)
        return delta

    def _turn(self, start: float) -> None:
        """A new slot begins at `start` in every window; the oldest leaves, and with it the
        rows that counted nothing in the slots left."""
        self._starts.append(start)
        self._filled = 0
        for windows in (self._tools, self._queues):
            for row, window in list(windows.items()):
                window.turn()
                if window.idle:
                    del windows[row]
