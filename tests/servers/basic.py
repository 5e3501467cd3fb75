#!/usr/bin/env python3
"""A small legacy stdio MCP server, standard library only, for the gateway's tests.

Tools: echo, sleep, blob, crash (exits mid-call), hang (never answers), ask (elicitation),
sample (sampling), roots (roots/list), progress, log (at `level`, info by default), late
(answers, then logs a line and says its tools changed: messages of no call), changed (tools
list_changed, and a tool "added" appears),
touch (resources/updated), whoami (pid), environ (its environment variables), cancelled
(request ids it was told to cancel),
params (the params it received), ask2 (two elicitations at once), subscribed (the resource
URIs it was asked to watch), meta (the _meta it received), render (one call at a time,
like a licence-bound renderer: a second call while one runs fails "busy"), rendered (the
texts render was called with, in order of arrival), fail (answers the JSON-RPC error its
arguments give: code, message, data), malformed (answers its call with a line that names the
call's id but is no JSON-RPC response: both result and error).
Also resources (test://missing is not found: -32002, as legacy servers say it), prompts and
subscriptions.
Environment: BASIC_EXIT_AT_START=N exits with code N before reading anything;
BASIC_SILENT_INIT=1 never answers initialize; BASIC_ROOTS_AT_START=1 asks for roots once
initialized, as server-everything does (the tool "startup" tells what it was answered);
BASIC_TASKS=1 runs task-augmented calls of "sleep" and "ask" as tasks of its own
(2025-11-25 core tasks: tasks/get, result, list and cancel, every task for every client,
as a server with one client, the gateway, sees it), whose requests carry the related-task
_meta, unless BASIC_TASK_META=0 (a server that forgets it); a plain call whose request names
a task (related-task _meta) labels what it asks with that task, as the TypeScript SDK does;
BASIC_JOURNAL=FILE appends a line to FILE for each tools/call it receives ("call NAME
ARGS-JSON") and each cancel it hears ("cancelled ID"): what reached the server, readable
after the process is gone.
"""

import asyncio
import contextvars
import json
import os
import sys

TOOLS = ["echo", "sleep", "blob", "crash", "hang", "ask", "sample", "roots", "progress", "log",
         "changed", "touch", "whoami", "cancelled", "params", "ask2", "subscribed", "garble",
         "deep", "startup", "meta", "render", "rendered", "late", "environ", "fail",
         "malformed"]
# Lines a broken server might write: JSON-RPC in name only (see the "garble" tool).
GARBLE = [b'{"jsonrpc":"2.0","id":{"a":1},"result":{}}', b'{"jsonrpc":"2.0","method":null,"id":3}',
          b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":[1]}}',
          b'{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":{}}}',
          b"{not json"]
out = sys.stdout.buffer
pending: dict = {}
cancelled: list = []  # request ids the client cancelled, as this server saw them
subscribed: set = set()  # resource URIs this process was asked to watch
next_id = 0
startup: list = []  # the answer to the roots/list asked at start (BASIC_ROOTS_AT_START)
rendering: list = []  # texts of render calls, as they arrived
busy = False  # a render runs
TASKS = bool(os.environ.get("BASIC_TASKS"))
LABELS = os.environ.get("BASIC_TASK_META") != "0"
running_task: contextvars.ContextVar = contextvars.ContextVar("task", default=None)
own_tasks: dict = {}  # task id -> [task record, asyncio task of its call]


def journal(line: str) -> None:
    if os.environ.get("BASIC_JOURNAL"):
        with open(os.environ["BASIC_JOURNAL"], "a") as f:
            f.write(line + "\n")


def send(msg: dict) -> None:
    out.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
    out.flush()


def text(s: str) -> dict:
    return {"content": [{"type": "text", "text": s}]}


async def ask(method: str, params: dict) -> dict:
    global next_id
    next_id += 1
    rid = f"s{next_id}"
    fut = asyncio.get_running_loop().create_future()
    pending[rid] = fut
    task_id = running_task.get()
    if task_id is not None and LABELS:  # spec: requests about a task say so
        params = {**params, "_meta": {"io.modelcontextprotocol/related-task": {
            "taskId": task_id}}}
    send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    return await fut


def related_task(params: dict) -> object:
    """The task id a request's related-task _meta names, if any."""
    related = (params.get("_meta") or {}).get("io.modelcontextprotocol/related-task")
    return related.get("taskId") if isinstance(related, dict) else None


async def render(name: str, args: dict) -> dict:
    global busy
    if name == "rendered":
        return text(json.dumps(rendering))
    rendering.append(args.get("text", ""))
    if busy:
        return {**text("busy: render runs one call at a time"), "isError": True}
    busy = True
    try:
        await asyncio.sleep(args.get("ms", 300) / 1000)
    finally:
        busy = False
    return text(f"rendered {args.get('text', '')}")


async def call_tool(params: dict) -> dict:
    name, args = params.get("name"), params.get("arguments") or {}
    token = (params.get("_meta") or {}).get("progressToken")
    if name == "echo":
        return text(args.get("text", ""))
    if name == "startup":
        return text(json.dumps(startup))
    if name == "sleep":
        await asyncio.sleep(args.get("ms", 0) / 1000)
        return text(f"slept {args.get('ms', 0)}")
    if name in ("render", "rendered"):
        return await render(name, args)
    if name == "blob":
        return text("x" * int(args.get("bytes", 0)))
    if name == "crash":
        os._exit(3)
    if name == "hang":
        await asyncio.Event().wait()
    if name == "ask":
        reply = await ask("elicitation/create", {
            "message": args.get("message", "Your name?"),
            "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}})
        if args.get("strict") and "code" in reply:  # the client refused: fail the call
            raise RuntimeError(f"elicitation failed: {reply['message']}")
        return text(json.dumps(reply))
    if name == "sample":
        reply = await ask("sampling/createMessage", {"maxTokens": 10, "messages": [
            {"role": "user", "content": {"type": "text", "text": args.get("prompt", "hi")}}]})
        return text(json.dumps(reply))
    if name == "roots":
        return text(json.dumps(await ask("roots/list", {})))
    if name == "progress":  # quiet for wait_ms, then steps from `start`, delay_ms apart
        steps, start = int(args.get("steps", 3)), int(args.get("start", 1))
        await asyncio.sleep(args.get("wait_ms", 0) / 1000)
        for i in range(1, steps + 1):
            if token is not None:
                send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {
                    "progressToken": token, "progress": start + i - 1, "total": steps,
                    "message": f"step {i}"}})
            await asyncio.sleep(args.get("delay_ms", 20) / 1000)
        return text(f"done {steps}")
    if name == "log":
        send({"jsonrpc": "2.0", "method": "notifications/message",
              "params": {"level": args.get("level", "info"), "data": args.get("text", "hello")}})
        return text("logged")
    if name == "late":  # after its answer: a log line of no call, then a list change
        asyncio.get_running_loop().call_soon(lambda: [send(m) for m in (
            {"jsonrpc": "2.0", "method": "notifications/message",
             "params": {"level": "info", "data": args.get("text", "late news")}},
            {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})])
        return text("answered")
    if name == "changed":  # a new tool appears: "added"
        if "added" not in TOOLS:
            TOOLS.append("added")
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        return text("changed")
    if name == "added":
        return text("added")
    if name == "touch":
        send({"jsonrpc": "2.0", "method": "notifications/resources/updated",
              "params": {"uri": args.get("uri", "test://a")}})
        return text("touched")
    if name == "whoami":
        return text(str(os.getpid()))
    if name == "environ":  # its environment, as it reads it (/proc/self/environ alike)
        return text(json.dumps(dict(os.environ)))
    if name == "params":  # what reached the server
        return text(json.dumps(sorted(params)))
    if name == "meta":  # the request's _meta as it reached the server
        return text(json.dumps(params.get("_meta") or {}))
    if name == "ask2":  # two questions at once
        schema = {"type": "object", "properties": {"name": {"type": "string"}}}
        replies = await asyncio.gather(
            ask("elicitation/create", {"message": "First?", "requestedSchema": schema}),
            ask("elicitation/create", {"message": "Second?", "requestedSchema": schema}))
        return text(json.dumps(replies))
    if name == "cancelled":
        return text(json.dumps(cancelled))
    if name == "subscribed":
        return text(json.dumps(sorted(subscribed)))
    if name == "deep":  # structured content nested `levels` deep
        nested: object = 1
        for _ in range(int(args.get("levels", 1))):
            nested = {"a": nested}
        return {**text(f"nested {args.get('levels')}"), "structuredContent": nested}
    if name == "garble":  # malformed lines, flushed with the answer in one write
        out.write(b"".join(line + b"\n" for line in GARBLE))
        return text("answered after garbage")
    return {"content": [{"type": "text", "text": f"unknown tool {name}"}], "isError": True}


INIT = {"capabilities": {"tools": {"listChanged": True}, "prompts": {}, "logging": {},
                         "resources": {"subscribe": True, "listChanged": True}},
        "serverInfo": {"name": "basic-test-server", "version": "1.0"},
        "instructions": "A server for tests."}


def start_task(params: dict) -> dict:
    task_id = f"native-{len(own_tasks) + 1}"
    record = {"taskId": task_id, "status": "working", "createdAt": "2026-11-25T00:00:00Z",
              "lastUpdatedAt": "2026-11-25T00:00:00Z", "ttl": 60000, "pollInterval": 50}

    async def run() -> dict:
        running_task.set(task_id)
        result = await call_tool(params)
        record["status"] = "completed"
        return result
    own_tasks[task_id] = [record, asyncio.ensure_future(run())]
    return {"task": dict(record)}


async def serve_task(method: str, params: dict) -> dict:
    if method == "tasks/list":
        return {"tasks": [dict(r) for r, _ in own_tasks.values()]}
    entry = own_tasks.get(params.get("taskId"))
    if entry is None:
        raise RuntimeError(f"no task {params.get('taskId')}")
    record, job = entry
    if method == "tasks/cancel":
        job.cancel()
        record["status"] = "cancelled"
    elif method == "tasks/result":
        return await job
    return dict(record)


TOOL_EXECUTION = {"sleep": {"taskSupport": "optional"}, "ask": {"taskSupport": "optional"}}


def misbehave(rid: object, params: dict) -> None:
    """The tools "fail" (a JSON-RPC error as asked) and "malformed" (a broken answer)."""
    args = params.get("arguments") or {}
    if params.get("name") == "fail":
        error = {"code": args.get("code", -32603), "message": args.get("message", "failed")}
        if "data" in args:
            error["data"] = args["data"]
        send({"jsonrpc": "2.0", "id": rid, "error": error})
        return
    send({"jsonrpc": "2.0", "id": rid, "result": {"content": []},
          "error": {"code": -32603, "message": "both"}})


async def handle(msg: dict) -> None:
    method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
    try:
        if method == "initialize":
            if os.environ.get("BASIC_SILENT_INIT"):
                return
            result = {**INIT, "protocolVersion": params.get("protocolVersion")}
            if TASKS:
                result["capabilities"] = {**INIT["capabilities"], "tasks": {
                    "list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}}
        elif method == "notifications/initialized":
            if os.environ.get("BASIC_ROOTS_AT_START"):
                startup.append(await ask("roots/list", {}))
            return
        elif method == "ping" or method == "logging/setLevel":
            result = {}
        elif method in ("resources/subscribe", "resources/unsubscribe"):
            if not isinstance(params.get("_meta", {}), dict):  # as an SDK's validation would
                raise ValueError("invalid params: _meta must be an object")
            (subscribed.add if method.endswith("/subscribe") else subscribed.discard)(
                params.get("uri"))
            result = {}
        elif method == "tools/list":
            result = {"tools": [{"name": n, "inputSchema": {"type": "object"},
                                 **({"execution": TOOL_EXECUTION[n]}
                                    if TASKS and n in TOOL_EXECUTION else {})} for n in TOOLS]}
        elif method == "tools/call" and TASKS and isinstance(params.get("task"), dict):
            result = start_task(params)
        elif method == "tools/call" and params.get("name") in ("fail", "malformed"):
            misbehave(rid, params)
            return
        elif method == "tools/call":
            # A plain call that names a task (related-task _meta) labels what it asks with
            # that task, as the TypeScript SDK's server does.
            running_task.set(related_task(params))
            result = await call_tool(params)
        elif method.startswith("tasks/") and TASKS:
            result = await serve_task(method, params)
        elif method == "resources/list":
            result = {"resources": [{"uri": "test://a", "name": "a", "mimeType": "text/plain"}]}
        elif method == "resources/read" and params.get("uri") == "test://missing":
            send({"jsonrpc": "2.0", "id": rid,
                  "error": {"code": -32002, "message": "Resource not found"}})
            return
        elif method == "resources/read":
            result = {"contents": [{"uri": params.get("uri"), "text": "content of a"}]}
        elif method == "prompts/list":
            result = {"prompts": [{"name": "greet", "arguments": [{"name": "who"}]}]}
        elif method == "prompts/get":
            who = (params.get("arguments") or {}).get("who", "world")
            result = {"messages": [{"role": "user",
                                    "content": {"type": "text", "text": f"Hello {who}"}}]}
        else:
            if rid is not None:
                send({"jsonrpc": "2.0", "id": rid,
                      "error": {"code": -32601, "message": f"Method not found: {method}"}})
            return
    except Exception as exc:  # a tool failure is a JSON-RPC error, as SDK servers do
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32603, "message": str(exc)}})
        return
    if rid is not None:
        send({"jsonrpc": "2.0", "id": rid, "result": result})


async def main() -> None:
    if os.environ.get("BASIC_EXIT_AT_START"):
        sys.stderr.write("basic: starting\nbasic: no API key given; exiting as told\n")
        sys.stderr.flush()
        os._exit(int(os.environ["BASIC_EXIT_AT_START"]))
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 30)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks = set()
    while line := await reader.readline():
        if not line.strip():
            continue
        msg = json.loads(line)
        if "method" not in msg:  # a response to one of our requests
            fut = pending.pop(msg.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(msg.get("result", msg.get("error")))
            continue
        if msg.get("method") == "notifications/cancelled":
            cancelled.append(msg["params"].get("requestId"))
            journal(f"cancelled {msg['params'].get('requestId')}")
            continue
        if msg.get("method") == "tools/call":
            params = msg.get("params") or {}
            journal(f"call {params.get('name')} {json.dumps(params.get('arguments') or {})}")
        task = asyncio.create_task(handle(msg))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


asyncio.run(main())
