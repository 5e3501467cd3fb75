"""The official conformance suite's server scenarios for protocol 2025-11-25, against the
Python SDK fixture served directly over HTTP and behind the gateway over stdio.

Every scenario that passes directly must pass through the gateway, and every scored scenario
must pass through the gateway. The per-scenario table is written to results/ for the notes.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest
from conftest import NODE_BIN, node_env
from test_sdk_python import FIXTURE, direct_url  # noqa: F401 - a shared fixture

pytestmark = [pytest.mark.node, pytest.mark.slow]
ROOT = Path(__file__).parents[2]
LINE = re.compile(r"^([✓✗]) (\S+): (\d+) passed, (\d+) failed", re.M)
NOT_SCORED = re.compile(r"^\s+[✓✗] (\S+) \(", re.M)


async def run_suite(url: str, workdir: Path) -> dict[str, dict]:
    workdir.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        str(NODE_BIN / "node"), str(NODE_BIN / "conformance"), "server", "--url", url,
        "--requirements", "2025-11-25", cwd=workdir, env=node_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 600)
    text = out.decode()
    (workdir / "output.txt").write_text(text)
    summary = text[text.rfind("=== SUMMARY ==="):]
    unscored = set(NOT_SCORED.findall(summary))
    return {name: {"ok": mark == "✓", "passed": int(p), "failed": int(f),
                   "scored": name not in unscored}
            for mark, name, p, f in LINE.findall(summary)}


async def test_conformance_through_the_gateway_matches_direct(gateway, direct_url) -> None:  # noqa: F811
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
