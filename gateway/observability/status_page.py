"""The `/status` page: one read-only HTML document rendered from a `Snapshot`, no script.

Everything shown is escaped (tool names and status messages come from upstream servers; a
failure's message is the gateway's own, tasks/report.py `shown`). The page refreshes itself
every few seconds with a meta tag, which needs no JavaScript. The last quarter of an hour
(the tools table, each upstream's charts) comes from history.py's samples; the charts are
inline SVG (charts.py), each with its summary printed beside it.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from html import escape
from typing import Any

from gateway.observability.charts import Chart, summary, svg
from gateway.observability.history import Figures, Lines

REFRESH_S = 5


@dataclass(frozen=True, slots=True)
class Snapshot:
    replica: str
    store: dict[str, Any]  # backend, up, requests (and the error, while down)
    started: float  # unix time the gateway started
    upstreams: dict[str, dict[str, Any]]  # name -> state, era, transport, restarts, ...
    live: Counter[tuple[str, str, str]]  # (upstream, tool, status) -> tasks running here
    tasks: list[tuple[str, str, str, str, float, str]]  # id, upstream, tool, status, age, msg
    failures: list[tuple[float, str, str, str]]  # when, upstream, tool, message: newest first
    sessions: int
    now: float
    queues: list[dict[str, Any]] = field(default_factory=list)  # per concurrency limit
    # The last quarter of an hour (history.py): a row a tool or limit label, its figures
    # over `span_s`, and its tasks live and calls queued now; each upstream's charts, which
    # cover `chart_s`.
    tools: list[tuple[str, str, Figures, int, int]] = field(default_factory=list)
    span_s: float = 0.0
    charts: list[tuple[str, Lines]] = field(default_factory=list)
    chart_s: float = 0.0
    budgets: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    webhooks: list[dict[str, Any]] | None = None  # each lane (gateway/push); None: no push
    unmatched: dict[str, list[str]] = field(default_factory=dict)  # upstream -> typos?
    # Named static tokens (issue 53): name, scopes, tasks running here, legacy sessions.
    principals: list[tuple[str, str, int, int]] = field(default_factory=list)


def render(s: Snapshot) -> str:
    return "".join((
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f'<meta http-equiv=refresh content="{REFRESH_S}">',
        "<title>MCP task gateway: status</title>", STYLE, "</head><body>",
        f"<h1>MCP task gateway</h1><p>replica <b id=replica>{escape(s.replica)}</b>, "
        f"up {_age(s.now - s.started)}; task store <b id=store>{_store(s.store)}</b>; "
        f"{s.sessions} legacy session(s)</p>",
        "<h2>Upstreams</h2>", _upstreams(s.upstreams), _unmatched(s.unmatched),
        f"<h2>Tools, the last {_age(s.span_s)}</h2>", _tools(s.tools, s.span_s),
        f"<h2>The last {_age(s.chart_s)}</h2>", _charts(s.charts, _age(s.chart_s)),
        "<h2>Queues</h2>", _queues(s.queues),
        "<h2>Budgets</h2>", _budgets(s.budgets), _principals(s.principals),
        "" if s.webhooks is None else "<h2>Webhooks</h2>" + _webhooks(s.webhooks, s.now),
        f"<h2>Live tasks ({sum(s.live.values())})</h2>", _live(s.live), _tasks(s.tasks),
        "<h2>Recent failures</h2>", _failures(s.failures),
        "</body></html>"))


STYLE = ("<style>body{font:14px system-ui,sans-serif;margin:2em;color:#222}"
         "table{border-collapse:collapse;margin:.5em 0 1.5em}"
         "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}"
         "th{background:#f3f3f3}.bad{color:#b00}.ok{color:#070}td.n{text-align:right}"
         ".charts{display:flex;flex-wrap:wrap;gap:1em 2em;margin:.5em 0 1.5em}"
         "figure{margin:0;width:240px}figcaption{font-size:12px;color:#444}</style>")


def _table(head: tuple[str, ...], rows: list[tuple[Any, ...]], table_id: str,
           empty: str) -> str:
    if not rows:
        return f"<p id={table_id}>{escape(empty)}</p>"
    ths = "".join(f"<th>{escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>"
                  for row in rows)
    return f"<table id={table_id}><tr>{ths}</tr>{trs}</table>"


class _Html(str):
    """A cell already rendered (not escaped again)."""


class _Figure(str):
    """A number's cell, aligned right."""


def _cell(value: Any) -> str:
    if isinstance(value, _Figure):
        return f"<td class=n>{escape(value)}</td>"
    return f"<td>{value if isinstance(value, _Html) else escape(str(value))}</td>"


def _tools(rows: list[tuple[str, str, Figures, int, int]], span_s: float) -> str:
    minutes = max(span_s, 1.0) / 60
    shown = [(up, tool, *(_Figure(v) for v in (
        _number(f.calls / minutes) if f.calls else "",
        f"{_number(100 * f.errors / f.calls)} %" if f.calls else "",
        _seconds(f.p50), _seconds(f.p99), live, queued, _seconds(f.wait_p99))))
        for up, tool, f, live, queued in rows]
    return _table(("upstream", "tool", "calls a minute", "errors", "p50", "p99",
                   "live tasks", "queued now", "queue wait p99"), shown, "tools",
                  "No tool was called lately.")


def _charts(charts: list[tuple[str, Lines]], span: str) -> str:
    out = []
    for up, lines in charts:
        figures = "".join(
            f"<figure>{svg(chart, span, up)}<figcaption>{escape(summary(chart, span))}"
            "</figcaption></figure>" for chart in (
                Chart("calls a second", lines.calls.values(), _number, "none"),
                Chart("p99 time to answer", lines.p99.values(), _seconds, "no call answered"),
                Chart("live tasks", lines.live.values(), _number, "none"),
                Chart("calls queued", lines.queued.values(), _number, "none")))
        out.append(f"<h3>{escape(up)}</h3><div class=charts>{figures}</div>")
    return "".join(out) or "<p id=charts>No sample yet.</p>"


def _budgets(rows: list[tuple[str, str, str, str, str]]) -> str:
    return _table(("budget", "in use", "bound", "bound a principal", "now"), rows,
                  "budgets", "")


def _principals(rows: list[tuple[str, str, int, int]]) -> str:
    """The named static tokens (`auth.bearer_tokens` entries with a `name`): never a token."""
    if not rows:
        return ""
    return "<h2>Principals</h2>" + _table(
        ("name", "scopes", "tasks running here", "legacy sessions here"), rows,
        "principals", "")


def _number(value: float) -> str:
    """A figure with the digits that matter: 3, 12.5, 0.25."""
    if value >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.2f}".rstrip("0").rstrip(".") if value < 10 else f"{value:.1f}"


def _seconds(value: float | None) -> str:
    if value is None:
        return ""
    return f"{_number(value * 1000)} ms" if value < 1 else f"{_number(value)} s"


def _upstreams(ups: dict[str, dict[str, Any]]) -> str:
    rows = [(name, _state(u), u.get("era", ""), u.get("transport", ""),
             u.get("isolation", ""), u.get("restarts", 0), u.get("in_flight", 0))
            for name, u in sorted(ups.items())]
    return _table(("upstream", "state", "era", "transport", "isolation", "restarts",
                   "calls in flight"), rows, "upstreams", "No upstream configured.")


def _queues(queues: list[dict[str, Any]]) -> str:
    rows = [(q["upstream"], q["tool"], f"{q['running']} / {q['max_concurrency']}",
             f"{q['waiting']} / {q['max_queue']}", q["owners_waiting"])
            for q in sorted(queues, key=lambda q: (q["upstream"], q["tool"]))]
    return _table(("upstream", "limit (tool)", "running / max", "waiting / max",
                   "callers waiting"), rows, "queues", "No concurrency limit is in use.")


def _unmatched(found: dict[str, list[str]]) -> str:
    """Per-tool entries of the settings that match no tool an upstream lists: typos?"""
    if not found:
        return ""
    rows = [("every upstream" if where == "*" else where, ", ".join(patterns))
            for where, patterns in sorted(found.items())]
    return "<p class=bad>Task policy entries that match no listed tool (a typo?):</p>" + \
        _table(("upstream", "entries"), rows, "unmatched", "")


def _webhooks(lanes: list[dict[str, Any]], now: float) -> str:
    """Each endpoint (its host and path, never a query or credentials), and clients' own."""
    rows = [(w["endpoint"], _Html("<span class=bad>disabled (410)</span>") if w["disabled"]
             else _Html("<span class=ok>on</span>"), w["delivered"], w["failures"],
             "" if w["pending"] is None else w["pending"],
             "" if w["last"] is None else
             f"{w['last']['outcome']}, {_age(now - w['last']['at'])} ago")
            for w in lanes]
    return _table(("endpoint", "state", "delivered", "failed attempts", "pending",
                   "last attempt here"), rows, "webhooks", "No webhook.")


def _state(u: dict[str, Any]) -> _Html:
    cls = "ok" if u.get("ready") else "bad"
    return _Html(f"<span class={cls}>{escape(str(u.get('state', '?')))}</span>")


def _live(live: Counter[tuple[str, str, str]]) -> str:
    rows = [(up, tool, status, n) for (up, tool, status), n in sorted(live.items())]
    return _table(("upstream", "tool", "status", "tasks"), rows, "live",
                  "No task runs on this replica.")


def _tasks(tasks: list[tuple[str, str, str, str, float, str]]) -> str:
    if not tasks:
        return ""
    rows = [(tid, up, tool, status, _age(age), msg) for tid, up, tool, status, age, msg in tasks]
    return _table(("task", "upstream", "tool", "status", "running for", "status message"),
                  rows, "tasks", "")


def _failures(failures: list[tuple[float, str, str, str]]) -> str:
    rows = [(time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(when)) + " UTC", up, tool, msg)
            for when, up, tool, msg in failures]
    return _table(("when", "upstream", "tool", "message"), rows, "failures",
                  "No task failed lately.")


def _store(store: dict[str, Any]) -> str:
    state = "up" if store.get("up") else f"down ({store.get('error', 'no answer')})"
    text = f"{store.get('backend', '?')}, {state}"
    outbox = store.get("outbox")
    if outbox is not None:  # what the store has not taken yet, kept by this replica
        text += f"; outbox: {outbox['changes']} change(s), {outbox['bytes']} bytes"
    return escape(text)


def _age(seconds: float) -> str:
    seconds = int(max(0, seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"
