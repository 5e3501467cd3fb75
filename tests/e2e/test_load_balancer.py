"""The shipped HAProxy configuration (deploy/haproxy.cfg), run by a real haproxy in front of
three gateway replicas sharing a real Redis server: a store outage keeps every replica in, a
killed replica costs no request that had not reached it; and the SDKs' task clients through it:
FastMCP with fastmcp-tasks (modern, stateless: its polls, answers and cancels land on any
replica), and on protocol 2025-11-25 core tasks the TypeScript SDK and mcp 1.30 (legacy
sessions, which the configuration keeps on the replica that made them)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import (
    MCP130,
    NODE_BIN,
    RedisServer,
    Replica,
    free_port,
    node_env,
    wait_until_ready,
)
from fastmcp import Client
from fastmcp_tasks.client import call_tool_task
from test_fastmcp import answer
from test_sdk_core_tasks import check_common, transcript
from test_tasks import call, tasks_op

ROOT = Path(__file__).parents[2]
HERE = Path(__file__).parents[1]
POLICY = {"defaults": {"mode": "auto", "sync_budget_ms": 200, "poll_interval_ms": 100},
          "tools": {"echo": {"mode": "never"}, "crash": {"mode": "required"},
                    "ask": {"mode": "always"}}}


@contextlib.asynccontextmanager
async def balancing(replicas: list[Replica]) -> AsyncIterator[str]:
    """A real haproxy with the shipped configuration in front of `replicas`; its MCP URL
    once it sees them ready."""
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.fail("haproxy is missing: run scripts/test.sh")
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


@pytest.fixture
async def front(group) -> AsyncIterator[str]:
    """HAProxy's MCP URL in front of three replicas."""
    async with balancing(await group(3, tasks=POLICY, auth={"bearer_tokens": []})) as url:
        yield url


async def test_a_store_outage_leaves_pass_through_open_behind_the_balancer(group,
                                                                         http) -> None:
    """/readyz stays 200 while the store is down, so the balancer keeps every replica in:
    plain calls go on, and tasks/* answer a clear 503."""
    own = RedisServer()
    own.start()
    try:
        replicas = await group(3, tasks=POLICY, auth={"bearer_tokens": []}, redis=own)
        async with balancing(replicas) as url:
            own.stop()
            await asyncio.sleep(3)  # three health checks: they would have failed by now
            for i in range(6):  # every replica in turn (round robin)
                echoed = await call(http, url, "echo", {"text": f"up {i}"})
                assert echoed.status == 200, echoed.body
                assert echoed.body["result"]["content"][0]["text"] == f"up {i}"
            lookup = await tasks_op(http, url, "tasks/get", "some-task")
            assert lookup.status == 503
            assert "task store is unavailable" in lookup.body["error"]["message"]
    finally:
        own.stop()


async def test_a_killed_replica_fails_no_request_behind_the_balancer(group, http) -> None:
    """Requests that meet the dead replica before the health check takes it out are sent
    to another one at once (no byte reached it), not after seconds of retrying it."""
    replicas = await group(3, tasks=POLICY, auth={"bearer_tokens": []})
    async with balancing(replicas) as url:
        replicas[1].stop(signal.SIGKILL)
        for i in range(12):  # a generous bound: haproxy's own retry turn-around is 1 s
            echoed = await asyncio.wait_for(call(http, url, "echo", {"text": f"call {i}"}), 2)
            assert echoed.status == 200, echoed.body
            assert echoed.body["result"]["content"][0]["text"] == f"call {i}"


async def test_a_draining_replica_is_taken_out_while_its_call_finishes(group, http) -> None:
    """Issue 48: SIGTERM to a replica that runs a call turns its /readyz 503; HAProxy takes
    it out (a new call that meets it meanwhile is refused as stopping, never run, and sent
    to another replica), the other serves every new call, and the draining replica's call
    finishes before it exits."""
    replicas = await group(3, tasks=POLICY, auth={"bearer_tokens": []},
                           shutdown={"drain_ms": 20_000})
    async with balancing(replicas) as url:
        draining = replicas[0]
        long = asyncio.create_task(call(http, draining.url, "sleep", {"ms": 3000}, caps={}))
        await asyncio.sleep(0.3)
        assert draining.proc is not None
        draining.proc.send_signal(signal.SIGTERM)
        for i in range(12):
            echoed = await asyncio.wait_for(call(http, url, "echo", {"text": f"call {i}"}), 5)
            assert echoed.status == 200, echoed.body
            assert echoed.body["result"]["content"][0]["text"] == f"call {i}"
            await asyncio.sleep(0.2)
        answered = await asyncio.wait_for(long, 10)
        assert answered.body["result"]["content"][0]["text"] == "slept 3000"
        assert await asyncio.to_thread(draining.proc.wait, 10) == 0


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
