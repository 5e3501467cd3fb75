"""Small line charts for /status, drawn on the server as inline SVG.

No script: the page's Content-Security-Policy (admin.py) lets nothing run or load, and an
SVG element inside the HTML needs neither; its shapes take presentation attributes (fill,
stroke), not style. Every chart has a text equivalent (WCAG 2.2, 1.1.1 Non-text Content):
role="img" with an aria-label, and a <title>, saying what it shows in numbers, the same
sentence the page prints beside it (`summary`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from html import escape

WIDTH, PLOT = 240, 56  # the chart's width, and the height its values take
TOP, HEIGHT = 12, 82  # the plot starts below the top label; the time labels are under it
LINE, AREA, AXIS, TEXT = "#2a6ebb", "#dce9f7", "#999", "#555"


@dataclass(frozen=True, slots=True)
class Chart:
    name: str  # what it shows, e.g. "calls a second"
    values: list[float | None]  # one a sample, oldest first
    reads: Callable[[float], str]  # how a value reads, e.g. "120 ms"
    none: str  # what a sample without a value means, e.g. "no call answered"


def summary(chart: Chart, span: str) -> str:
    """The chart in one sentence: its value now and its highest over `span`."""
    shown = [v for v in chart.values if v is not None]
    if not shown:
        return f"{chart.name}: {chart.none} in the last {span}"
    last = chart.values[-1]
    now = chart.none if last is None else chart.reads(last)
    return f"{chart.name}: {now} now, at most {chart.reads(max(shown))} in the last {span}"


def svg(chart: Chart, span: str, whose: str = "") -> str:
    """The chart as an <svg> element: its values against a scale from 0 to a round number
    at or above the highest, the oldest at the left; a gap where a sample has no value.
    Its text names `whose` chart it is (an upstream) before the summary."""
    said = escape(f"{whose}, {summary(chart, span)}" if whose else summary(chart, span))
    top = _round_up(max((v for v in chart.values if v is not None), default=0.0))
    return "".join((
        f'<svg width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{said}"><title>{said}</title>',
        _line(0, TOP, WIDTH, TOP, 'stroke-dasharray="2 2"'),
        _line(0, TOP + PLOT, WIDTH, TOP + PLOT, ""),
        _text(0, 9, chart.reads(top), "start"),
        *(_run(run, chart.values, top) for run in _runs(chart.values)),
        _text(0, HEIGHT - 2, f"-{span}", "start"), _text(WIDTH, HEIGHT - 2, "now", "end"),
        "</svg>"))


def _run(run: range, values: list[float | None], top: float) -> str:
    """One stretch of samples with values: a line with the area under it (a dot if alone)."""
    points = [(_x(i, len(values)), _y(values[i] or 0.0, top)) for i in run]
    if len(points) == 1:
        x, y = points[0]
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="1.5" fill="{LINE}"/>'
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    base = TOP + PLOT
    return (f'<polygon points="{points[0][0]:.1f},{base} {line} {points[-1][0]:.1f},{base}" '
            f'fill="{AREA}"/><polyline points="{line}" fill="none" stroke="{LINE}" '
            'stroke-width="1.5"/>')


def _runs(values: list[float | None]) -> list[range]:
    """The stretches of consecutive samples that have a value."""
    runs, start = [], None
    for i, v in enumerate([*values, None]):
        if v is not None and start is None:
            start = i
        elif v is None and start is not None:
            runs.append(range(start, i))
            start = None
    return runs


def _x(i: int, n: int) -> float:
    return WIDTH * i / max(n - 1, 1)


def _y(value: float, top: float) -> float:
    return TOP + PLOT * (1 - value / top)


def _line(x1: float, y1: float, x2: float, y2: float, extra: str) -> str:
    return (f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{AXIS}" '
            f'stroke-width="0.5" {extra}/>')


def _text(x: float, y: float, words: str, anchor: str) -> str:
    return (f'<text x="{x}" y="{y}" font-size="10" fill="{TEXT}" text-anchor="{anchor}" '
            f'aria-hidden="true">{escape(words)}</text>')


def _round_up(value: float) -> float:
    """The scale's top: 1, 2 or 5 times a power of ten, at or above `value` (1 for none)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if value <= m * power * (1 + 1e-9))
