#!/usr/bin/env python3
"""Long tool calls through the gateway: client x hop x call length -> what the client gets.

Every cell is one `tools/call` of a quiet sleeper (this file's `--sleeper`, a stdio server
whose tool `sleep` answers after `ms` milliseconds and sends nothing meanwhile: no progress,
no logs), made by one real client, straight to the gateway or through nginx, and its
outcome: "ok (N s)" or the error that client reported, and when.

Clients, each with its defaults, as a user would call it:
  py-tasks    the Python SDK mcp==1.30.0 as a core-task client (2025-11-25): `call_tool_as_task`
              with its default ttl (60 s), `poll_task` to the end, `get_task_result`
  py-inline   the Python SDK of the running interpreter (2.x from the test extra), `Client(url)`
              and `call_tool`: its default mode (it probes, so the modern era on this gateway)
  ts-sdk      the TypeScript SDK (tests/node, 1.32.2): `client.callTool` with its default
              request timeout (60 s)
  ts-sdk-progress  the same with `{onprogress, resetTimeoutOnProgress: true}` (the SDK then
              sends a progressToken; a progress notification resets its 60 s timer)
  inspector   the MCP Inspector CLI: `npx @modelcontextprotocol/inspector --cli URL
              --transport http --method tools/call ...` (installed outside the repo)
  curl        a legacy session by hand: initialize, initialized, tools/call with
              Accept: application/json, text/event-stream, the SSE answer read as it comes
Hops: `direct` (the gateway's port) and `nginx` (Debian's nginx-light started here on a
loopback port: proxy_pass, HTTP/1.1, proxy_buffering off, proxy_read_timeout left at its
default 60 s). Lengths: 5, 90 and 150 s by default. All cells run at once (sleeps cost no
CPU): the matrix takes the longest length plus some 20 s (30 clients starting at once on
two cores take ~15 s). A cell with no answer by its length + 45 s from its start is killed
and says so.

The gateway is started from `--root` (a checkout; its own `.venv/bin/python` when it has
one, else this interpreter with the checkout on PYTHONPATH) with its config/gateway.yaml's
settings and the sleeper as its only upstream, on a free loopback port; or `--url` names a
gateway already running (its upstream must be the sleeper: `python bench/long_calls.py
--sleeper`). The clients stay this checkout's (`--mcp130`, `--node-dir`, `--inspector`).

    apt-get install nginx-light
    (cd /work/scratch/inspector && npm install @modelcontextprotocol/inspector)
    .venv/bin/python bench/long_calls.py --label before [--root DIR | --url URL]
        [--lengths 5,90,150] [--clients py-tasks,...] [--hops direct,nginx]

Prints a Markdown table and writes results/long_calls-LABEL.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = ["py-tasks", "py-inline", "ts-sdk", "ts-sdk-progress", "inspector", "curl"]
HOPS = ["direct", "nginx"]
GRACE_S = 45  # a cell with no answer by its length + this (from its start) is killed
ACCEPT = "application/json, text/event-stream"


# -- the upstream: a quiet sleeper ---------------------------------------------------------

def sleeper(log: Path | None) -> None:
    """A legacy stdio MCP server with one tool, `sleep` {ms: number}, that sends nothing
    before its answer. Its schema types `ms`, so clients that convert arguments by the
    schema (the Inspector CLI) send a number. A call with an argument `cell` is logged to
    `log` with the time it arrived (the Inspector's own start is not the call's)."""
    lock = threading.Lock()
    timers: dict[Any, threading.Timer] = {}

    def send(msg: dict[str, Any]) -> None:
        with lock:
            sys.stdout.write(json.dumps(msg) + "\n")
            sys.stdout.flush()

    def answer(rid: Any, ms: float) -> None:
        timers.pop(json.dumps(rid), None)
        send({"jsonrpc": "2.0", "id": rid,
              "result": {"content": [{"type": "text", "text": f"slept {ms:g} ms"}]}})

    tool = {"name": "sleep", "description": "Sleeps ms milliseconds, quietly.",
            "inputSchema": {"type": "object", "properties": {"ms": {"type": "number"}},
                            "required": ["ms"]}}
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "long-calls-sleeper", "version": "1.0.0"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": [tool]}})
        elif method == "tools/call" and params.get("name") == "sleep":
            arguments = params.get("arguments") or {}
            ms = float(arguments.get("ms", 0))
            if log is not None and "cell" in arguments:
                with log.open("a") as f:
                    f.write(json.dumps({"cell": arguments["cell"], "at": time.time()}) + "\n")
            timer = threading.Timer(ms / 1000, answer, (rid, ms))
            timer.daemon = True
            timers[json.dumps(rid)] = timer
            timer.start()
        elif method == "notifications/cancelled":
            cancelled = timers.pop(json.dumps(params.get("requestId")), None)
            if cancelled is not None:
                cancelled.cancel()
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": rid, "result": {}})
        elif rid is not None and method is not None:
            send({"jsonrpc": "2.0", "id": rid,
                  "error": {"code": -32601, "message": f"Method not found: {method}"}})


# -- the Python clients (run under their own interpreters) ---------------------------------

def report(ok: bool, began: float, **fields: Any) -> None:
    print(json.dumps({"ok": ok, "elapsed_s": round(time.monotonic() - began, 2), **fields}))


def error_text(exc: BaseException) -> str:
    """The innermost error of an exception group, as `Type: message`."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}".strip().rstrip(":")


async def drive_py_tasks(url: str, ms: int) -> None:
    """mcp==1.30.0: a core task with the SDK's default ttl, polled to its end."""
    from mcp import ClientSession, types
    from mcp.client.streamable_http import streamable_http_client

    async with streamable_http_client(url) as (read, write, _), \
            ClientSession(read, write) as session:
        await session.initialize()
        began = time.monotonic()
        tasks = session.experimental
        try:
            created = await tasks.call_tool_as_task("sleep", {"ms": ms})
            ttl = created.task.ttl
            last = None
            async for status in tasks.poll_task(created.task.taskId):
                last = status
            assert last is not None
            if last.status != "completed":
                report(False, began, error=f"task {last.status}: {last.statusMessage}",
                       ttl_ms=ttl)
                return
            done = await tasks.get_task_result(created.task.taskId, types.CallToolResult)
            texts = [c.text for c in done.content if isinstance(c, types.TextContent)]
            report(not done.isError, began, text=" ".join(texts), ttl_ms=ttl)
        except Exception as exc:
            report(False, began, error=error_text(exc))


async def drive_py_inline(url: str, ms: int) -> None:
    """The Python SDK 2.x: `Client(url)` with its defaults, `call_tool` inline."""
    from mcp import Client

    async with Client(url) as client:
        began = time.monotonic()
        try:
            result = await client.call_tool("sleep", {"ms": ms})
            texts = [getattr(c, "text", "") for c in result.content]
            error = getattr(result, "is_error", None) or getattr(result, "isError", None)
            report(not error, began, text=" ".join(texts),
                   protocol=client.session.protocol_version)
        except Exception as exc:
            report(False, began, error=error_text(exc))


# -- the TypeScript SDK client (run with the cwd in --node-dir) ------------------------------

TS_CLIENT = """
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
const url = process.env.LC_URL, ms = Number(process.env.LC_MS);
const client = new Client({ name: "long-calls", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const began = performance.now();
const elapsed_s = () => Math.round((performance.now() - began) / 10) / 100;
let out, progress = 0;
const options = process.env.LC_PROGRESS
  ? { onprogress: () => { progress += 1; }, resetTimeoutOnProgress: true } : undefined;
try {
  const r = await client.callTool({ name: "sleep", arguments: { ms } }, undefined, options);
  out = { ok: !r.isError, elapsed_s: elapsed_s(), text: r.content.map((c) => c.text).join(" ") };
} catch (e) {
  out = { ok: false, elapsed_s: elapsed_s(), error: `${e.constructor.name}: ${e.message}` };
}
if (options) out.progress_heard = progress;
console.log(JSON.stringify(out));
await client.close().catch(() => {});
process.exit(0);
"""


# -- the harness -----------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url.replace("/mcp", "/readyz"), timeout=2) as r:
            return int(r.status) == 200
    except OSError:
        return False


async def wait_for(check: Any, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(0.1)
    raise SystemExit(f"{what} never became ready")


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


def gateway_config(root: Path, port: int, folder: Path) -> dict[str, Any]:
    """config/gateway.yaml of the checkout (its defaults, as shipped), with this port and
    the sleeper as its only upstream."""
    conf: dict[str, Any] = {}
    shipped = root / "config" / "gateway.yaml"
    if shipped.exists():
        import yaml  # the gateway's own dependency, in this venv with the test extra

        conf = yaml.safe_load(shipped.read_text()) or {}
    conf["listen"] = {**conf.get("listen", {}), "host": "127.0.0.1", "port": port}
    conf["upstreams"] = {"main": {"command": sys.executable,
                                  "args": [str(Path(__file__).resolve()), "--sleeper",
                                           str(folder / "sleeper.log")],
                                  "path": "/mcp"}}
    return conf


def start_gateway(root: Path, folder: Path) -> tuple[subprocess.Popen[bytes], str, dict[str, Any]]:
    port = free_port()
    conf = gateway_config(root, port, folder)
    path = folder / "gateway.yaml"
    path.write_text(json.dumps(conf, indent=1))  # JSON is YAML
    venv = root / ".venv" / "bin" / "python"
    python = str(venv) if venv.exists() else sys.executable
    log = (folder / "gateway.log").open("wb")
    proc = subprocess.Popen([python, "-m", "gateway", "--config", str(path)], cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root)},
                            stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}/mcp", {"python": python, "config": conf}


NGINX_CONF = """worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 1024; }}
http {{
  access_log {d}/access.log;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://{upstream};
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_buffering off;
      proxy_cache off;
      proxy_read_timeout {read_timeout};
    }}
  }}
}}
"""


def start_nginx(gateway_url: str, folder: Path, read_timeout: str = "60s"
                ) -> tuple[subprocess.Popen[bytes], str, int]:
    """nginx in front of `gateway_url`, cutting a response quiet for `read_timeout` (nginx's
    default: 60 s); its process, the URL through it, and its port."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        raise SystemExit("needs nginx (apt-get install nginx-light)")
    port = free_port()
    d = folder / "nginx"
    d.mkdir()
    upstream = gateway_url.split("//", 1)[1].split("/", 1)[0]
    (d / "nginx.conf").write_text(NGINX_CONF.format(d=d, port=port, upstream=upstream,
                                                    read_timeout=read_timeout))
    proc = subprocess.Popen([binary, "-p", str(d), "-e", str(d / "error.log"),
                             "-c", str(d / "nginx.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = "/" + gateway_url.split("//", 1)[1].split("/", 1)[1]
    return proc, f"http://127.0.0.1:{port}{path}", port


def client_argv(client: str, url: str, ms: int, args: argparse.Namespace
                ) -> tuple[list[str], dict[str, str], Path | None] | str:
    """The command of one cell, its environment and cwd; or why this client cannot run."""
    node_bin = args.node_dir / "node_modules" / ".bin"
    path = f"{node_bin}{os.pathsep}{os.environ['PATH']}" if (node_bin / "node").exists() \
        else os.environ["PATH"]
    env = {**os.environ, "PATH": path}
    me = str(Path(__file__).resolve())
    if client == "py-tasks":
        if not args.mcp130.exists():
            return f"no mcp==1.30.0 environment at {args.mcp130}"
        return [str(args.mcp130), me, "--drive", client, url, str(ms)], env, None
    if client == "py-inline":
        return [sys.executable, me, "--drive", client, url, str(ms)], env, None
    if client in ("ts-sdk", "ts-sdk-progress"):
        if not (args.node_dir / "node_modules" / "@modelcontextprotocol" / "sdk").exists():
            return f"no TypeScript SDK in {args.node_dir} (npm ci there)"
        progress = {"LC_PROGRESS": "1"} if client == "ts-sdk-progress" else {}
        return (["node", "--input-type=module", "-e", TS_CLIENT],
                {**env, "LC_URL": url, "LC_MS": str(ms), **progress}, args.node_dir)
    if client == "inspector":
        if not (args.inspector / "node_modules" / ".bin" / "mcp-inspector").exists():
            return f"no MCP Inspector in {args.inspector} (npm install there)"
        return (["npx", "@modelcontextprotocol/inspector", "--cli", url, "--transport", "http",
                 "--method", "tools/call", "--tool-name", "sleep", "--tool-arg", f"ms={ms}",
                 f"cell={url}:{ms}"],
                env, args.inspector)
    return [sys.executable, me, "--drive", "curl", url, str(ms)], env, None


def curl(url: str, ms: int) -> None:
    """A legacy session with curl: initialize, initialized, then the call, its SSE answer
    read as it comes (-N), with curl's defaults (no overall timeout)."""
    head = ["curl", "-sS", "-N", url, "-H", "Content-Type: application/json",
            "-H", f"Accept: {ACCEPT}"]
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "curl", "version": "8"}}}
    got = subprocess.run([*head, "-D", "-", "-d", json.dumps(init)], capture_output=True,
                         text=True, check=False)
    session = next((line.split(":", 1)[1].strip() for line in got.stdout.splitlines()
                    if line.lower().startswith("mcp-session-id:")), None)
    if session is None:
        report(False, time.monotonic(), error=f"initialize: {got.stdout[:200]}{got.stderr}")
        return
    hs = [*head, "-H", f"Mcp-Session-Id: {session}", "-H", "MCP-Protocol-Version: 2025-06-18"]
    subprocess.run([*hs, "-d", json.dumps({"jsonrpc": "2.0", "method":
                                           "notifications/initialized"})],
                   capture_output=True, check=False)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "sleep", "arguments": {"ms": ms}}}
    began = time.monotonic()
    got = subprocess.run([*hs, "-w", "\n%{http_code} %{content_type}", "-d", json.dumps(call)],
                         capture_output=True, text=True, check=False)
    body, _, status = got.stdout.rpartition("\n")
    answer = None
    for line in body.splitlines():
        data = line[5:].strip() if line.startswith("data:") else line.strip()
        if data.startswith("{"):
            with contextlib.suppress(ValueError):
                msg = json.loads(data)
                if msg.get("id") == 2:
                    answer = msg
    comments = sum(1 for line in body.splitlines() if line.startswith(":"))
    info = {"http": status, "curl_exit": got.returncode, "keepalive_comments": comments}
    if answer is not None and "result" in answer:
        text = " ".join(c.get("text", "") for c in answer["result"].get("content", []))
        report(not answer["result"].get("isError"), began, text=text, **info)
    elif answer is not None:
        report(False, began, error=f"JSON-RPC error {answer['error']}", **info)
    else:
        why = got.stderr.strip().splitlines()[-1] if got.stderr.strip() else "no answer"
        report(False, began, error=f"HTTP {status}: {why}; body {body[-120:]!r}", **info)


async def cell(client: str, hop: str, length_s: int, url: str, args: argparse.Namespace
               ) -> dict[str, Any]:
    row: dict[str, Any] = {"client": client, "hop": hop, "length_s": length_s}
    spec = client_argv(client, url, length_s * 1000, args)
    if isinstance(spec, str):
        return {**row, "ok": False, "outcome": f"not run: {spec}", "error": spec}
    argv, env, cwd = spec
    began = time.monotonic()
    proc = await asyncio.create_subprocess_exec(*argv, env=env, cwd=cwd,
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE,
                                                start_new_session=True)
    limit = length_s + GRACE_S
    try:
        out, err = await asyncio.wait_for(proc.communicate(), limit)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        return {**row, "ok": False, "wall_s": round(time.monotonic() - began, 1),
                "error": "no answer", "outcome": f"no answer by {limit} s (killed)"}
    row["wall_s"] = round(time.monotonic() - began, 1)
    row["exit"] = proc.returncode
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    if client == "inspector":
        elapsed = row["wall_s"]
        arrived = sleeper_log(args).get(f"{url}:{length_s * 1000}")
        if arrived is not None:  # from the call's arrival at the server to the CLI's exit
            elapsed = round(time.time() - arrived, 1)
            row["started_s"] = round(row["wall_s"] - elapsed, 1)
        return {**row, **inspector_outcome(proc.returncode, stdout, stderr, elapsed)}
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    try:
        seen = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (stderr.strip().splitlines() or ["no output"])[-1][:160]
        return {**row, "ok": False, "error": tail, "stderr": stderr[-2000:],
                "outcome": f"crashed after {row['wall_s']:.0f} s: {tail}"}
    row.update(seen)
    return {**row, "outcome": outcome(seen["ok"], seen.get("error", ""), seen["elapsed_s"])}


def sleeper_log(args: argparse.Namespace) -> dict[str, float]:
    """When each logged call reached the sleeper (a gateway started here: `--sleeper LOG`)."""
    arrived: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in (args.folder / "sleeper.log").read_text().splitlines():
            seen = json.loads(line)
            arrived[seen["cell"]] = seen["at"]
    return arrived


def inspector_outcome(code: int | None, stdout: str, stderr: str, wall_s: float
                      ) -> dict[str, Any]:
    """The CLI prints the result as JSON and exits 0, or an error on stderr and exits 1.
    Its time runs from the call's arrival at the sleeper to the CLI's exit (it starts,
    connects and lists tools first: some seconds when 30 clients start at once); against a
    gateway given by --url, from the CLI's start."""
    if code == 0:
        try:
            result = json.loads(stdout)
        except ValueError:
            result = {}
        text = " ".join(c.get("text", "") for c in result.get("content", []))
        ok = bool(text) and not result.get("isError")
        return {"ok": ok, "text": text or stdout[-200:], "elapsed_s": wall_s,
                "outcome": outcome(ok, stdout[-120:], wall_s)}
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    error = next((line for line in lines if "Failed to call tool" in line or "Error" in line),
                 lines[-1] if lines else f"exit {code}")
    return {"ok": False, "error": error[:300], "stderr": stderr[-2000:], "elapsed_s": wall_s,
            "outcome": outcome(False, error, wall_s)}


def outcome(ok: bool, error: str, elapsed_s: float) -> str:
    if ok:
        return f"ok ({elapsed_s:.0f} s)"
    error = " ".join(error.split())
    if len(error) > 110:
        error = error[:107] + "..."
    return f"at {elapsed_s:.0f} s: {error}"


def versions(args: argparse.Namespace) -> dict[str, str]:
    def run(*argv: str, cwd: Path | None = None) -> str:
        with contextlib.suppress(OSError):
            got = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, check=False)
            return (got.stdout or got.stderr).strip().splitlines()[0] if (
                got.stdout or got.stderr).strip() else ""
        return ""

    def package(folder: Path, name: str) -> str:
        with contextlib.suppress(OSError, ValueError):
            meta = folder / "node_modules" / name / "package.json"
            return str(json.loads(meta.read_text())["version"])
        return ""

    py = "import importlib.metadata as m; print(m.version('mcp'))"
    node = args.node_dir / "node_modules" / ".bin" / "node"
    return {"mcp (py-tasks)": run(str(args.mcp130), "-c", py) if args.mcp130.exists() else "",
            "mcp (py-inline)": run(sys.executable, "-c", py),
            "@modelcontextprotocol/sdk (ts-sdk)":
                package(args.node_dir, "@modelcontextprotocol/sdk"),
            "@modelcontextprotocol/inspector":
                package(args.inspector, "@modelcontextprotocol/inspector"),
            "inspector's sdk": package(args.inspector, "@modelcontextprotocol/sdk"),
            "curl": run("curl", "--version"), "nginx": run("nginx", "-v"),
            "node": run(str(node) if node.exists() else "node", "--version")}


def table(rows: list[dict[str, Any]], lengths: list[int]) -> str:
    head = "| client | hop | " + " | ".join(f"{n} s" for n in lengths) + " |"
    lines = [head, "|---|---|" + "---|" * len(lengths)]
    keys = list(dict.fromkeys((r["client"], r["hop"]) for r in rows))
    by = {(r["client"], r["hop"], r["length_s"]): r["outcome"] for r in rows}
    for client, hop in keys:
        cells = [by.get((client, hop, n), "").replace("|", "\\|") for n in lengths]
        lines.append(f"| {client} | {hop} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def commit_of(root: Path) -> str:
    got = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"],
                         capture_output=True, text=True, check=False)
    return got.stdout.strip() or "unknown"


async def run(args: argparse.Namespace) -> None:
    lengths = [int(n) for n in args.lengths.split(",")]
    clients, hops = args.clients.split(","), args.hops.split(",")
    folder = args.folder = Path(tempfile.mkdtemp(prefix="long-calls-"))
    procs: list[subprocess.Popen[bytes]] = []
    report_: dict[str, Any] = {"label": args.label, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                               "lengths_s": lengths, "grace_s": GRACE_S, "logs": str(folder)}
    try:
        if args.url:
            url = args.url
            report_["gateway"] = {"url": url}
        else:
            root = args.root.resolve()
            gateway, url, info = start_gateway(root, folder)
            procs.append(gateway)
            report_["gateway"] = {"root": str(root), "commit": commit_of(root), **info}
        await wait_for(lambda: ready(url), f"the gateway at {url}")
        urls = {"direct": url}
        if "nginx" in hops:
            nginx, urls["nginx"], port = start_nginx(url, folder)
            procs.append(nginx)
            await wait_for(lambda: listening(port), "nginx", 10)
        report_["urls"] = urls
        report_["versions"] = versions(args)
        print(f"gateway {url}, nginx {urls.get('nginx')}; {len(clients) * len(hops) * len(lengths)}"
              f" cells at once, up to {max(lengths) + GRACE_S} s", file=sys.stderr)
        began = time.monotonic()
        rows = await asyncio.gather(*(cell(c, h, n, urls[h], args)
                                      for c in clients for h in hops for n in lengths))
        report_["wall_s"] = round(time.monotonic() - began, 1)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
    report_["cells"] = rows
    markdown = table(rows, lengths)
    report_["table"] = markdown
    out = args.json or ROOT / "results" / f"long_calls-{args.label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report_, indent=1))
    print(markdown)
    print(f"\n{report_['wall_s']} s; JSON: {out}; logs: {folder}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", default="run", help="names the JSON: results/long_calls-LABEL")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--root", type=Path, default=ROOT, help="the gateway's checkout to run")
    where.add_argument("--url", help="a running gateway whose upstream is the sleeper")
    ap.add_argument("--lengths", default="5,90,150", help="call lengths in seconds")
    ap.add_argument("--clients", default=",".join(CLIENTS), help=",".join(CLIENTS))
    ap.add_argument("--hops", default=",".join(HOPS), help=",".join(HOPS))
    ap.add_argument("--mcp130", type=Path, default=ROOT / ".test-envs/mcp130/bin/python",
                    help="a Python with mcp==1.30.0")
    ap.add_argument("--node-dir", type=Path, default=ROOT / "tests/node",
                    help="where the TypeScript SDK and Node 22 are installed (npm ci)")
    ap.add_argument("--inspector", type=Path, default=Path("/work/scratch/inspector"),
                    help="a folder with @modelcontextprotocol/inspector installed")
    ap.add_argument("--json", type=Path, help="default: results/long_calls-LABEL.json")
    ap.add_argument("--sleeper", nargs="?", const="", metavar="LOG", help=argparse.SUPPRESS)
    ap.add_argument("--drive", nargs=3, metavar=("CLIENT", "URL", "MS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sleeper is not None:
        sleeper(Path(args.sleeper) if args.sleeper else None)
    elif args.drive:
        client, url, ms = args.drive
        if client == "curl":
            curl(url, int(ms))
        else:
            asyncio.run({"py-tasks": drive_py_tasks, "py-inline": drive_py_inline}[client](
                url, int(ms)))
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
