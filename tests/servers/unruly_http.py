#!/usr/bin/env python3
"""A Streamable HTTP server that gets the wire wrong in the ways seen in the field, for the
gateway's tests (issue 31). Standard aiohttp, no SDK.

Usage: unruly_http.py PORT [legacy|modern|forgetful|forgetting|closing]
- legacy: initialize gives a session. Tools: two_lines (an application/json answer of two
  JSON lines: a log notification, then the response), garbage (an application/json answer
  that is no JSON at all), pretty (its response pretty-printed over many lines, streamed
  without a length, a line a chunk), hang (never answers), closed (an SSE answer that
  primes an event id, with `retry: 10`, and ends before the answer), dropped (the same,
  but its connection is cut mid-stream), unprimed (an SSE answer that ends before the
  answer without any event id), big (arguments mib, and how: "json" with a length,
  "chunked" JSON, or "sse"): an answer of that many MiB of text, written a MiB at a time,
  its last bytes after hold_s seconds if given (an answer read in part meanwhile);
  how "gzip400": a 400 whose gzip body is small on the wire and that many MiB inflated;
  slow (answers after `s` seconds, 0.5 by default), drip (an SSE answer: a log line, after
  `s` seconds a log line and an elicitation carrying `text`, after `s` more the answer).
- modern: 2026-07-28 only (initialize is 404 -32601): server/discover, tools/list, and
  subscriptions/listen answered as chunked application/json, a message a line, held open;
  the tool change sends tools list_changed to every listener.
- forgetful: legacy, but GET /mcp answers every session "400: no such session" at once.
- forgetting: legacy, each initialize a session of its own ("s-1", "s-2", ...) whose GET
  /mcp stream stays open; POST /forget forgets them: their GET streams end 0.2 s later, a
  GET of a forgotten session is 404 at once, and a POST of one 404 only half a second
  later (`POST /forget?get_s=S&post_s=S` sets both delays). Tool slow answers "slow" after
  half a second. Tool task (taskSupport required) makes a task of its session, ids t1, t2...
  a session, answered by tasks/result on that session; given `forget`, the sessions are
  forgotten as it is made (a POST's 404 at once); given `hold`, its tasks/result is answered
  30 s late. Tool asking_task (taskSupport optional,
  called as a task): its CreateTaskResult on an SSE stream, then on that stream an
  elicitation naming the task (related-task _meta), whose answer is the task's result.
  GET /asked: the tasks/* requests a live session heard, with their session; GET /answers:
  the answers to the server's requests it received.
- closing: legacy, but every GET /mcp (the session's stream, or a resume with Last-Event-ID)
  is an SSE stream that ends at once with nothing new (a `retry: 10` only).
Others: GET /mcp is 400 with a body that does not speak of any session, as some servers
answer a GET they do not serve; GET /gets tells how many GETs /mcp had (`gets`), and how
many of them carried a Last-Event-ID (`resumes`); GET /calls the tools called, in order.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import sys

from aiohttp import web

MODE = sys.argv[2] if len(sys.argv) > 2 else "legacy"
VERSION = "2026-07-28"
gets = resumes = 0
listeners: list[asyncio.Queue[dict]] = []
given = 0  # sessions given (forgetting: each initialize a new one)
live: set[str] = set()  # of "forgetting": the sessions not forgotten
forgot = asyncio.Event()  # of "forgetting": set when its sessions are forgotten
delays = {"get_s": 0.2, "post_s": 0.5}  # of "forgetting": see /forget
tasks: dict[str, dict[str, str]] = {}  # of "forgetting": a session's tasks, by id
asked: list[dict] = []  # of "forgetting": the tasks/* requests heard
holding: set[str] = set()  # of "forgetting": the tasks whose tasks/result waits
called: list[str] = []  # the tools called (legacy), in order
answers: list[dict] = []  # the answers to the server's own requests
waiting: dict[str, asyncio.Future[dict]] = {}  # of the server's requests, by id


def line(msg: dict) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def result(rid: object, value: dict) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "result": value}


def tools(*names: str) -> dict:
    return {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in names]}


def text(s: str) -> dict:
    return {"content": [{"type": "text", "text": s}]}


async def big(request: web.Request, rid: object, args: dict) -> web.StreamResponse:
    """An answer of args["mib"] MiB, written a MiB at a time (never held whole here)."""
    head = json.dumps(result(rid, text("@")), separators=(",", ":")).encode()
    before, after = head.split(b"@")
    mib, how = int(args["mib"]), args.get("how", "json")
    if how == "gzip400":
        return web.Response(status=400, body=gzip.compress(before + b"x" * (mib << 20) + after, 1),
                            headers={"Content-Type": "application/json",
                                     "Content-Encoding": "gzip"})
    if how == "sse":
        before, after = b"data: " + before, after + b"\n\n"
    resp = web.StreamResponse(headers={
        "Content-Type": "text/event-stream" if how == "sse" else "application/json"})
    if how == "json":
        resp.content_length = len(before) + (mib << 20) + len(after)
    else:
        resp.enable_chunked_encoding()
    await resp.prepare(request)
    try:
        await resp.write(before)
        for _ in range(mib):
            await resp.write(b"x" * (1 << 20))
        if args.get("hold_s"):  # the last bytes wait: the answer is read in part meanwhile
            await asyncio.sleep(float(args["hold_s"]))
        await resp.write(after)
        await resp.write_eof()
    except ConnectionError:
        pass  # the client stopped reading
    return resp


async def legacy_call(request: web.Request, rid: object, name: str, args: dict
                      ) -> web.StreamResponse:
    if name == "big":
        return await big(request, rid, args)
    if name == "two_lines":
        note = {"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"level": "info", "data": "before the answer"}}
        return web.Response(body=line(note) + line(result(rid, text("two lines"))),
                            content_type="application/json")
    if name == "garbage":
        return web.Response(body=b"<html>oops</html>\n", content_type="application/json")
    if name == "hang":
        await asyncio.Event().wait()
    if name == "slow":
        await asyncio.sleep(float(args.get("s", 0.5)))
        return web.json_response(result(rid, text("slow")))
    if name == "drip":
        return await drip(request, rid, args)
    if name == "dropped":
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"id: d-1\nretry: 10\ndata: \n\n")
        assert request.transport is not None
        request.transport.close()  # no last chunk: the client reads a broken body
        return resp
    if name in ("closed", "unprimed"):
        return await ended_early(request, b"id: c-1\nretry: 10\ndata: \n\n" if name == "closed"
                                 else b": an SSE comment, no event\n\n")
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    for part in json.dumps(result(rid, text("pretty")), indent=2).splitlines(keepends=True):
        await resp.write(part.encode())
    await resp.write_eof()
    return resp


async def drip(request: web.Request, rid: object, args: dict) -> web.StreamResponse:
    """An SSE answer: a log line, then after `s` seconds a log line and an elicitation
    that both carry `text`, then after `s` more the answer."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    said = args.get("text", "")

    async def send(msg: dict) -> None:
        await resp.write(b"event: message\ndata: " + json.dumps(msg).encode() + b"\n\n")

    def log(data: str) -> dict:
        return {"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"level": "error", "data": data}}

    await send(log("drip-start"))
    await asyncio.sleep(float(args.get("s", 1)))
    await send(log(said))
    await send({"jsonrpc": "2.0", "id": f"drip-{rid}", "method": "elicitation/create",
                "params": {"message": "password for " + said,
                           "requestedSchema": {"type": "object", "properties": {}}}})
    await asyncio.sleep(float(args.get("s", 1)))
    await send(result(rid, text("dripped")))
    return resp


async def ended_early(request: web.Request, first: bytes) -> web.StreamResponse:
    """An SSE stream that sends `first` and ends, with no answer."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(first)
    await resp.write_eof()
    return resp


async def legacy(request: web.Request, msg: dict) -> web.StreamResponse:
    method, rid = msg.get("method"), msg.get("id")
    if method == "initialize":
        init = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {
            "tools": {}}, "serverInfo": {"name": "unruly", "version": "1"}}
        sid = "s-1"
        if MODE == "forgetting":
            global given
            given += 1
            sid = f"s-{given}"
            live.add(sid)
            tasks[sid] = {}
            init["capabilities"]["tasks"] = {"requests": {"tools": {"call": {}}}}
        return web.json_response(result(rid, init), headers={"Mcp-Session-Id": sid})
    if rid is None:
        return web.Response(status=202)
    if method == "tools/list":
        listed = tools("two_lines", "garbage", "pretty", "hang", "closed", "dropped",
                       "unprimed", "big", "slow", "drip")
        if MODE == "forgetting":
            listed["tools"] += [{"name": "task", "inputSchema": {"type": "object"},
                                 "execution": {"taskSupport": "required"}},
                                {"name": "asking_task", "inputSchema": {"type": "object"},
                                 "execution": {"taskSupport": "optional"}}]
        return web.json_response(result(rid, listed))
    if MODE == "forgetting" and msg.get("params", {}).get("name") == "asking_task":
        return await asking_task(request, msg)
    if MODE == "forgetting" and (method.startswith("tasks/") or "task" in msg.get("params", {})):
        return await session_task(request, msg)
    if method == "tools/call":
        params = msg["params"]
        called.append(params["name"])
        return await legacy_call(request, rid, params["name"], params.get("arguments") or {})
    return web.json_response(result(rid, {}))


async def listen(request: web.Request, rid: object) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    await resp.write(line({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                           "params": {"_meta": {"io.modelcontextprotocol/subscriptionId": "1"}}}))
    queue: asyncio.Queue[dict] = asyncio.Queue()
    listeners.append(queue)
    try:
        while True:
            await resp.write(line(await queue.get()))
    finally:
        listeners.remove(queue)


async def modern(request: web.Request, msg: dict) -> web.StreamResponse:
    method, rid = msg.get("method"), msg.get("id")
    if method == "server/discover":
        return web.json_response(result(rid, {
            "supportedVersions": [VERSION], "capabilities": {"tools": {"listChanged": True}},
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "unruly-modern",
                                                             "version": "1"}}}))
    if method == "tools/list":
        return web.json_response(result(rid, tools("change")))
    if method == "subscriptions/listen":
        return await listen(request, rid)
    if method == "tools/call":
        for queue in listeners:
            queue.put_nowait({"jsonrpc": "2.0", "method": "notifications/tools/list_changed",
                              "params": {"_meta": {
                                  "io.modelcontextprotocol/subscriptionId": "1"}}})
        return web.json_response(result(rid, text("changed")))
    return web.json_response({"jsonrpc": "2.0", "id": rid, "error": {
        "code": -32601, "message": f"Method not found: {method}"}}, status=404)


async def post(request: web.Request) -> web.StreamResponse:
    msg = await request.json()
    if "method" not in msg:  # an answer to one of the server's requests
        answers.append(msg)
        if (asking := waiting.pop(str(msg.get("id")), None)) is not None:
            asking.set_result(msg)
        return web.Response(status=202)
    if MODE == "forgetting" and msg.get("method") != "initialize" and not current(request):
        await asyncio.sleep(delays["post_s"])  # the slow path: the GET stream learns first
        return forgotten()
    return await (modern if MODE == "modern" else legacy)(request, msg)


async def session_task(request: web.Request, msg: dict) -> web.Response:
    """forgetting: a task made by tools/call (its id its session's own), or tasks/*: a
    task made with `hold` has its tasks/result answered 30 s late."""
    sid, rid, params = request.headers.get("Mcp-Session-Id", ""), msg["id"], msg["params"]
    if msg["method"] != "tools/call":
        asked.append({"method": msg["method"], "session": sid, "taskId": params.get("taskId")})
        if params.get("taskId") in holding and msg["method"] == "tasks/result":
            await asyncio.sleep(30)
        answer = tasks[sid].get(params.get("taskId"))
        if not answer:  # unknown, or not done
            return web.json_response({"jsonrpc": "2.0", "id": rid, "error": {
                "code": -32602, "message": f"no task {params.get('taskId')}"}})
        return web.json_response(result(rid, text(answer)))
    args = params.get("arguments") or {}
    task_id = f"t{len(tasks[sid]) + 1}"
    tasks[sid][task_id] = f"the task of {args.get('who')}"
    if args.get("hold"):
        holding.add(task_id)
    if args.get("forget"):
        forget_all(get_s=5, post_s=0)
    return web.json_response(result(rid, {"task": {
        "taskId": task_id, "status": "completed", "createdAt": "2026-01-01T00:00:00Z",
        "lastUpdatedAt": "2026-01-01T00:00:00Z", "ttl": 60000}}))


async def asking_task(request: web.Request, msg: dict) -> web.StreamResponse:
    """forgetting: a task whose input is asked on its call's stream once the call ended."""
    sid = request.headers.get("Mcp-Session-Id", "")
    task_id = f"t{len(tasks[sid]) + 1}"
    tasks[sid][task_id] = ""  # not done
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)

    async def send(message: dict) -> None:
        await resp.write(b"event: message\ndata: " + json.dumps(message).encode() + b"\n\n")

    await send(result(msg["id"], {"task": {
        "taskId": task_id, "status": "working", "createdAt": "2026-01-01T00:00:00Z",
        "lastUpdatedAt": "2026-01-01T00:00:00Z", "ttl": 60000}}))
    asking = waiting[f"ask-{task_id}"] = asyncio.get_running_loop().create_future()
    await send({"jsonrpc": "2.0", "id": f"ask-{task_id}", "method": "elicitation/create",
                "params": {"message": "Name?", "requestedSchema": {"type": "object"},
                           "_meta": {"io.modelcontextprotocol/related-task": {
                               "taskId": task_id}}}})
    answer = await asyncio.wait_for(asking, 10)
    tasks[sid][task_id] = json.dumps(answer.get("result") or answer.get("error"))
    await resp.write_eof()
    return resp


def current(request: web.Request) -> bool:
    return request.headers.get("Mcp-Session-Id") in live


def forgotten() -> web.Response:
    return web.json_response({"jsonrpc": "2.0", "id": None, "error": {
        "code": -32001, "message": "Session not found"}}, status=404)


async def forget(request: web.Request) -> web.Response:
    forget_all(**{k: float(request.query.get(k, v)) for k, v in (("get_s", 0.2),
                                                                 ("post_s", 0.5))})
    return web.Response(status=204)


def forget_all(get_s: float, post_s: float) -> None:
    global forgot
    delays.update(get_s=get_s, post_s=post_s)
    live.clear()
    forgot.set()  # their GET streams end (get_s later)
    forgot = asyncio.Event()


async def heard(request: web.Request) -> web.Response:
    return web.json_response(asked)


async def calls(request: web.Request) -> web.Response:
    return web.json_response(called)


async def answered(request: web.Request) -> web.Response:
    return web.json_response(answers)


async def held(request: web.Request) -> web.StreamResponse:
    """The current session's GET stream, open until its session is forgotten (get_s after)."""
    if not current(request):
        return forgotten()
    ends = forgot
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b"retry: 10\n\n")
    await ends.wait()
    await asyncio.sleep(delays["get_s"])
    await resp.write_eof()
    return resp


async def get(request: web.Request) -> web.StreamResponse:
    global gets, resumes
    gets += 1
    resumes += "Last-Event-ID" in request.headers
    if MODE == "closing":
        return await ended_early(request, b"retry: 10\n\n")
    if MODE == "forgetting":
        return await held(request)
    said = "No valid session ID provided" if MODE == "forgetful" else "GET is not served here"
    return web.json_response({"jsonrpc": "2.0", "id": None, "error": {
        "code": -32000, "message": f"Bad Request: {said}"}}, status=400)


async def count(request: web.Request) -> web.Response:
    return web.json_response({"gets": gets, "resumes": resumes})


app = web.Application()
app.router.add_post("/mcp", post)
app.router.add_get("/mcp", get)
app.router.add_get("/gets", count)
app.router.add_post("/forget", forget)
app.router.add_get("/asked", heard)
app.router.add_get("/calls", calls)
app.router.add_get("/answers", answered)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
