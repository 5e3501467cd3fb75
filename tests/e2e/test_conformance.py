"""The official conformance suite's server scenarios, run as a matrix: both requirement sets
(2025-11-25, the legacy era; 2026-07-28, the modern era) against the fixture server
(tests/servers/conformance_server.py, which speaks both eras) directly over its own
Streamable HTTP, and through the gateway in front of it as an HTTP upstream and as a stdio
upstream. Every scenario that passes directly passes through both, and every scored one
passes through; the tasks extension's scenarios, which the fixture (a server without tasks)
fails directly, pass through, where the gateway adds tasks. The per-scenario table is written
to results/ (conformance-matrix.json and .md) for the notes.

One test a requirement set and leg (issue 42: the whole matrix as one test ran near its time
bound on a loaded host): the direct run of a set is made once and kept for the two legs
through the gateway, which are held against it (a through test run alone makes it first).
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

# One suite run takes 15 to 90 s on a loaded 2-core host (the modern set directly: its tasks
# scenarios fail slowly against a server without tasks); a test makes three at most (one
# through the gateway again when one failed: see test_the_suite_passes_through_the_gateway).
RUN_S = 240
pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(3 * RUN_S + 60)]
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
    out, _ = await asyncio.wait_for(proc.communicate(), RUN_S)
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
                  if leg in legs else "-" for leg in LEGS]
        out += [f"| **scenarios passing** | | {' | '.join(totals)} |", ""]
    return "\n".join(out)


# What the runs of this session gave, by requirement set and leg, and their seconds: the
# matrix written after each test holds every run made so far.
RESULTS: dict[str, dict[str, dict[str, dict]]] = {}
TOOK: dict[str, float] = {}


async def run_leg(url: str, reqs: str, leg: str) -> dict[str, dict]:
    """One suite run against `url`, kept and written to results/ with the runs before it."""
    results_dir = ROOT / "results"
    start = time.monotonic()
    result = await run_suite(url, results_dir / f"{reqs}-{leg}", reqs)
    TOOK[f"{reqs} {leg}"] = round(time.monotonic() - start, 1)
    RESULTS.setdefault(reqs, {})[leg] = result
    ordered = {r: {leg: RESULTS[r][leg] for leg in LEGS if leg in RESULTS[r]}
               for r in SETS if r in RESULTS}
    (results_dir / "conformance-matrix.json").write_text(
        json.dumps({"results": ordered, "seconds": TOOK}, indent=1))
    (results_dir / "conformance-matrix.md").write_text(
        table(ordered) + "\nSeconds per run: " + json.dumps(TOOK) + "\n")
    return result


async def directly(reqs: str, direct_url: str) -> dict[str, dict]:
    """The fixture's results for `reqs` without the gateway: this session's run, or one
    made now."""
    known = RESULTS.get(reqs, {}).get("direct")
    return known if known is not None else await run_leg(direct_url, reqs, "direct")


@pytest.mark.parametrize("reqs", SETS)
async def test_the_suite_runs_directly_against_the_fixture(direct_url, reqs) -> None:
    direct = await run_leg(direct_url, reqs, "direct")
    assert len(direct) >= 30, "the suite should have run its server scenarios"
    if reqs == "2025-11-25":
        # Not scored (pending: the suite's own fixture could not pass it), but ours polls
        # as SEP-1699 has it (the legs through the gateway: below).
        assert direct["server-sse-polling"]["ok"]


def failing(direct: dict[str, dict], through: dict[str, dict]) -> list[str]:
    """What fails through the gateway: a scenario that passes directly, or a scored one."""
    excused = set(NOT_FOR_A_PROXY)
    return [n for n, r in through.items() if not r["ok"] and n not in excused
            and (r["scored"] or direct.get(n, {}).get("ok"))]


@pytest.mark.parametrize("leg", ["http", "stdio"])
@pytest.mark.parametrize("reqs", SETS)
async def test_the_suite_passes_through_the_gateway(direct_url, gateway, reqs, leg) -> None:
    """Through the gateway in front of the fixture as an HTTP or a stdio upstream: every
    scenario that passes directly passes, and every scored one."""
    # direct_url first: the gateway (and its streams to the fixture) closes before it.
    direct = await directly(reqs, direct_url)
    tasks = {"tasks": TASK_POLICY} if reqs == "2026-07-28" else {}
    url = await (gateway(url=direct_url, **tasks) if leg == "http" else
                 gateway([sys.executable, FIXTURE], **tasks))
    through = await run_leg(url, reqs, leg)
    if failing(direct, through):
        # Some scenarios read a stream for 0.5 to 1.5 s only (server-stateless's listen
        # probes): on a loaded host one can miss its window (it did once in CI). One more
        # run: a scenario fails only when it fails both times.
        again = await run_leg(url, reqs, leg)
        through = {n: r if r["ok"] else again.get(n, r) for n, r in through.items()}
    assert failing(direct, through) == [], (reqs, leg)
    if reqs == "2026-07-28":
        # The tasks extension is not scored (optional by definition), but the gateway's
        # purpose: the fixture has no tasks, the gateway adds them.
        assert [n for n in TASK_SCENARIOS if not through[n]["ok"]] == [], leg
        assert through["http-custom-header-server-validation"]["ok"]  # Mcp-Param-*
    else:
        # Not scored (pending: the suite's own fixture could not pass it), but ours polls
        # as SEP-1699 has it, ending test_reconnection's stream before the answer: through
        # the HTTP upstream the gateway resumes it with Last-Event-ID (issue 40).
        assert through["server-sse-polling"]["ok"]
