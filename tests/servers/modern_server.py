#!/usr/bin/env python3
"""A server that speaks only the modern revision (2026-07-28), written with the official
Python SDK (`mcp` 2.x), which serves that revision statelessly: `initialize` is refused with
-32022 naming the versions it serves (spec 2026-07-28 versioning, as a modern-only server
SHOULD), so the gateway must drive it as a modern client.

Tools: echo, greet (asks for a name with an `input_required` round, then greets),
slow (sleeps `ms`), log (at info), change and touch (list_changed and resources/updated on listen
streams), queued (answered with a task of the server's own: it serves the tasks
extension's tasks/get for it).
Usage: modern_server.py [stdio] | http PORT
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import Context, MCPServer

VERSION = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
STAMP = "2026-11-22T00:00:00.000Z"


def own_task(status: str) -> dict[str, Any]:
    """The one task this server makes of its own: `queued` answers with it."""
    return {"taskId": "server-task-1", "status": status, "createdAt": STAMP,
            "lastUpdatedAt": STAMP, "ttlMs": 60000, "pollIntervalMs": 100}


class OwnTasks(Extension):
    """The tasks extension, served by this server itself for its `queued` tool."""

    identifier = TASKS

    def methods(self) -> list[MethodBinding]:
        async def get(ctx: Any, params: Any) -> dict[str, Any]:
            return {**own_task("completed"), "result": {
                "content": [{"type": "text", "text": "done by the server's own task"}]}}
        return [MethodBinding("tasks/get", types.RequestParams, get)]

    async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
        if params.name == "queued":
            return {"resultType": "task", **own_task("working")}
        return await call_next(ctx)


server = MCPServer("modern-only-test-server", version="1.0.0", extensions=[OwnTasks()])


@server.tool(description="Echoes its text")
def echo(text: str) -> str:
    return text


@server.tool(description="Asks the client for a name (MRTR), then greets")
def greet(ctx: Context) -> Any:
    answer = (ctx.input_responses or {}).get("name")
    if answer is None:
        return types.InputRequiredResult(
            input_requests={"name": types.ElicitRequest(params=types.ElicitRequestFormParams(
                message="Your name?", requested_schema={
                    "type": "object", "properties": {"name": {"type": "string"}}}))},
            request_state="asked-once")
    content = getattr(answer, "content", None) or {}
    return f"Hello, {content.get('name')} (state {ctx.request_state})"


@server.tool(description="Answered by the server's own task (tasks extension)")
def queued() -> str:
    return "never reached: the extension answers"


@server.tool(description="Tells listeners the tool list changed")
async def change(ctx: Context) -> str:
    await ctx.notify_tools_changed()
    return "changed"


@server.tool(description="Tells listeners the resource at uri was updated")
async def touch(uri: str, ctx: Context) -> str:
    await ctx.notify_resource_updated(uri)
    return "touched"


@server.tool(description="Logs its text at info level")
async def log(text: str, ctx: Context) -> str:
    await ctx.info(text)
    return "logged"


@server.tool(description="Sleeps for ms milliseconds")
async def slow(ms: int) -> str:
    await asyncio.sleep(ms / 1000)
    return f"slept {ms}"


def refusal(id_: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": {
        "code": -32022, "message": f"This server speaks only protocol {VERSION}",
        "data": {"supported": [VERSION], "requested": None}}}


def modern(msg: Any) -> bool:
    meta = ((msg.get("params") or {}).get("_meta") or {}) if isinstance(msg, dict) else {}
    return msg.get("method") != "initialize" and "io.modelcontextprotocol/protocolVersion" in meta


class ModernOnly:
    """ASGI: only modern POSTs reach the SDK; anything else is refused as the spec says."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["method"] != "POST":
            return await self._reply(send, 405, b"")
        body, more = b"", True
        while more:
            event = await receive()
            body += event.get("body", b"")
            more = event.get("more_body", False)
        msg = json.loads(body or b"{}")
        if not modern(msg):
            return await self._reply(send, 400, json.dumps(refusal(msg.get("id"))).encode())

        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def replay() -> dict[str, Any]:  # the body once, then the real channel
            return pending.pop() if pending else await receive()
        await self.app(scope, replay, send)

    @staticmethod
    async def _reply(send: Any, status: int, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


def refuse_initialize_on_stdio() -> None:
    """stdio: the SDK serves whichever era the first request opens, so `initialize` is
    answered here (refused) and never reaches it; everything else is piped through."""
    real_stdin = os.fdopen(os.dup(0), "rb")
    # The SDK diverts fd 1 to stderr once it runs (its stdio.py, issue #1933), so the refusal
    # goes to a copy of the wire taken now: written to fd 1 it raced the divert and, late,
    # reached the gateway's stderr reader, and the gateway waited for an answer that never came.
    wire = os.dup(1)
    read_end, write_end = os.pipe()
    os.dup2(read_end, 0)
    os.close(read_end)

    def gate() -> None:
        with os.fdopen(write_end, "wb", buffering=0) as sdk:
            for line in real_stdin:
                msg = json.loads(line) if line.strip() else {}
                if isinstance(msg, dict) and msg.get("method") == "initialize":
                    os.write(wire, json.dumps(refusal(msg.get("id"))).encode() + b"\n")
                else:
                    sdk.write(line)

    threading.Thread(target=gate, daemon=True).start()


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        uvicorn.run(ModernOnly(server.streamable_http_app()), host="127.0.0.1",
                    port=int(sys.argv[2]), log_level="warning",
                    timeout_graceful_shutdown=2)  # open streams: don't wait on them
    else:
        refuse_initialize_on_stdio()
        server.run("stdio")
