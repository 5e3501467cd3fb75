#!/usr/bin/env python3
"""The gateway's server path in one process, without sockets: legacy echo calls fed to a
server protocol through a transport that collects the bytes written, so neither a syscall
nor a load generator is counted; CPU is this process's (the upstream's is its own). For
comparing ways of serving the same app side by side in alternating rounds:

    PYTHONPATH=. .venv/bin/python bench/inproc.py [--rounds 5] [--calls 3000] [--variants a,b]

Variants: `aiohttp` (before issue 54: aiohttp's Server over the app's handler), `gateway` (what
the app is served with now: downstream/serving.py), and the spikes
bench/below_web.py adds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import below_web  # type: ignore[import-not-found]
import orjson
from aiohttp import web

from gateway.app import create_app
from gateway.settings.load import from_mapping

ROOT = Path(__file__).resolve().parent.parent
BASIC = ROOT / "tests" / "servers" / "basic.py"
HEAD = ("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\n")


class Collector(asyncio.Transport):
    """A transport that keeps what is written and wakes whoever waits for a whole answer."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.waiter: asyncio.Future[bytes] | None = None
        self.closed = False

    def write(self, data: Any) -> None:
        self.out += data
        self._check()

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.out += chunk
        self._check()

    def _check(self) -> None:
        head_end = self.out.find(b"\r\n\r\n")
        if head_end < 0 or self.waiter is None:
            return
        head = bytes(self.out[:head_end]).lower()
        start = head.find(b"content-length:")
        if start < 0:
            return
        length = int(head[start + 15:head.find(b"\r\n", start) if
                          head.find(b"\r\n", start) > 0 else None])
        if len(self.out) >= head_end + 4 + length:
            answer = bytes(self.out[:head_end + 4 + length])
            del self.out[:head_end + 4 + length]
            self.waiter.set_result(answer)
            self.waiter = None

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def request(body: dict[str, Any], session: str | None) -> bytes:
    raw = orjson.dumps(body)
    head = HEAD + (f"Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-06-18\r\n"
                   if session else "")
    return f"{head}Content-Length: {len(raw)}\r\n\r\n".encode() + raw


async def call(proto: asyncio.Protocol, wire: Collector, data: bytes) -> bytes:
    wire.waiter = asyncio.get_running_loop().create_future()
    proto.data_received(data)
    return await wire.waiter


Factory = Callable[[web.Application], Any]  # an app -> a protocol factory


async def connect(factory: Any) -> tuple[asyncio.Protocol, Collector]:
    proto = factory()
    wire = Collector()
    proto.connection_made(wire)
    return proto, wire


async def session_of(proto: asyncio.Protocol, wire: Collector) -> str:
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "c", "version": "1"}}}
    answer = await call(proto, wire, request(init, None))
    for line in answer.split(b"\r\n"):
        if line.lower().startswith(b"mcp-session-id:"):
            return line.split(b":", 1)[1].strip().decode()
    return "none"  # the null variants' (no gateway behind them)


def aiohttp_factory(app: web.Application) -> Any:
    """Before issue 54: the app's own handler behind aiohttp's Server (what aiohttp's
    Application._make_handler makes)."""
    return web.Server(app._handle, request_factory=app._make_request,
                      loop=asyncio.get_running_loop(), access_log=None,
                      auto_decompress=False, handler_cancellation=True)


def gateway_factory(app: web.Application) -> Any:
    """What the app's runners serve it with (downstream/serving.py since issue 54)."""
    return app._make_handler(loop=asyncio.get_running_loop(), access_log=None,
                             auto_decompress=False, handler_cancellation=True)


VARIANTS: dict[str, Factory] = {"aiohttp": aiohttp_factory, "gateway": gateway_factory,
                                "handler": below_web.lean_factory,
                                "raw": below_web.raw_factory,
                                "sub": below_web.sub_factory,
                                "null-web": below_web.null_web_factory,
                                "null-raw": below_web.null_raw_factory,
                                "null-lean": below_web.null_lean_factory}


async def rounds(names: list[str], n: int, count: int, concurrency: int) -> dict[str, list[float]]:
    conf = from_mapping({"upstreams": {"main": {"command": sys.executable,
                                                "args": [str(BASIC)]}},
                         "logging": {"level": "warning"}})
    app = create_app(conf)
    runner = web.AppRunner(app)  # startup (the upstream) and the app frozen
    await runner.setup()
    conns: dict[str, list[tuple[asyncio.Protocol, Collector, bytes]]] = {}
    echo = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "hello"}}}
    for name in names:
        conns[name] = []
        for _ in range(concurrency):
            proto, wire = await connect(VARIANTS[name](app))
            conns[name].append((proto, wire, request(echo, await session_of(proto, wire))))
    seen: dict[str, list[float]] = {name: [] for name in names}

    async def loop(proto: asyncio.Protocol, wire: Collector, data: bytes, k: int) -> None:
        for _ in range(k):
            answer = await call(proto, wire, data)
        assert b'"hello"' in answer or answer.endswith(b"{}"), answer
    for _ in range(n):
        for name, group in conns.items():
            await asyncio.gather(*(loop(*c, 50) for c in group))  # warm
            began = time.process_time()
            await asyncio.gather(*(loop(*c, count // concurrency) for c in group))
            seen[name].append((time.process_time() - began) / count * 1e6)
    await runner.cleanup()
    return seen


async def serve(name: str, port: int) -> None:
    """One variant on a real socket (bench/below_ab.py drives it with wrk)."""
    conf = from_mapping({"upstreams": {"main": {"command": sys.executable,
                                                "args": [str(BASIC)]}},
                         "logging": {"level": "warning"}})
    app = create_app(conf)
    runner = web.AppRunner(app)
    await runner.setup()
    factory = VARIANTS[name](app)
    server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--asyncio", action="store_true", help="asyncio's loop, not uvloop")
    ap.add_argument("--serve", help="serve this variant on --port instead")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    factory = asyncio.new_event_loop
    if not args.asyncio:
        import uvloop
        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        if args.serve:
            runner.run(serve(args.serve, args.port))
            return
        seen = runner.run(rounds(args.variants.split(","), args.rounds, args.calls,
                                  args.concurrency))
    for name, cpu in seen.items():
        print(f"{name:10} CPU µs/call {[round(c) for c in cpu]} "
              f"median {statistics.median(cpu):.1f}")


if __name__ == "__main__":
    main()
