"""deploy/prometheus and deploy/grafana, checked by the tools that run them: promtool checks
the alert rules and runs their unit tests (each alert fires on the series that should fire
it, not otherwise), and a real Prometheus scrapes a live gateway process (`python -m
gateway`, its operator listener, with the operators' token) while calls go through it:
inline and task calls, some failing, some waiting for a concurrency limit, a server that
crashes, a refused token. Then every expression of the Grafana dashboard, every template
variable's label query and every alert's signal are asked of Prometheus's HTTP API, and
each must return data: a misspelt series or label, or a division whose sides share no
labels, returns none.

Debian's `prometheus` package (prometheus and promtool) is installed by scripts/test.sh."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from conftest import ROOT, free_port, listening, stop, wait_until_ready
from mcp_http import BASIC
from test_modern import modern
from test_tasks import TASKS, wait_for

PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "alerts.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "mcp-task-gateway.json"
TOKEN = "dashboards-client-token-of-32-characters"
ADMIN = "dashboards-operator-token-of-32-characters"
# Grafana's variables as the checks fill them: every replica, upstream and tool; the rate
# window one scrape-rich minute (scrape_interval is 1 s here).
FILLED = {"$__rate_interval": "1m", "$instance": ".*", "$upstream": ".*", "$tool": ".*"}
# Alerts the load below makes fire as they stand, and for which tools; the others' signals
# return data (their comparison made `bool`), though no fault holds them over their
# threshold here: an upstream down for minutes, a store outbox growing, waits past 30 s.
FIRING = {"McpGatewayToolErrors": {"fail", "crash"}, "McpGatewayTaskFailures": {"crash"}}
POLICY = {"defaults": {"mode": "auto", "sync_budget_ms": 200, "ttl_ms": 60_000},
          "tools": {"echo": {"mode": "never"}, "fail": {"mode": "never"},
                    "crash": {"mode": "required"},
                    "sleep": {"max_concurrency": 1}}}  # calls to it queue


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: scripts/test.sh installs Debian's prometheus package")
    return path


def promtool(*args: str, cwd: Path = PROMETHEUS) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_the_alert_rules_pass_promtool_and_their_unit_tests() -> None:
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout
    tested = promtool("test", "rules", "alerts.test.yaml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Each alert is shown both ways: firing where it should, and silent otherwise.
    cases = [c for t in yaml.safe_load((PROMETHEUS / "alerts.test.yaml").read_text())["tests"]
             for c in t["alert_rule_test"]]
    for rule in alert_rules():
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c["exp_alerts"] for c in mine), rule["alert"]
        assert any(not c["exp_alerts"] for c in mine), rule["alert"]


def test_the_unit_tests_bite(tmp_path: Path) -> None:
    """A rule whose threshold is off fails its unit test: promtool compares, not just runs."""
    bent = RULES.read_text().replace("> 0.2\n", "> 0.5\n")
    assert bent != RULES.read_text()
    (tmp_path / RULES.name).write_text(bent)
    shutil.copy(PROMETHEUS / "alerts.test.yaml", tmp_path)
    failed = promtool("test", "rules", "alerts.test.yaml", cwd=tmp_path)
    said = failed.stdout + failed.stderr
    assert failed.returncode != 0 and "alertname: McpGatewayTaskFailures" in said, said


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target, with Grafana's variables filled."""
    board = json.loads(DASHBOARD.read_text())
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", fill(target["expr"])


def dashboard_variables() -> Iterator[tuple[str, str, str]]:
    """(name, label, series selector) of each label_values() template variable."""
    board = json.loads(DASHBOARD.read_text())
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            found = re.fullmatch(r"label_values\((.+), (\w+)\)", var["definition"])
            assert found, var["definition"]
            yield var["name"], found[2], fill(found[1])


def fill(expr: str) -> str:
    for name, value in FILLED.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable the checks do not fill: {expr}"
    return expr


def signal(expr: str) -> str:
    """An alert's expression with its final comparison made `bool`: a value for every series
    of the signal, over the threshold or not."""
    made, n = re.subn(r"\s(==|!=|>=|<=|>|<)\s*(-?[0-9.]+)\s*$", r" \1 bool \2", expr.strip())
    assert n == 1, f"an alert is one comparison of a signal with a threshold: {expr}"
    return made


def test_every_alert_is_one_comparison_and_the_dashboard_fills() -> None:
    assert [signal(r["expr"]) for r in alert_rules()]
    assert len(list(dashboard_queries())) >= 20
    assert {name for name, _, _ in dashboard_variables()} == {"instance", "upstream", "tool"}


def test_the_dashboard_is_laid_out_as_grafana_reads_it() -> None:
    """No Grafana here: what its import needs is held instead. Unique panel ids, every panel
    within the 24 columns and none over another, every query on the chosen data source."""
    board = json.loads(DASHBOARD.read_text())
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        box = panel["gridPos"]
        assert box["x"] >= 0 and box["x"] + box["w"] <= 24, panel["title"]
        for x in range(box["x"], box["x"] + box["w"]):
            for y in range(box["y"], box["y"] + box["h"]):
                assert (x, y) not in cells, (panel["title"], cells[x, y])
                cells[x, y] = panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert all(t["datasource"] == panel["datasource"] for t in panel["targets"])
    (source,) = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert (source["name"], source["query"]) == ("datasource", "prometheus")
    repeated = [p for p in panels if p.get("repeat")]
    assert [p["repeat"] for p in repeated] == ["upstream"]  # a row per upstream


# -- a live gateway, scraped -------------------------------------------------------------------


@contextlib.asynccontextmanager
async def gateway_process(tmp: Path) -> AsyncIterator[tuple[str, int]]:
    """`python -m gateway` in front of the plain stdio test server; yields its MCP URL and
    its operator port."""
    port, operator = free_port(), free_port()
    conf = {"listen": {"host": "127.0.0.1", "port": port, "operator_port": operator},
            "upstreams": {"main": {"command": BASIC[0], "args": BASIC[1:],
                                   "restart_backoff_max_ms": 200}},
            "auth": {"bearer_tokens": [TOKEN], "admin_tokens": [ADMIN]},
            "tasks": POLICY, "logging": {"level": "warning"}}
    (tmp / "gateway.yaml").write_text(json.dumps(conf))  # JSON is YAML
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "--config",
                             str(tmp / "gateway.yaml")], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await wait_until_ready(f"http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{port}/mcp", operator
    finally:
        stop(proc)


@contextlib.asynccontextmanager
async def prometheus(tmp: Path, operator: int) -> AsyncIterator[str]:
    """A Prometheus of its own scraping the operator listener every second, with the alert
    rules loaded; yields its base URL."""
    port = free_port()
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(RULES)],
              "scrape_configs": [{"job_name": "mcp-task-gateway",
                                  "authorization": {"credentials": ADMIN},
                                  "static_configs": [{"targets": [f"127.0.0.1:{operator}"]}]}]}
    (tmp / "prometheus.yml").write_text(json.dumps(config))
    proc = subprocess.Popen(
        [tool("prometheus"), f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await listening(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


async def load(http: aiohttp.ClientSession, url: str, seconds: float) -> None:
    """Calls of every kind, spread over `seconds` so that rates see them change: inline ones
    (echo), inline errors (fail), queued ones (sleep, one at a time), tasks (sleep over the
    budget), failed tasks (crash: its server exits, and restarts), a wrong token."""
    client = {"Authorization": f"Bearer {TOKEN}"}

    async def call(name: str, arguments: dict[str, Any]) -> Any:
        return await modern(http, url, "tools/call", {"name": name, "arguments": arguments},
                            TASKS, headers=client)

    end, rounds = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        replies = await asyncio.gather(
            *(call("echo", {"text": "hi"}) for _ in range(3)),
            call("fail", {"code": -32000, "message": "no"}),
            *(call("sleep", {"ms": 100}) for _ in range(3)), call("sleep", {"ms": 400}))
        for reply in replies:  # the queued ones became tasks
            task = reply.body.get("result", {})
            if task.get("resultType") == "task":
                await wait_for(http, url, task["taskId"], "completed", headers=client)
        rounds += 1
        if rounds % 3 == 1:  # alone, and waited out: its server's other calls fail with it
            task = (await call("crash", {})).body["result"]
            await wait_for(http, url, task["taskId"], "failed", headers=client)
            await wait_until_ready(url.removesuffix("/mcp"))
        async with http.post(url, json={}, headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401
        await asyncio.sleep(0.2)


async def ask(http: aiohttp.ClientSession, base: str, path: str, **params: str) -> Any:
    async with http.get(f"{base}/api/v1/{path}", params=params) as resp:
        body = await resp.json()
        assert resp.status == 200 and body["status"] == "success", body
        return body["data"]


async def answered(http: aiohttp.ClientSession, base: str, expr: str) -> list[float]:
    data = await ask(http, base, "query", query=expr)
    if data["resultType"] == "scalar":
        return [float(data["result"][1])]
    return [float(s["value"][1]) for s in data["result"]]


async def tools_alerted(http: aiohttp.ClientSession, base: str, expr: str) -> set[str]:
    return {s["metric"]["tool"] for s in (await ask(http, base, "query", query=expr))["result"]}


@pytest.mark.slow
async def test_prometheus_answers_every_dashboard_and_alert_expression(tmp_path, http
                                                                       ) -> None:
    async with gateway_process(tmp_path) as (url, operator), \
            prometheus(tmp_path, operator) as base:
        await load(http, url, 12)
        await asyncio.sleep(2.5)  # the last calls' tasks end, and are scraped
        (target,) = (await ask(http, base, "targets"))["activeTargets"]
        assert target["health"] == "up", target
        rules = [r for g in (await ask(http, base, "rules"))["groups"] for r in g["rules"]]
        assert sorted(r["name"] for r in rules) == sorted(r["alert"] for r in alert_rules())
        assert all(r["health"] == "ok" for r in rules), rules
        empty = []
        for where, expr in dashboard_queries():
            values = await answered(http, base, expr)
            if not any(math.isfinite(v) for v in values):
                empty.append((where, expr, values))
        for name, label, selector in dashboard_variables():
            if not await ask(http, base, f"label/{label}/values", **{"match[]": selector}):
                empty.append((f"variable {name}", selector, []))
        for rule in alert_rules():
            if not await answered(http, base, signal(rule["expr"])):
                empty.append((f"alert {rule['alert']}", signal(rule["expr"]), []))
        assert empty == [], "\n".join(f"{w}: {e} -> {v}" for w, e, v in empty)
        # As they stand, these fire for the failing tools, and only for them.
        for rule in alert_rules():
            if rule["alert"] in FIRING:
                assert await tools_alerted(http, base, rule["expr"]) == FIRING[rule["alert"]]
