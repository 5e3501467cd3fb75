"""The documentation works as written: the worked examples in docs/examples run against the
gateway in front of server-everything (as the default configuration has it), and the
configuration reference is the one the settings models generate."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import mcp
import mcp_types
import pytest
from conftest import NODE_BIN, node_env
from pydantic import ValidationError

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
    section = readme.split("## A first call", 1)[1]
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


def test_one_name_for_the_gateways_url() -> None:
    """Issue 33: README's curl walkthrough and docs/examples take the gateway's URL under one
    name, GATEWAY_URL."""
    texts = {p: p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"),
                                        *EXAMPLES.glob("*.sh")]}
    for path, text in texts.items():
        assert not re.search(r"\$\{?GW\b|\bGW=|\bGATEWAY=|\$\{?GATEWAY\b(?!_)", text), path
    for script in EXAMPLES.glob("*.sh"):
        assert "GATEWAY_URL=${GATEWAY_URL:-http://127.0.0.1:8080/mcp}" in texts[script]
    assert "GATEWAY_URL=${GATEWAY_URL:-http://127.0.0.1:8080/mcp}" in texts[ROOT / "README.md"]


def test_the_python_sdk_example_is_pinned_to_the_version_the_tests_run() -> None:
    """docs/tasks.md: mcp 1.30 for the tasks client, the version scripts/test.sh installs;
    and what it says of mcp 2.x holds for the 2.x the gateway's tests use."""
    doc = (ROOT / "docs" / "tasks.md").read_text()
    pin = re.search(r'pip install "(mcp==[\d.]+)"', doc)
    assert pin and f"'{pin[1]}'" in (ROOT / "scripts" / "test.sh").read_text()
    assert importlib.metadata.version("mcp").startswith("2.")
    assert not hasattr(mcp.ClientSession, "experimental")
    created = {"task": {"taskId": "t", "status": "working", "ttl": 60000,
                        "createdAt": "2026-11-23T10:00:00Z",
                        "lastUpdatedAt": "2026-11-23T10:00:00Z"}}
    with pytest.raises(ValidationError) as caught:
        mcp_types.CallToolResult.model_validate(created)
    shown = " ".join(str(caught.value).split())
    assert shown.startswith("1 validation error for CallToolResult content Field required")
    assert "`1 validation error for CallToolResult:\ncontent Field required`" in doc


def test_the_readme_gets_the_oauth_demo_as_the_test_command_does() -> None:
    """The one-liner that installs tests/node (the demo authorization server) alone is the
    one scripts/test.sh runs (docs/oauth.md, once README's OAuth section)."""
    readme = (ROOT / "docs" / "oauth.md").read_text()
    line = re.search(r"^    (\(cd tests/node && npm ci [^)]*\))$", readme, re.M)
    assert line and line[1] in (ROOT / "scripts" / "test.sh").read_text()
    assert "tests/node/idp.mjs PORT KEYS RESOURCE [TOKEN_TTL_S]" in readme
    assert "node idp.mjs PORT KEYS_FILE RESOURCE [TOKEN_TTL_S]" in (
        ROOT / "tests" / "node" / "idp.mjs").read_text()
    for client in ("robot2", "opaque-robot"):
        assert f"`{client}` (secret `{client}-secret`)" in " ".join(readme.split())
        assert f"secret('{client}')" in (ROOT / "tests" / "node" / "idp.mjs").read_text()
    assert "GATEWAY_RESOURCE" in readme and "GATEWAY_RESOURCE" in (
        ROOT / "config" / "oauth.yaml").read_text()
