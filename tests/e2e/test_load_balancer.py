"""The shipped HAProxy configuration (deploy/haproxy.cfg), run by a real haproxy in front of
three gateway replicas sharing a real Redis server, and the SDKs' task clients through it:
FastMCP with fastmcp-tasks (modern, stateless: its polls, answers and cancels land on any
replica), and on protocol 2025-11-25 core tasks the TypeScript SDK and mcp 1.30 (legacy
sessions, which the configuration keeps on the replica that made them)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import MCP130, NODE_BIN, free_port, node_env, wait_until_ready
from fastmcp import Client
from fastmcp_tasks.client import call_tool_task
from test_fastmcp import answer
from test_sdk_core_tasks import check_common, transcript

ROOT = Path(__file__).parents[2]
HERE = Path(__file__).parents[1]
POLICY = {"defaults": {"mode": "auto", "sync_budget_ms": 200, "poll_interval_ms": 100},
          "tools": {"echo": {"mode": "never"}, "crash": {"mode": "required"},
                    "ask": {"mode": "always"}}}


@pytest.fixture
async def front(group) -> AsyncIterator[str]:
    """HAProxy's MCP URL, once it sees all three replicas ready."""
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.fail("haproxy is missing: run scripts/test.sh")
    replicas = await group(3, tasks=POLICY, auth={"bearer_tokens": []})
    port = free_port()
    env = {**os.environ, "FRONT": f"127.0.0.1:{port}",
           **{f"GATEWAY_{i + 1}": f"127.0.0.1:{r.port}" for i, r in enumerate(replicas)}}
    proc = subprocess.Popen([haproxy, "-db", "-f", str(ROOT / "deploy" / "haproxy.cfg")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await wait_until_ready(f"http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait(10)


async def test_fastmcp_tasks_across_replicas(front) -> None:
    async with Client(front, elicitation_handler=answer) as client:
        assert (await client.call_tool("echo", {"text": "inline"})).content[0].text == "inline"
        tasked = await client.call_tool("sleep", {"ms": 600})  # polled on every replica
        assert tasked.content[0].text == "slept 600"
        handle = await call_tool_task(client, "sleep", {"ms": 700})
        assert (await handle.wait(timeout=10)).status == "completed"
        assert (await handle.result()).content[0].text == "slept 700"
        doomed = await call_tool_task(client, "sleep", {"ms": 10_000})
        await doomed.cancel()
        assert (await doomed.wait(timeout=10)).status == "cancelled"
        asked = await client.call_tool("ask", {"message": "Name?"})  # answered anywhere
        reply = json.loads(asked.content[0].text)
        assert reply == {"action": "accept", "content": {"name": "Ada, asked 'Name?'"}}


@pytest.mark.node
async def test_typescript_sdk_core_tasks_through_the_balancer(front) -> None:
    seen = await transcript(str(NODE_BIN / "node"), str(HERE / "node" / "tasks.mjs"), front,
                            env=node_env())
    check_common(seen)
    assert seen["sleep"][-1] == ["result", "slept 300", "related"]
    assert json.loads(seen["ask"][-1][1])["content"] == {"name": "Ada"}


async def test_python_sdk_1_30_core_tasks_through_the_balancer(front) -> None:
    if not MCP130.exists():
        pytest.fail("the mcp==1.30.0 environment is missing: run scripts/test.sh")
    seen = await transcript(str(MCP130), str(HERE / "clients" / "mcp130_tasks.py"), front)
    check_common(seen)
    assert seen["polled"] == "completed" and seen["result"] == ["slept 300", True]
    assert seen["answered"] == {"name": "Grace"}
