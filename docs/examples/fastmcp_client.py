"""A task-capable Python client: FastMCP with fastmcp-tasks, against the gateway's default
configuration (server-everything behind it). Run:
    pip install "fastmcp==4.1.2" "fastmcp-tasks==4.1.2"
    python docs/examples/fastmcp_client.py http://127.0.0.1:8080/mcp
With fastmcp-tasks installed the client declares the tasks extension by itself.
"""

import asyncio
import sys

from fastmcp import Client
from fastmcp_tasks.client import call_tool_task

TOOL = "trigger-long-running-operation"


async def main(url: str) -> None:
    async with Client(url) as client:
        # Transparent: a call that becomes a task is polled to its result for you.
        result = await client.call_tool(TOOL, {"duration": 3, "steps": 3})
        print("call_tool:", result.content[0].text)

        # Explicit: a handle on the task, to look at, wait for, or cancel.
        task = await call_tool_task(client, TOOL, {"duration": 2, "steps": 2})
        print("task:", task.task_id, task.create_result.status)
        print("ended:", (await task.wait(timeout=60)).status)
        print("result:", (await task.result()).content[0].text)

        # Cancelled while it runs: the server is told, and the task ends "cancelled".
        slow = await call_tool_task(client, TOOL, {"duration": 30, "steps": 3})
        await slow.cancel()
        print("cancelled:", (await slow.wait(timeout=10)).status)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/mcp"))
