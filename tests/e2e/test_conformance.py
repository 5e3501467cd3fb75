"""The official conformance suite's server scenarios, run as a matrix: both requirement sets
(2025-11-25, the legacy era; 2026-07-28, the modern era) against the fixture server
(tests/servers/conformance_server.py, which speaks both eras) directly over its own
Streamable HTTP, and through the gateway in front of it as an HTTP upstream and as a stdio
upstream. Every scenario that passes directly passes through both, and every scored one
passes through; the tasks extension's scenarios, which the fixture (a server without tasks)
fails directly, pass through, where the gateway adds tasks. The per-scenario table is written
to results/ (conformance-matrix.json and .md) for the notes.

The suites run one after another: two at once interfere (server-initialize fails in one).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURE, NODE_BIN, node_env

# Six suite runs one after another: some two minutes, over the default per-test bound.
pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(600)]
ROOT = Path(__file__).parents[2]
LINE = re.compile(r"^([✓✗]) (\S+): (\d+) passed, (\d+) failed", re.M)
NOT_SCORED = re.compile(r"^\s+[✓✗] (\S+) \(", re.M)
SETS = ("2025-11-25", "2026-07-28")
LEGS = ("direct", "http", "stdio")


async def run_suite(url: str, workdir: Path, requirements: str = "2025-11-25"
                    ) -> dict[str, dict]:
    workdir.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        str(NODE_BIN / "node"), str(NODE_BIN / "conformance"), "server", "--url", url,
        "--requirements", requirements, "-o", str(workdir / "checks"), cwd=workdir,
        env=node_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 600)
    text = out.decode()
    (workdir / "output.txt").write_text(text)
    summary = text[text.rfind("=== SUMMARY ==="):]
    unscored = set(NOT_SCORED.findall(summary))
    return {name: {"ok": mark == "✓", "passed": int(p), "failed": int(f),
                   "scored": name not in unscored}
            for mark, name, p, f in LINE.findall(summary)}


# The fixture's tools are plain code; these policies alone make tasks of them (modern runs).
TASK_POLICY = {"defaults": {"mode": "auto", "sync_budget_ms": 500}, "tools": {
    "greet": {"mode": "never"}, "slow_compute": {"mode": "always"},
    "failing_job": {"mode": "required"}, "protocol_error_job": {"mode": "always"},
    "confirm_delete": {"mode": "always"}, "multi_input": {"mode": "always"},
    "test_tool_with_task": {"mode": "auto", "sync_budget_ms": 300}}}
TASK_SCENARIOS = ("tasks-lifecycle", "tasks-capability-negotiation", "tasks-wire-fields",
                  "tasks-request-state-removal", "tasks-mrtr-input", "tasks-request-headers",
                  "tasks-dispatch-and-envelope", "tasks-required-task-error",
                  "tasks-mrtr-composition")
# Scenarios that cannot hold of a proxy, by name, with the reason. None so far: every
# scenario that passes against the fixture passes through the gateway.
NOT_FOR_A_PROXY: dict[str, str] = {}



def table(results: dict[str, dict[str, dict[str, dict]]]) -> str:
    """The matrix as Markdown: one row a scenario, one column a leg, per requirement set."""
    out = []
    for reqs, legs in results.items():
        names = list(dict.fromkeys(n for leg in legs.values() for n in leg))
        out += [f"### --requirements {reqs}", "", "| scenario | scored | direct | through "
                "HTTP upstream | through stdio upstream |", "|---|---|---|---|---|"]
        for name in names:
            cells = []
            for leg in LEGS:
                r = legs.get(leg, {}).get(name)
                cells.append("-" if r is None else
                             f"{'pass' if r['ok'] else 'FAIL'} ({r['passed']}/"
                             f"{r['passed'] + r['failed']})")
            scored = next((legs[leg][name]["scored"] for leg in LEGS if name in legs.get(
                leg, {})), True)
            out.append(f"| {name} | {'yes' if scored else 'no'} | {' | '.join(cells)} |")
        totals = [f"{sum(r['ok'] for r in legs[leg].values())}/{len(legs[leg])}"
                  for leg in LEGS]
        out += [f"| **scenarios passing** | | {' | '.join(totals)} |", ""]
    return "\n".join(out)


async def test_conformance_matrix_direct_and_through_both_upstreams(direct_url, gateway
                                                                   ) -> None:
    # direct_url first: the gateways (and their streams to the fixture) close before it.
    results_dir = ROOT / "results"
    results: dict[str, dict[str, dict[str, dict]]] = {}
    took: dict[str, float] = {}
    for reqs in SETS:
        tasks = {"tasks": TASK_POLICY} if reqs == "2026-07-28" else {}
        urls = {"direct": direct_url, "http": await gateway(url=direct_url, **tasks),
                "stdio": await gateway([sys.executable, FIXTURE], **tasks)}
        results[reqs] = {}
        for leg, url in urls.items():
            start = time.monotonic()
            results[reqs][leg] = await run_suite(url, results_dir / f"{reqs}-{leg}", reqs)
            took[f"{reqs} {leg}"] = round(time.monotonic() - start, 1)
    (results_dir / "conformance-matrix.json").write_text(
        json.dumps({"results": results, "seconds": took}, indent=1))
    (results_dir / "conformance-matrix.md").write_text(
        table(results) + "\nSeconds per run: " + json.dumps(took) + "\n")
    for reqs, legs in results.items():
        direct = legs["direct"]
        assert len(direct) >= 30, "the suite should have run its server scenarios"
        for leg in ("http", "stdio"):
            through = legs[leg]
            excused = set(NOT_FOR_A_PROXY)
            regressions = [n for n, r in direct.items() if r["ok"] and not through[n]["ok"]
                           and n not in excused]
            assert regressions == [], (reqs, leg)
            failing_scored = [n for n, r in through.items()
                              if r["scored"] and not r["ok"] and n not in excused]
            assert failing_scored == [], (reqs, leg)
    for leg in ("http", "stdio"):
        # The tasks extension is not scored (optional by definition), but the gateway's
        # purpose: the fixture has no tasks, the gateway adds them.
        through = results["2026-07-28"][leg]
        assert [n for n in TASK_SCENARIOS if not through[n]["ok"]] == [], leg
        assert through["http-custom-header-server-validation"]["ok"]  # Mcp-Param-*
    # Not scored (pending: the suite's own fixture could not pass it), but ours polls as
    # SEP-1699 has it, ending test_reconnection's stream before the answer: through the
    # HTTP upstream the gateway resumes it with Last-Event-ID (issue 40).
    assert [leg for leg in LEGS if not results["2025-11-25"][leg]["server-sse-polling"]["ok"]
            ] == []
