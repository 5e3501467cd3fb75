"""The documentation works as written: the worked examples in docs/examples run against the
gateway in front of server-everything (as the default configuration has it), and the
configuration reference is the one the settings models generate."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NODE_BIN, node_env

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "docs" / "examples"

pytestmark = pytest.mark.node


@pytest.fixture
async def everything(gateway) -> str:
    """The gateway as config/gateway.yaml runs it: server-everything through npx."""
    return await gateway(["npx", "-y", "@modelcontextprotocol/server-everything"],
                         upstream={"cwd": str(NODE_BIN.parents[2]),
                                   "env": {"PATH": node_env()["PATH"]}})


async def run(*argv: str, url: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=ROOT, env={**node_env(), "GATEWAY_URL": url},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def last(line_start: str, out: str) -> dict:
    line = next(x for x in reversed(out.splitlines()) if x.startswith(line_start))
    return json.loads(line.split(": ", 1)[1])


async def test_tasks_extension_with_curl(everything) -> None:
    out = await run("sh", str(EXAMPLES / "tasks-extension.sh"), url=everything)
    created = last("created:", out)["result"]
    assert created["resultType"] == "task" and created["status"] == "working"
    assert "polled:" in out  # it was polled while it worked
    ended = last("ended:", out)["result"]
    assert ended["status"] == "completed" and ended["taskId"] == created["taskId"]
    assert "Long running operation completed" in ended["result"]["content"][0]["text"]


async def test_core_tasks_with_curl(everything) -> None:
    out = await run("sh", str(EXAMPLES / "core-tasks.sh"), url=everything)
    created = last("created:", out)["result"]["task"]
    assert created["status"] == "working"
    result = last("result:", out)["result"]
    assert "Long running operation completed" in result["content"][0]["text"]
    assert result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"] == \
        created["taskId"]


async def test_tasks_extension_with_fastmcp(everything) -> None:
    out = await run(sys.executable, str(EXAMPLES / "fastmcp_client.py"), everything, url="")
    assert re.search(r"call_tool: Long running operation completed", out)
    assert re.search(r"task: \S+ working", out) and "ended: completed" in out
    assert "result: Long running operation completed" in out
    assert "cancelled: cancelled" in out


def test_configuration_reference_is_generated_from_the_settings() -> None:
    check = subprocess.run([sys.executable, "scripts/config_reference.py", "--check"],
                           cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    text = (ROOT / "docs" / "configuration.md").read_text()
    for key in ("`sync_budget_ms`", "`max_tasks_per_owner`", "`otlp_endpoint`",
                "`allow_unauthenticated`", "`lease_ms`"):
        assert key in text


async def test_the_readme_curl_walkthrough_runs_as_written(everything) -> None:
    """Issue 21: README's first look with curl, pasted into a shell: every answer is what
    its comment says."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### A first look with curl", 1)[1]
    script = section.split("```sh\n", 1)[1].split("```", 1)[0]
    proc = await asyncio.create_subprocess_exec(
        "bash", "-euo", "pipefail", "-c", script, cwd=ROOT,
        env={**node_env(), "GATEWAY_URL": everything},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    lines = [json.loads(x) for x in out.decode().splitlines() if x.strip()]
    tools, echoed, legacy_cancel, modern_echo, modern_cancel, got = lines
    assert "trigger-long-running-operation" in {t["name"] for t in tools["result"]["tools"]}
    assert echoed["result"]["content"][0]["text"] == "Echo: hi"
    assert legacy_cancel["result"]["status"] == "cancelled"
    assert modern_echo["result"]["content"][0]["text"] == "Echo: hi"
    assert modern_cancel["result"] == {"resultType": "complete"}
    assert got["result"]["status"] == "cancelled"
    created = [json.loads(x) for x in err.decode().splitlines() if x.startswith("{")]
    assert created[0]["result"]["task"]["status"] == "working"
    assert created[1]["result"]["resultType"] == "task"
