#!/usr/bin/env python3
"""The work budget (docs/performance.md): how many Python function calls one request costs
through the whole gateway, counted in one process, for a legacy echo, a modern echo and a
`tasks/get` of a finished task. tests/e2e/test_call_budget.py holds the budget; this script
prints the table behind it, the functions by calls a request:

    PYTHONPATH=. .venv/bin/python bench/calls.py [--flows legacy-echo,...] [--top 60]

What is counted: every `call` event of `sys.setprofile` on the loop's thread while requests
are served: each Python function entered, and each time a coroutine or generator is resumed
(a resumption is a loop turn of work as real as a call). Calls into C (`c_call`: builtins,
methods of C types) are shown beside but not budgeted: they cost a tenth of a Python call,
change with harmless rewrites (a loop for a comprehension), and C calling C (orjson,
multidict, the HTTP parser) is never reported, so they measure little.

Why the count does not move with the machine's load:
- the gateway runs on uvloop, as in production: the loop and its transports are C, so how
  many turns the loop takes (how data happens to arrive) adds no Python call;
- the client is this module's own protocol, written in raw bytes prepared beforehand; calls
  made from this module, and everything they call, are not counted (the profiler follows
  the frames: a call inside one of ours is the client's);
- the server (tests/servers/basic.py) is a subprocess: its work is its own;
- every flow is warmed up first (imports, caches, a finished task's rendered answer) and
  given PAUSE_S for what the warm-up started in the background; the collector is off while
  counting (a collection runs finalizers and weakref callbacks at moments of its own); a few
  loop turns are let pass after the last answer so each request's tail (what runs after its
  answer is written) is counted;
- timers (the status page's sampling, heartbeats) could still fire inside a window: several
  windows are counted and the smallest kept, every window's figure shown; the tick of
  laggards.py (every 50 ms while calls wait: a cost of time, not of a request) is left out
  as the client is.
Measured so: every window agrees to the call, idle or with both cores busy. On asyncio's own
loop the loop adds ~125 calls a request and windows differ by fractions of a call.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import sys
import sysconfig
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
BASIC = ROOT / "tests" / "servers" / "basic.py"
MODERN = "2026-07-28"
LEGACY = "2025-06-18"
TASKS: dict[str, Any] = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
SETTINGS: dict[str, Any] = {  # one gateway for the three flows
    "upstreams": {"main": {"command": sys.executable, "args": [str(BASIC)]}},
    "logging": {"level": "warning"},
    "tasks": {"tools": {"whoami": {"mode": "always", "ttl_ms": 3_600_000}}},
}
FLOWS = ("legacy-echo", "modern-echo", "tasks-get")
WARM = 60  # requests before counting: first-call imports, caches, the kept answer
REQUESTS = 40  # requests a window
WINDOWS = 5  # windows a flow: the smallest is kept
PAUSE_S = 0.2  # after the warm-up: what it started in the background ends (a handshake)
SETTLE = 8  # loop turns let pass before and after a window (a request's tail is counted)
OURS = __file__


# -- the counter ---------------------------------------------------------------------------

@dataclass
class Tally:
    """Calls counted in one window: Python ones by code object, C ones in all."""
    calls: Counter[CodeType | str] = field(default_factory=Counter)
    c_calls: int = 0

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def generated(frame: FrameType) -> str | None:
    """A generated method's name with its class (a dataclass's `__init__`, `__eq__`): their
    code says only "<string>"."""
    if frame.f_code.co_filename != "<string>":
        return None
    this = frame.f_locals.get("self")
    return f"<generated> {type(this).__module__}.{type(this).__qualname__}.{frame.f_code.co_name}"


class Profiler:
    """`sys.setprofile`'s hook, counting the server's calls: a call made from one of this
    module's frames (the client, the driver), and all below it, is left out."""

    def __init__(self) -> None:
        from gateway.laggards import Laggards
        self.tally = Tally()
        self._inside_ours = 0  # depth of this module's frames on the stack
        self._tick = Laggards._tick.__code__  # left out, and all it calls (see above)

    def hook(self, frame: FrameType, event: str, _: object) -> None:
        if event == "call":
            if frame.f_code.co_filename == OURS or frame.f_code is self._tick:
                self._inside_ours += 1
            elif not self._inside_ours:
                self.tally.calls[generated(frame) or frame.f_code] += 1
        elif event == "return":
            if frame.f_code.co_filename == OURS or frame.f_code is self._tick:
                self._inside_ours -= 1
        elif event == "c_call" and not self._inside_ours:
            self.tally.c_calls += 1

    def __enter__(self) -> Profiler:
        self.tally = Tally()
        # Entered from frames of ours: this one and the driver's coroutines above it return
        # (or suspend) before anything of the server runs; the frames below the loop never.
        self._inside_ours = 1
        frame = sys._getframe().f_back
        while frame is not None and frame.f_code.co_flags & inspect.CO_COROUTINE:
            assert frame.f_code.co_filename == OURS, "counted from a coroutine of ours only"
            self._inside_ours += 1
            frame = frame.f_back
        gc.disable()
        sys.setprofile(self.hook)
        return self

    def __exit__(self, *_: object) -> None:
        sys.setprofile(None)
        gc.enable()


# -- the client: raw HTTP/1.1 on one kept-alive connection ---------------------------------

class Client(asyncio.Protocol):
    """Sends prepared requests and waits for each whole answer (Content-Length or chunked)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.waiter: asyncio.Future[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        answer = whole_answer(self.buffer)
        if answer is not None and self.waiter is not None and not self.waiter.done():
            self.buffer = b""
            self.waiter.set_result(answer)

    async def send(self, request: bytes) -> bytes:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self.waiter


def whole_answer(buffer: bytes) -> bytes | None:
    """The answer in `buffer` once it is whole (its head and body), else None."""
    head, sep, body = buffer.partition(b"\r\n\r\n")
    if not sep:
        return None
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        return buffer if body.endswith(b"0\r\n\r\n") else None
    length = int(lower.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    return buffer if len(body) >= length else None


def request(body: dict[str, Any], **headers: str) -> bytes:
    """A POST /mcp in bytes, ready to send as often as needed."""
    data = json.dumps(body, separators=(",", ":")).encode()
    lines = ["POST /mcp HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
             "Accept: application/json, text/event-stream", f"Content-Length: {len(data)}",
             *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


def parsed(answer: bytes) -> tuple[str, dict[str, Any]]:
    """An answer's head (as text) and its JSON-RPC message (the last, if an SSE stream)."""
    head, _, body = answer.partition(b"\r\n\r\n")
    if b"chunked" in head.lower():
        body = b"".join(line for line in body.split(b"\r\n") if line.startswith(b"data:"))
        body = body.rsplit(b"data:", 1)[1]
    status = head.split(b"\r\n", 1)[0].decode()
    if status.split()[1] != "200":
        raise AssertionError(f"{status}: {body[:300]!r}")
    return head.decode(), json.loads(body)


# -- the gateway and the flows -------------------------------------------------------------

@dataclass
class Flow:
    """One kind of request: how to prepare it (on its own connection), then its bytes."""
    name: str
    prepare: Callable[[Client], Awaitable[bytes]]


async def legacy_echo(client: Client) -> bytes:
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {},
        "clientInfo": {"name": "calls", "version": "1"}}}
    head, _ = parsed(await client.send(request(init)))
    session = next(line.split(":", 1)[1].strip() for line in head.split("\r\n")
                   if line.lower().startswith("mcp-session-id:"))
    extra = {"Mcp-Session-Id": session, "MCP-Protocol-Version": LEGACY}
    await client.send(request({"jsonrpc": "2.0", "method": "notifications/initialized"},
                              **extra))
    return request({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"text": "hi"}}}, **extra)


def modern(method: str, params: dict[str, Any], caps: dict[str, Any]) -> bytes:
    """A 2026-07-28 request: its envelope in `_meta`, its method and name in headers."""
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": caps}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    name = params.get("name", params.get("taskId"))
    extra = {} if name is None else {"Mcp-Name": str(name)}
    return request(body, **{"MCP-Protocol-Version": MODERN, "Mcp-Method": method}, **extra)


async def modern_echo(_: Client) -> bytes:
    return modern("tools/call", {"name": "echo", "arguments": {"text": "hi"}}, {})


async def tasks_get(client: Client) -> bytes:
    """A finished task of `whoami` (a task at once), then its `tasks/get`."""
    _, made = parsed(await client.send(
        modern("tools/call", {"name": "whoami", "arguments": {}}, TASKS)))
    get = modern("tasks/get", {"taskId": made["result"]["taskId"]}, TASKS)
    for _ in range(200):
        _, got = parsed(await client.send(get))
        if got["result"]["status"] == "completed":
            return get
        await asyncio.sleep(0.01)
    raise AssertionError(f"the task never completed: {got}")


async def task_create(_: Client) -> bytes:
    """A task at once (`whoami`, mode always), whose end comes in the background: shown
    (`--flows task-create`), not budgeted, as a window's last end may fall outside it."""
    return modern("tools/call", {"name": "whoami", "arguments": {}}, TASKS)


PREPARE: dict[str, Callable[[Client], Awaitable[bytes]]] = {
    "legacy-echo": legacy_echo, "modern-echo": modern_echo, "tasks-get": tasks_get,
    "task-create": task_create}


# -- measuring -----------------------------------------------------------------------------

@dataclass
class Measure:
    """One flow's windows: calls a request in each, and the smallest window's tally."""
    flow: str
    per_request: list[float]
    best: Tally

    @property
    def calls(self) -> float:
        return min(self.per_request)


async def settle() -> None:
    for _ in range(SETTLE):
        await asyncio.sleep(0)


async def window(client: Client, data: bytes, requests: int) -> Tally:
    """`requests` requests one after the other, counted, with their tails."""
    gc.collect()
    await settle()
    with Profiler() as probe:
        for _ in range(requests):
            await client.send(data)
        await settle()
    return probe.tally


async def measure_flow(port: int, flow: str, requests: int, windows: int) -> Measure:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(Client, "127.0.0.1", port)
    try:
        data = await PREPARE[flow](client)
        for _ in range(WARM):
            parsed(await client.send(data))
        await asyncio.sleep(PAUSE_S)  # what the first requests started in the background
        tallies = [await window(client, data, requests) for _ in range(windows)]
    finally:
        assert client.transport is not None
        client.transport.close()
    best = min(tallies, key=lambda t: t.total)
    return Measure(flow, [t.total / requests for t in tallies], best)


async def listen(conf: Any) -> tuple[Any, int]:
    """The gateway's app on a loopback port, served as `gateway.app.serve` serves it (its
    runner's options); returns the runner and the port. The one place to change when the
    gateway serves otherwise."""
    from aiohttp import web

    from gateway.app import INFLATE, create_app
    runner = web.AppRunner(create_app(conf), access_log=None, handle_signals=False,
                           max_line_size=conf.listen.max_header_bytes,
                           max_field_size=conf.listen.max_header_bytes,
                           handler_cancellation=True, auto_decompress=INFLATE)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def ready(port: int) -> None:
    loop = asyncio.get_running_loop()
    ask = b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    for _ in range(600):
        _, client = await loop.create_connection(Client, "127.0.0.1", port)
        answer = await client.send(ask)
        assert client.transport is not None
        client.transport.close()
        if answer.startswith(b"HTTP/1.1 200"):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the gateway never became ready")


async def measure(flows: tuple[str, ...] = FLOWS, requests: int = REQUESTS,
                  windows: int = WINDOWS) -> dict[str, Measure]:
    """Each flow's calls a request, through one gateway in front of tests/servers/basic.py."""
    from gateway.observability import configure_logging
    from gateway.settings.load import from_mapping
    conf = from_mapping(SETTINGS)
    configure_logging(conf.logging)  # as `serve` does: what is below its level costs little
    runner, port = await listen(conf)
    try:
        await ready(port)
        return {flow: await measure_flow(port, flow, requests, windows) for flow in flows}
    finally:
        await runner.cleanup()


def run(flows: tuple[str, ...] = FLOWS, requests: int = REQUESTS, windows: int = WINDOWS
        ) -> dict[str, Measure]:
    """`measure` on a loop of uvloop's, as the gateway runs (its loop adds no Python call)."""
    import uvloop
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(measure(flows, requests, windows))
    finally:
        loop.close()


# -- reporting -----------------------------------------------------------------------------

STDLIB = sysconfig.get_paths()["stdlib"]


def origin(code: CodeType | str) -> str:
    """Whose function: the gateway's, aiohttp's, the standard library's or another's."""
    if isinstance(code, str):
        return "gateway" if " gateway." in code else "generated"
    path = code.co_filename
    if path.startswith(str(ROOT / "gateway")):
        return "gateway"
    if "/aiohttp/" in path:
        return "aiohttp"
    if path.startswith("<frozen ") or (path.startswith(STDLIB) and "-packages/" not in path):
        return "stdlib"
    return path.split("-packages/", 1)[-1].split("/", 1)[0] if "-packages/" in path else "other"


def label(code: CodeType | str) -> str:
    """Where a function is, without its line (a diff against an older count matches it)."""
    if isinstance(code, str):
        return code
    path = code.co_filename
    for base in (str(ROOT) + "/", STDLIB + "/"):
        path = path.removeprefix(base)
    return f"{path.split('-packages/', 1)[-1]} {code.co_qualname}"


def summary(measure: Measure, requests: int) -> dict[str, Any]:
    """A flow's figures as JSON: calls a request (the smallest window's), each window's,
    calls into C, and every function's calls a request with its origin."""
    functions: dict[str, list[Any]] = {}
    for code, n in measure.best.calls.most_common():
        where = functions.setdefault(label(code), [origin(code), 0.0])
        where[1] += n / requests
    return {"calls": measure.calls, "windows": measure.per_request,
            "c_calls": measure.best.c_calls / requests, "functions": functions}


def grouped(functions: dict[str, list[Any]], key: Callable[[str, str], str | None]
            ) -> list[tuple[str, float]]:
    """Calls a request summed by `key(label, origin)` (None: left out), most first."""
    found: Counter[str] = Counter()
    for where, (who, n) in functions.items():
        group = key(where, who)
        if group is not None:
            found[group] += n
    return [(group, round(n, 2)) for group, n in found.most_common()]


def table(flow: str, got: dict[str, Any], top: int, before: dict[str, Any] | None = None
          ) -> str:
    """A flow's calls a request, by origin and by the gateway's module, its `top` functions,
    and with `before` (the same flow's summary from another run) every function that moved."""
    functions = got["functions"]
    windows = ", ".join(f"{c:.2f}" for c in got["windows"])
    modules = grouped(functions, lambda where, who: where.split()[0] if who == "gateway" else None)
    lines = [f"{flow}: {got['calls']:.2f} calls a request (windows: {windows}), "
             f"{got['c_calls']:.1f} calls into C",
             "  by origin: " + ", ".join(f"{g} {n:g}" for g, n in grouped(
                 functions, lambda _, who: who)),
             "  gateway by module: " + ", ".join(f"{g} {n:g}" for g, n in modules[:10])]
    ranked = sorted(functions.items(), key=lambda item: -item[1][1])[:top]
    lines += [f"  {n:7.2f}  {who:10} {where}" for where, (who, n) in ranked]
    if before is not None:
        lines.append(f"  moved since the other run ({before['calls']:.2f} calls then):")
        lines += moved(before["functions"], functions)
    return "\n".join(lines)


def moved(before: dict[str, list[Any]], after: dict[str, list[Any]]) -> list[str]:
    """The functions whose calls a request changed between two runs, most changed first."""
    changes = []
    for where in before.keys() | after.keys():
        then = before.get(where, ["", 0.0])[1]
        now = after.get(where, ["", 0.0])[1]
        if abs(now - then) >= 0.005:
            changes.append((now - then, where))
    changes.sort(key=lambda change: (-abs(change[0]), change[1]))
    return [f"  {delta:+7.2f}  {where}" for delta, where in changes] or ["    (none)"]


def versions() -> dict[str, str]:
    """What the count depends on beside the gateway: Python and the libraries on its path."""
    from importlib.metadata import version
    found = {"python": sys.version.split()[0]}
    for lib in ("aiohttp", "uvloop", "multidict", "yarl", "cachetools", "structlog"):
        found[lib] = version(lib)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flows", default=",".join(FLOWS))
    ap.add_argument("--requests", type=int, default=REQUESTS, help="requests a window")
    ap.add_argument("--windows", type=int, default=WINDOWS)
    ap.add_argument("--top", type=int, default=40, help="functions shown a flow")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--save", metavar="FILE", help="also write the figures to FILE (JSON)")
    ap.add_argument("--against", metavar="FILE", help="show what moved since a --save")
    args = ap.parse_args()
    measures = run(tuple(args.flows.split(",")), args.requests, args.windows)
    figures: dict[str, Any] = {"versions": versions(), "flows": {
        flow: summary(m, args.requests) for flow, m in measures.items()}}
    if args.save:
        Path(args.save).write_text(json.dumps(figures))
    if args.json:
        print(json.dumps(figures))
        return
    before = json.loads(Path(args.against).read_text())["flows"] if args.against else {}
    print(", ".join(f"{k} {v}" for k, v in figures["versions"].items()), end="\n\n")
    for flow, got in figures["flows"].items():
        print(table(flow, got, args.top, before.get(flow)), end="\n\n")


if __name__ == "__main__":
    main()
