"""Concurrency limits in front of a server that can run one call at a time (the test server's
`render`: a second call while one runs fails "busy"): calls beyond the limit wait their turn
in a fair queue; a task-capable caller gets a task at once that says where it stands; a
queued task cancelled never reaches the server; a full queue is refused at once."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import MCP130, NODE_BIN, node_env
from mcp_http import McpHttp, text_of
from test_sdk_core_tasks import HERE, transcript
from test_tasks import TASKS, call, tasks_op, wait_for

RENDER = {"tools": {"render": {"mode": "auto", "sync_budget_ms": 5000, "max_concurrency": 1,
                               "max_queue": 2, "poll_interval_ms": 100}}}


async def rendered(http, url) -> list[str]:
    """What the server was asked to render, in order: a call that never reached it is not
    there."""
    reply = await call(http, url, "rendered", caps={})
    return json.loads(reply.body["result"]["content"][0]["text"])


async def until_queued(http, url, n: int) -> None:
    for _ in range(100):
        body = (await http.get(url.replace("/mcp", "/metrics"))).content
        text = (await body.read()).decode()
        if f'mcp_gateway_queue_depth{{tool="render",upstream="main"}} {n}.0' in text:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never {n} waiting")


async def test_modern_task_callers_get_a_queued_task_at_once(gateway, http) -> None:
    url = await gateway(tasks=RENDER)
    first = asyncio.create_task(call(http, url, "render", {"text": "a", "ms": 600}))
    await asyncio.sleep(0.2)  # `a` runs, inline within its budget
    b = (await call(http, url, "render", {"text": "b", "ms": 100})).body["result"]
    c = (await call(http, url, "render", {"text": "c"})).body["result"]
    assert (b["resultType"], b["status"], b["statusMessage"]) == ("task", "working",
                                                                  "queued: 0 ahead")
    assert c["statusMessage"] == "queued: 1 ahead" and c["pollIntervalMs"] >= 100
    full = await call(http, url, "render", {"text": "d"})
    assert full.status == 503 and full.body["error"]["code"] == -32000
    assert "at most 1 calls of 'render' run at once" in full.body["error"]["message"]
    assert full.body["error"]["data"]["maxQueue"] == 2
    assert full.body["error"]["data"]["retryAfterMs"] >= 1
    await tasks_op(http, url, "tasks/cancel", c["taskId"])  # leaves the queue
    assert (await wait_for(http, url, c["taskId"], "cancelled"))["status"] == "cancelled"
    assert (await first).body["result"]["content"][0]["text"] == "rendered a"
    done = await wait_for(http, url, b["taskId"], "completed")
    assert done["result"]["content"][0]["text"] == "rendered b"  # never "busy"
    assert await rendered(http, url) == ["a", "b"]  # `c` never reached the server
    metrics = await (await http.get(url.replace("/mcp", "/metrics"))).text()
    assert 'mcp_gateway_queue_wait_seconds_count{tool="render",upstream="main"} 1.0' in metrics
    assert 'mcp_gateway_rejections_total{cause="",reason="queue_full"} 1.0' in metrics
    page = await (await http.get(url.replace("/mcp", "/status"))).text()
    assert "<table id=queues>" in page and "<td>render</td>" in page


async def test_a_task_status_follows_the_queue(gateway, http) -> None:
    url = await gateway(tasks=RENDER)
    running = asyncio.create_task(call(http, url, "render", {"text": "a", "ms": 500}))
    await asyncio.sleep(0.15)
    b = (await call(http, url, "render", {"text": "b", "ms": 400})).body["result"]
    assert b["statusMessage"] == "queued: 0 ahead"
    await running
    seen = await wait_for(http, url, b["taskId"], "working")
    assert "statusMessage" not in seen or not seen["statusMessage"].startswith("queued")
    assert (await wait_for(http, url, b["taskId"], "completed"))["status"] == "completed"


async def test_callers_without_tasks_wait_with_keepalives(gateway, http) -> None:
    url = await gateway(tasks=RENDER, listen={"sse_keepalive_ms": 100})
    legacy = McpHttp(http, url)
    await legacy.initialize()  # 2025-06-18: no tasks
    first = asyncio.create_task(legacy.call("render", {"text": "a", "ms": 700}))
    await asyncio.sleep(0.15)
    curl = await asyncio.create_subprocess_exec(
        "curl", "-sN", "-X", "POST", url, "-H", "Content-Type: application/json",
        "-H", "Accept: application/json, text/event-stream",
        "-H", f"Mcp-Session-Id: {legacy.session_id}", "-H", "MCP-Protocol-Version: 2025-06-18",
        "--data", json.dumps({"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {
            "name": "render", "arguments": {"text": "b", "ms": 50}}}),
        stdout=asyncio.subprocess.PIPE)
    await until_queued(http, url, 1)
    full_a = asyncio.create_task(legacy.call("render", {"text": "x"}))
    await until_queued(http, url, 2)
    refused = await legacy.call("render", {"text": "y"})  # the queue holds 2
    assert refused.status == 200 and refused.body["error"]["code"] == -32000  # a session's
    assert text_of(await first) == "rendered a"
    out, _ = await asyncio.wait_for(curl.communicate(), 10)
    assert b": keep-alive" in out and b"rendered b" in out and b"busy" not in out
    assert text_of(await full_a) == "rendered x"
    assert await rendered(http, url) == ["a", "b", "x"]


async def test_a_server_wide_limit_queues_every_tool(gateway, http) -> None:
    url = await gateway(upstream={"max_concurrency": 1, "max_queue": 5})
    slow = asyncio.create_task(call(http, url, "sleep", {"ms": 400}, caps={}))
    await asyncio.sleep(0.1)
    task = (await call(http, url, "echo", {"text": "hi"})).body["result"]  # default: auto
    assert task["resultType"] == "task" and task["statusMessage"] == "queued: 0 ahead"
    await slow
    done = await wait_for(http, url, task["taskId"], "completed")
    assert done["result"]["content"][0]["text"] == "hi"
    plain = (await call(http, url, "echo", {"text": "now"}, caps={})).body["result"]
    assert plain["content"][0]["text"] == "now"  # resources, prompts, lists: never queued
    assert (await call(http, url, "whoami", caps=TASKS)).status == 200


@pytest.mark.parametrize("sdk", ["python", pytest.param("typescript", marks=pytest.mark.node)])
async def test_sdk_task_clients_see_the_queue(gateway, sdk: str) -> None:
    """Core tasks (2025-11-25): each SDK's user sees its tasks queued, one cancelled while
    waiting, the others' results; the server rendered one call at a time, never the
    cancelled one."""
    url = await gateway(tasks=RENDER)
    if sdk == "python":
        seen = await transcript(str(MCP130), str(HERE / "clients" / "mcp130_queue.py"), url)
    else:
        seen = await transcript(str(NODE_BIN / "node"), str(HERE / "node" / "queue.mjs"), url,
                                env=node_env())
    assert seen["created"] == [None, "queued: 0 ahead", "queued: 1 ahead"]
    assert seen["cancelled"] == "cancelled"
    assert seen["results"] == ["rendered a", "rendered b"]
    assert seen["rendered"] == ["a", "b"]
