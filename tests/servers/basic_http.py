#!/usr/bin/env python3
"""basic.py served over HTTP, for the gateway's HTTP-upstream tests: every client session is
its own basic.py process.

Usage: basic_http.py PORT [streamable|sse|polling]
- streamable: Streamable HTTP. A POSTed request is answered with JSON; everything the server
  sends by itself (its requests, progress, logs) goes on the session's GET stream, never on
  the POST, so the gateway must read that stream.
- sse: the HTTP+SSE transport of 2024-11-05. GET /mcp opens the stream, whose first event
  names the endpoint to POST to; every answer comes on the stream; POST /mcp answers 405.
- polling: Streamable HTTP where a request's SSE answer closes after one event that only
  primes its id (spec: SSE polling); the response comes to a GET with that Last-Event-ID.
GET /seen returns the headers of the last POST, so tests can see what the gateway forwarded.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from pathlib import Path

from aiohttp import web

BASIC = str(Path(__file__).with_name("basic.py"))


class Session:
    def __init__(self, proc: asyncio.subprocess.Process, answers_inline: bool) -> None:
        self.proc = proc
        self.answers_inline = answers_inline  # streamable: responses go back on the POST
        self.pending: dict[object, asyncio.Future[bytes]] = {}
        self.stream: asyncio.Queue[bytes] = asyncio.Queue()
        self.later: dict[str, asyncio.Future[bytes | None]] = {}  # polling: answers by stream
        self.started = False  # polling: initialize is answered at once
        self.reader = asyncio.create_task(self.pump())

    @classmethod
    async def start(cls, answers_inline: bool) -> Session:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, BASIC, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, limit=1 << 30)
        return cls(proc, answers_inline)

    async def pump(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            msg = json.loads(line)
            fut = self.pending.pop(msg.get("id"), None) if "method" not in msg else None
            if fut is not None:
                fut.set_result(line.strip())
            else:
                await self.stream.put(line.strip())

    async def send(self, body: bytes) -> bytes | None:
        """Send one message; for a request answered inline, wait for its response."""
        msg = json.loads(body)
        fut = None
        if self.answers_inline and "method" in msg and "id" in msg:
            fut = self.pending[msg["id"]] = asyncio.get_running_loop().create_future()
        assert self.proc.stdin is not None
        self.proc.stdin.write(body.strip() + b"\n")
        return await fut if fut is not None else None

    def close(self) -> None:
        self.reader.cancel()
        if self.proc.returncode is None:
            self.proc.kill()


sessions: dict[str, Session] = {}
seen: dict[str, str] = {}


async def post(request: web.Request) -> web.StreamResponse:
    seen.clear()
    seen.update(request.headers)
    if request.app["mode"] == "sse":
        return web.Response(status=405)
    body = await request.read()
    sid = request.headers.get("Mcp-Session-Id")
    if sid is None:
        if json.loads(body).get("method") != "initialize":
            return web.Response(status=400)
        sid = secrets.token_hex(8)
        sessions[sid] = await Session.start(answers_inline=True)
    session = sessions.get(sid)
    if session is None:
        return web.Response(status=404)
    if request.app["mode"] == "polling" and "id" in json.loads(body) and session.started:
        return await prime(request, session, body)
    session.started = True
    answer = await session.send(body)
    if answer is None:
        return web.Response(status=202)
    return web.Response(body=answer, content_type="application/json",
                        headers={"Mcp-Session-Id": sid})


async def prime(request: web.Request, session: Session, body: bytes) -> web.StreamResponse:
    """Answer later: the POST's stream gives an event id and closes at once."""
    key = f"p{len(session.later)}"
    session.later[key] = asyncio.ensure_future(session.send(body))
    resp = await open_stream(request)
    await resp.write(f"id: {key}-0\nretry: 50\ndata: \n\n".encode())
    return resp


async def get(request: web.Request) -> web.StreamResponse:
    resumed = request.headers.get("Last-Event-ID", "").removesuffix("-0")
    found = sessions.get(request.headers.get("Mcp-Session-Id", ""))
    if found is not None and resumed in found.later:
        resp = await open_stream(request)
        answer = await found.later.pop(resumed)
        await resp.write(f"id: {resumed}-1\ndata: ".encode() + (answer or b"") + b"\n\n")
        return resp
    if request.app["mode"] == "sse":
        sid = secrets.token_hex(8)
        sessions[sid] = session = await Session.start(answers_inline=False)
        resp = await open_stream(request)
        await resp.write(f"event: endpoint\ndata: /messages?session={sid}\n\n".encode())
    else:
        found = sessions.get(request.headers.get("Mcp-Session-Id", ""))
        if found is None:
            return web.Response(status=404)
        session, resp = found, await open_stream(request)
    while True:
        await resp.write(b"event: message\ndata: " + await session.stream.get() + b"\n\n")


async def messages(request: web.Request) -> web.StreamResponse:
    seen.clear()
    seen.update(request.headers)
    session = sessions.get(request.query.get("session", ""))
    if session is None:
        return web.Response(status=404)
    await session.send(await request.read())
    return web.Response(status=202, text="Accepted")


async def delete(request: web.Request) -> web.StreamResponse:
    session = sessions.pop(request.headers.get("Mcp-Session-Id", ""), None)
    if session is not None:
        session.close()
    return web.Response(status=200 if session else 404)


async def open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp


async def show_seen(_: web.Request) -> web.Response:
    return web.json_response(seen)


def main() -> None:
    app = web.Application()
    app["mode"] = sys.argv[2] if len(sys.argv) > 2 else "streamable"
    app.router.add_post("/mcp", post)
    app.router.add_get("/mcp", get)
    app.router.add_delete("/mcp", delete)
    app.router.add_post("/messages", messages)
    app.router.add_get("/seen", show_seen)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)


if __name__ == "__main__":
    main()
