#!/usr/bin/env python3
"""The thinnest stdio bridge this stack allows, to measure the gateway against: one aiohttp
handler that rewrites a request's id, writes the line to one stdio server, and answers with
the server's line, its id put back. No sessions, auth, tasks, limits, logs or metrics; a
session id is handed out only because clients expect one. With `--null` there is no server
at all: the bridge answers `echo`, `blob` and `sleep` itself (what HTTP alone costs).

    python bench/thin_bridge.py --port 9109 -- python3 upstream.py
    python bench/thin_bridge.py --port 9110 --null

Used by bench/README.md's "ceiling" tables (peerbench peers `thin` and `null-aiohttp`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from typing import Any

import orjson
from aiohttp import web

SESSION = {"Mcp-Session-Id": "thin"}
JSON = "application/json"
TOOLS = ("echo", "blob", "sleep")


class Bridge:
    """One stdio server; requests' ids replaced by the bridge's, answers matched back."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}

    async def read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            msg = orjson.loads(line)
            fut = self.waiting.pop(msg.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)

    async def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        own, theirs = next(self.ids), msg["id"]
        fut = self.waiting[own] = asyncio.get_running_loop().create_future()
        self.proc.stdin.write(orjson.dumps({**msg, "id": own}) + b"\n")
        answer = await fut
        answer["id"] = theirs
        return answer

    def tell(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(orjson.dumps(msg) + b"\n")


def null_answer(msg: dict[str, Any]) -> dict[str, Any]:
    """What upstream.py would answer, made here (the `--null` bridge)."""
    if msg["method"] == "initialize":
        result: dict[str, Any] = {"protocolVersion": msg["params"]["protocolVersion"],
                                  "capabilities": {"tools": {}},
                                  "serverInfo": {"name": "null", "version": "1"}}
    elif msg["method"] == "tools/list":
        result = {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in TOOLS]}
    else:
        args = msg["params"]["arguments"]
        text = {"echo": lambda: args["text"], "blob": lambda: "b" * args["bytes"],
                "sleep": lambda: f"slept {args['ms']}"}[msg["params"]["name"]]()
        result = {"content": [{"type": "text", "text": text}], "isError": False}
    return {"jsonrpc": "2.0", "id": msg["id"], "result": result}


def app(bridge: Bridge | None) -> web.Application:
    async def post(request: web.Request) -> web.Response:
        msg = orjson.loads(await request.read())
        if "id" not in msg:
            if bridge is not None:
                bridge.tell(msg)
            return web.Response(status=202, headers=SESSION)
        if bridge is None:
            if msg.get("method") == "tools/call" and msg["params"]["name"] == "sleep":
                await asyncio.sleep(msg["params"]["arguments"]["ms"] / 1000)
            answer = null_answer(msg)
        else:
            answer = await bridge.call(msg)
        return web.Response(body=orjson.dumps(answer), content_type=JSON, headers=SESSION)

    application = web.Application(client_max_size=64 << 20)
    application.router.add_post("/mcp", post)
    return application


async def serve(port: int, command: list[str]) -> None:
    bridge = None
    if command:
        proc = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=64 << 20)
        bridge = Bridge(proc)
        reader = asyncio.create_task(bridge.read())
    runner = web.AppRunner(app(bridge), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        await asyncio.Event().wait()
    finally:
        if bridge is not None:
            reader.cancel()
            bridge.proc.kill()
        await runner.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=9109)
    ap.add_argument("--null", action="store_true", help="no server: answer here")
    ap.add_argument("command", nargs="*", help="the stdio server (after --)")
    args = ap.parse_args()
    if not args.null and not args.command:
        ap.error("a server command after --, or --null")
    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(serve(args.port, [] if args.null else args.command))


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop where installed, as the gateway runs: like is compared with like."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


if __name__ == "__main__":
    main()
