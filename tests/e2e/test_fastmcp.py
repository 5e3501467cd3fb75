"""A real task-capable client: FastMCP 4.1.2 with fastmcp-tasks 4.1.2, through the gateway in
front of the plain stdio test server. Its transparent `call_tool` drives tasks to their
result; `call_tool_task` hands back a task to drive (status, wait, result, cancel); an
elicitation inside a task is answered by the client's handler through tasks/update."""

from __future__ import annotations

import json
from typing import Any

from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult
from fastmcp_tasks.client import call_tool_task

POLICY = {"defaults": {"mode": "auto", "sync_budget_ms": 200, "poll_interval_ms": 100},
          "tools": {"ask": {"mode": "always"}}}


async def answer(message: str, response_type: Any, params: Any, context: Any) -> ElicitResult:
    return ElicitResult(action="accept", content={"name": f"Ada, asked {message!r}"})


async def test_fastmcp_drives_gateway_tasks(gateway) -> None:
    url = await gateway(tasks=POLICY)
    async with Client(url, elicitation_handler=answer) as client:
        quick = await client.call_tool("echo", {"text": "inline"})  # done within budget
        assert quick.content[0].text == "inline"
        tasked = await client.call_tool("sleep", {"ms": 600})  # over budget: a task, polled
        assert tasked.content[0].text == "slept 600"

        handle = await call_tool_task(client, "sleep", {"ms": 700})
        assert handle.task_id and handle.create_result.status == "working"
        assert (await handle.status()).status in ("working", "completed")
        assert (await handle.wait(timeout=10)).status == "completed"
        assert (await handle.result()).content[0].text == "slept 700"

        doomed = await call_tool_task(client, "sleep", {"ms": 10_000})
        await doomed.cancel()
        assert (await doomed.wait(timeout=10)).status == "cancelled"

        asked = await client.call_tool("ask", {"message": "Name?"})  # input inside a task
        reply = json.loads(asked.content[0].text)
        assert reply == {"action": "accept", "content": {"name": "Ada, asked 'Name?'"}}
