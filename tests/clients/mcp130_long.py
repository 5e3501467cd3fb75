"""The Python SDK `mcp==1.30.0` (its own environment) calling one slow tool as a 2025-11-25
core task with a short ttl, as its users do (the SDK asks 60 s by default, whatever the
tool), polling to the end; prints the ttl asked and granted, the statuses seen, and the
result or the error. Usage: python mcp130_long.py URL TOOL ARGS_JSON TTL_MS"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError


async def run(session: ClientSession, tool: str, args: dict[str, Any], ttl: int
              ) -> dict[str, Any]:
    await session.initialize()
    tasks = session.experimental
    created = await tasks.call_tool_as_task(tool, args, ttl=ttl)
    out: dict[str, Any] = {"asked": ttl, "granted": created.task.ttl, "statuses": []}
    try:
        async for status in tasks.poll_task(created.task.taskId):
            out["statuses"].append(status.status)
            out["ttl"] = status.ttl  # every answer reports the actual ttl
        done = await tasks.get_task_result(created.task.taskId, types.CallToolResult)
        out["text"] = "\n".join(c.text for c in done.content if isinstance(c, types.TextContent))
    except McpError as exc:
        out["error"] = exc.error.message
    return out


async def main(url: str, tool: str, args: str, ttl: str) -> None:
    async with streamable_http_client(url) as (read, write, _), \
            ClientSession(read, write) as session:
        print(json.dumps(await run(session, tool, json.loads(args), int(ttl))))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
