"""The Python SDK `mcp==1.30.0`'s experimental tasks API (protocol 2025-11-25) against a tool
that runs one call at a time behind the gateway's queue: three tasks at once, the third
cancelled while it waits; prints what a user would see as one JSON transcript.
Usage: python mcp130_queue.py URL"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client


def text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def run(session: ClientSession) -> dict[str, Any]:
    tasks = session.experimental
    await session.initialize()
    created = [await tasks.call_tool_as_task("render", {"text": t, "ms": 400}) for t in "abc"]
    ids = [c.task.taskId for c in created]
    out: dict[str, Any] = {"created": [c.task.statusMessage for c in created]}
    out["cancelled"] = (await tasks.cancel_task(ids[2])).status
    out["results"] = [text(await tasks.get_task_result(i, types.CallToolResult))
                      for i in ids[:2]]
    out["rendered"] = json.loads(text(await session.call_tool("rendered", {})))
    return out


async def main(url: str) -> None:
    async with streamable_http_client(url) as (read, write, _), \
            ClientSession(read, write) as session:
        print(json.dumps(await run(session)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
