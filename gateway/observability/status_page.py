"""The `/status` page: one read-only HTML document rendered from a `Snapshot`, no script.

Everything shown is escaped (tool names and status messages come from upstream servers; a
failure's message is the gateway's own, tasks/report.py `shown`). The page refreshes itself
every few seconds with a meta tag, which needs no JavaScript.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from html import escape
from typing import Any

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


def render(s: Snapshot) -> str:
    return "".join((
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f'<meta http-equiv=refresh content="{REFRESH_S}">',
        "<title>MCP task gateway: status</title>", STYLE, "</head><body>",
        f"<h1>MCP task gateway</h1><p>replica <b id=replica>{escape(s.replica)}</b>, "
        f"up {_age(s.now - s.started)}; task store <b id=store>{_store(s.store)}</b>; "
        f"{s.sessions} legacy session(s)</p>",
        "<h2>Upstreams</h2>", _upstreams(s.upstreams),
        "<h2>Queues</h2>", _queues(s.queues),
        f"<h2>Live tasks ({sum(s.live.values())})</h2>", _live(s.live), _tasks(s.tasks),
        "<h2>Recent failures</h2>", _failures(s.failures),
        "</body></html>"))


STYLE = ("<style>body{font:14px system-ui,sans-serif;margin:2em;color:#222}"
         "table{border-collapse:collapse;margin:.5em 0 1.5em}"
         "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}"
         "th{background:#f3f3f3}.bad{color:#b00}.ok{color:#070}</style>")


def _table(head: tuple[str, ...], rows: list[tuple[Any, ...]], table_id: str,
           empty: str) -> str:
    if not rows:
        return f"<p id={table_id}>{escape(empty)}</p>"
    ths = "".join(f"<th>{escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>"
                  for row in rows)
    return f"<table id={table_id}><tr>{ths}</tr>{trs}</table>"


class _Html(str):
    """A cell already rendered (not escaped again)."""


def _cell(value: Any) -> str:
    return value if isinstance(value, _Html) else escape(str(value))


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
