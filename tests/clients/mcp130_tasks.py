"""The Python SDK `mcp==1.30.0` (its own environment: its version clashes with ours) using the
experimental tasks API of protocol 2025-11-25 through an MCP endpoint; prints what a user
would see as one JSON transcript. Usage: python mcp130_tasks.py URL"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError

RELATED = "io.modelcontextprotocol/related-task"
out: dict[str, Any] = {"asked": []}


async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    meta = params.meta.model_dump(by_alias=True) if params.meta else {}
    out["asked"].append([params.message, (meta.get(RELATED) or {}).get("taskId")])
    return types.ElicitResult(action="accept", content={"name": "Grace"})


def text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def error_of(coro: Any) -> int | None:
    try:
        await coro
    except McpError as exc:
        return exc.error.code
    return None


async def run(session: ClientSession) -> None:
    tasks = session.experimental
    init = await session.initialize()
    out["capabilities"] = init.capabilities.tasks.model_dump(exclude_none=True)
    out["support"] = {t.name: t.execution.taskSupport if t.execution else None
                      for t in (await session.list_tools()).tools}
    created = await tasks.call_tool_as_task("sleep", {"ms": 300}, ttl=30_000)
    out["created"] = [created.task.status, created.task.ttl]
    out["polled"] = [s.status async for s in tasks.poll_task(created.task.taskId)][-1]
    done = await tasks.get_task_result(created.task.taskId, types.CallToolResult)
    out["result"] = [text(done), (done.meta or {}).get(RELATED, {}).get("taskId") ==
                     created.task.taskId]
    asking = await tasks.call_tool_as_task("ask", {"message": "Who?"})
    async for status in tasks.poll_task(asking.task.taskId):
        if status.status == "input_required":  # its request may come on tasks/result's stream
            break
    out["answered"] = json.loads(text(await tasks.get_task_result(
        asking.task.taskId, types.CallToolResult)))["content"]
    long = await tasks.call_tool_as_task("sleep", {"ms": 5000})
    out["cancelled"] = (await tasks.cancel_task(long.task.taskId)).status
    out["cancel_again"] = await error_of(tasks.cancel_task(long.task.taskId))
    out["cancel_done"] = await error_of(tasks.cancel_task(created.task.taskId))
    out["unknown"] = await error_of(tasks.get_task("no-such-task"))
    for _ in range(50):
        await tasks.call_tool_as_task("sleep", {"ms": 0})
    pages, cursor = [], None
    while True:
        page = await tasks.list_tasks(cursor)
        pages.append(len(page.tasks))
        if not (cursor := page.nextCursor):
            break
    out["pages"] = pages


async def main(url: str) -> None:
    async with streamable_http_client(url) as (read, write, _), \
            ClientSession(read, write, elicitation_callback=elicit) as session:
        await run(session)
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
