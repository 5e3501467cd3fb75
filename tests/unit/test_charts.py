"""/status's charts (gateway/observability/charts.py): SVG with its text equivalent, gaps
where a sample has no value, the scale's round top."""

from __future__ import annotations

import re

from gateway.observability.charts import Chart, summary, svg


def ms(v: float) -> str:
    return f"{v * 1000:.0f} ms"


def test_a_chart_says_in_words_what_it_draws() -> None:
    chart = Chart("p99", [None, 0.12, None, 0.3, 0.25], ms, "no call answered")
    said = summary(chart, "15 min")
    assert said == "p99: 250 ms now, at most 300 ms in the last 15 min"
    drawn = svg(chart, "15 min", "main")
    assert drawn.startswith("<svg ") and 'role="img"' in drawn
    assert f'aria-label="main, {said}"' in drawn and f"<title>main, {said}</title>" in drawn
    assert drawn.count("<circle") == 1  # 0.12 alone between gaps
    assert drawn.count("<polyline") == 1  # 0.3 then 0.25
    assert ">500 ms</text>" in drawn  # the scale's top: a round number above the highest
    assert "style=" not in drawn and "<script" not in drawn


def test_a_chart_without_values_says_so_and_escapes_what_it_names() -> None:
    chart = Chart('calls of "<b>"', [None, None], str, "no call answered")
    assert summary(chart, "18 s") == 'calls of "<b>": no call answered in the last 18 s'
    drawn = svg(chart, "18 s")
    assert "<b>" not in drawn and "&lt;b&gt;" in drawn and "&quot;" in drawn
    assert "<polyline" not in drawn and "<circle" not in drawn


def test_the_scale_tops_at_one_two_or_five_times_a_power_of_ten() -> None:
    def top(*values: float) -> str:
        found = re.search(r'text-anchor="start"[^>]*>([^<]+)</text>',
                          svg(Chart("x", list(values), lambda v: f"{v:g}", ""), "1 min"))
        assert found is not None
        return found.group(1)

    assert [top(0.0), top(3.0), top(0.012), top(50.0), top(51.0), top(999.0)] == \
        ["1", "5", "0.02", "50", "100", "1000"]
