"""The official conformance suite's server scenarios, run by requirement set.

2025-11-25 (legacy era): against the Python SDK fixture served directly over HTTP and behind
the gateway over stdio; every scenario that passes directly must pass through the gateway,
and every scored one must pass through the gateway.
2026-07-28 (modern era): against the gateway in front of the same fixture, a LEGACY stdio
server with plain elicitation and sampling; every scored scenario must pass.
Per-scenario tables are written to results/ for the notes.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest
from conftest import FIXTURE, NODE_BIN, node_env

pytestmark = [pytest.mark.node, pytest.mark.slow]
ROOT = Path(__file__).parents[2]
LINE = re.compile(r"^([✓✗]) (\S+): (\d+) passed, (\d+) failed", re.M)
NOT_SCORED = re.compile(r"^\s+[✓✗] (\S+) \(", re.M)


async def run_suite(url: str, workdir: Path, requirements: str = "2025-11-25"
                    ) -> dict[str, dict]:
    workdir.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        str(NODE_BIN / "node"), str(NODE_BIN / "conformance"), "server", "--url", url,
        "--requirements", requirements, cwd=workdir, env=node_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 600)
    text = out.decode()
    (workdir / "output.txt").write_text(text)
    summary = text[text.rfind("=== SUMMARY ==="):]
    unscored = set(NOT_SCORED.findall(summary))
    return {name: {"ok": mark == "✓", "passed": int(p), "failed": int(f),
                   "scored": name not in unscored}
            for mark, name, p, f in LINE.findall(summary)}


async def test_conformance_through_the_gateway_matches_direct(gateway, direct_url) -> None:
    url = await gateway([sys.executable, FIXTURE])
    results = ROOT / "results"
    # One after the other: two suites at once interfere (server-initialize fails in one).
    direct = await run_suite(direct_url, results / "direct")
    through = await run_suite(url, results / "gateway")
    (results / "conformance-2025-11-25.json").write_text(
        json.dumps({"direct": direct, "gateway": through}, indent=1))
    assert len(through) >= 30, "the suite should have run its server scenarios"
    regressions = [n for n, r in direct.items() if r["ok"] and not through[n]["ok"]]
    assert regressions == []
    failing_scored = [n for n, r in through.items() if r["scored"] and not r["ok"]]
    assert failing_scored == []


# The fixture's tools are plain synchronous code; these policies alone make tasks of them.
TASK_POLICY = {"defaults": {"mode": "auto", "sync_budget_ms": 500}, "tools": {
    "greet": {"mode": "never"}, "slow_compute": {"mode": "always"},
    "failing_job": {"mode": "required"}, "protocol_error_job": {"mode": "always"},
    "confirm_delete": {"mode": "always"}, "multi_input": {"mode": "always"},
    "test_tool_with_task": {"mode": "auto", "sync_budget_ms": 300}}}
TASK_SCENARIOS = ("tasks-lifecycle", "tasks-capability-negotiation", "tasks-wire-fields",
                  "tasks-request-state-removal", "tasks-mrtr-input", "tasks-request-headers",
                  "tasks-dispatch-and-envelope", "tasks-required-task-error",
                  "tasks-mrtr-composition")


async def test_modern_conformance_through_the_gateway(gateway) -> None:
    url = await gateway([sys.executable, FIXTURE], tasks=TASK_POLICY)
    results = ROOT / "results"
    through = await run_suite(url, results / "modern", "2026-07-28")
    (results / "conformance-2026-07-28.json").write_text(json.dumps(through, indent=1))
    assert through["server-stateless"]["ok"] and through["http-header-validation"]["ok"]
    assert through["http-custom-header-server-validation"]["ok"]  # Mcp-Param-* (unscored)
    assert [n for n in through if n.startswith("input-required-result-")] != []
    failing_scored = [n for n, r in through.items() if r["scored"] and not r["ok"]]
    assert failing_scored == []
    # The tasks extension is not scored (optional by definition), but the gateway's purpose.
    failing_tasks = [n for n in TASK_SCENARIOS if not through[n]["ok"]]
    assert failing_tasks == []
