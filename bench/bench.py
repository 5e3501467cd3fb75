#!/usr/bin/env python3
"""Pass-through benchmark: the gateway vs the same stdio server reached directly, one run,
for legacy clients (initialize and a session) and modern ones (2026-07-28, stateless).

Phases (each against a fresh gateway session and a fresh direct process):
  echo1   tools/call echo, one call at a time      -> req/s, p50, p99
  echo32  tools/call echo, 32 calls at a time      -> req/s, p50, p99
  big     1 MiB request echoed back (sequential)   -> p50 per call
  sleep   200 concurrent 2-second calls            -> wall time
The gateway's peak resident memory (VmHWM) is read at the end. Ratios are gateway/direct.
The machine's cores are shared by this load generator, the gateway and the server: compare
ratios within a run, not absolute numbers across machines.

    .venv/bin/python bench/bench.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "basic.py")]
INIT = {"protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "bench", "version": "1"}}


class Direct:
    """JSON-RPC over a child's stdio: the floor."""

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *SERVER, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=1 << 28)
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.reader = asyncio.create_task(self._read())
        await self.request("initialize", INIT)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            msg = json.loads(line)
            fut = self.pending.pop(msg.get("id"), None)
            if fut is not None:
                fut.set_result(msg)

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        rid = next(self.ids)
        fut = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                                          "params": params}).encode() + b"\n")
        await self.proc.stdin.drain()
        return (await fut)["result"]

    async def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        await self.proc.wait()
        self.reader.cancel()


class Http:
    """A minimal Streamable HTTP client: one session, JSON or SSE answers."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def start(self) -> None:
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self.ids = itertools.count(1)
        self.headers = {"Content-Type": "application/json",
                        "Accept": "application/json, text/event-stream"}
        async with self.http.post(self.url, json={"jsonrpc": "2.0", "id": 0,
                                                  "method": "initialize", "params": INIT},
                                  headers=self.headers) as resp:
            self.headers["Mcp-Session-Id"] = resp.headers["Mcp-Session-Id"]
            # JSON or SSE: bridges differ (the answer is the same).
            self.headers["MCP-Protocol-Version"] = (await result_of(resp))["protocolVersion"]
        async with self.http.post(self.url, json={"jsonrpc": "2.0",
                                                  "method": "notifications/initialized"},
                                  headers=self.headers):
            pass

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps({"jsonrpc": "2.0", "id": next(self.ids), "method": method,
                           "params": params}).encode()
        async with self.http.post(self.url, data=body, headers=self.headers) as resp:
            return await result_of(resp)

    async def close(self) -> None:
        async with self.http.delete(self.url, headers=self.headers):
            pass
        await self.http.close()


class Modern(Http):
    """A modern (2026-07-28) client: no session, every request carries its envelope."""

    headers: dict[str, str] = {}  # sent with every request (bench/auth.py: a token)

    async def start(self) -> None:
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                          headers=self.headers)
        self.ids = itertools.count(1)
        self.meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                     "io.modelcontextprotocol/clientCapabilities": {}}
        await self.request("server/discover", {})

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json",
                   "Accept": "application/json, text/event-stream",
                   "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method}
        name = params.get("name", params.get("taskId"))
        if name is not None:
            headers["Mcp-Name"] = name
        body = json.dumps({"jsonrpc": "2.0", "id": next(self.ids), "method": method,
                           "params": {**params, "_meta": self.meta}}).encode()
        async with self.http.post(self.url, data=body, headers=headers) as resp:
            return await result_of(resp)

    async def close(self) -> None:
        await self.http.close()


async def result_of(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    """The JSON-RPC result of an answer sent as JSON or as an SSE stream."""
    raw = await resp.read()
    if resp.status >= 400:
        raise RuntimeError(f"HTTP {resp.status}: {raw[:100]!r}")
    if resp.headers["Content-Type"].startswith("text/event-stream"):
        data = [ln[5:] for ln in raw.split(b"\n") if ln.startswith(b"data:")]
        return json.loads(data[-1])["result"]  # type: ignore[no-any-return]
    body = json.loads(raw)
    if "result" not in body:
        raise RuntimeError(f"no result: {body}")
    return body["result"]  # type: ignore[no-any-return]


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p / 100))]


async def run_calls(client: Any, n: int, concurrency: int, args: dict[str, Any],
                    tool: str = "echo") -> dict[str, float]:
    latencies: list[float] = []
    todo = iter(range(n))

    async def worker() -> None:
        for _ in todo:
            t0 = time.perf_counter()
            res = await client.request("tools/call", {"name": tool, "arguments": args})
            latencies.append(time.perf_counter() - t0)
            assert not res.get("isError"), res

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - began
    return {"rps": n / wall, "p50_ms": pct(latencies, 50) * 1000,
            "p99_ms": pct(latencies, 99) * 1000, "wall_s": wall}


async def phases(make: Any, quick: bool) -> dict[str, dict[str, float]]:
    scale = 10 if quick else 1
    plan = {
        "echo1": (2000 // scale, 1, {"text": "hello"}, "echo"),
        "echo32": (4000 // scale, 32, {"text": "hello"}, "echo"),
        "big": (10, 1, {"text": "x" * (1 << 20)}, "echo"),
        "sleep": (200, 200, {"ms": 2000}, "sleep"),
    }
    out = {}
    for name, (n, conc, args, tool) in plan.items():
        client = make()
        await client.start()
        await run_calls(client, 20, 1, {"text": "warm"})  # warm-up, not reported
        out[name] = await run_calls(client, n, conc, args, tool)
        await client.close()
    return out


async def wait_ready(url: str, timeout_s: float = 20) -> None:
    """Until the gateway serving `url` says it is ready (its /readyz answers 200)."""
    async with aiohttp.ClientSession() as http:
        for _ in range(int(timeout_s / 0.05)):
            try:
                async with http.get(url.replace("/mcp", "/readyz")) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
    raise SystemExit(f"{url} never became ready")  # rather than figures of a dead gateway


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tenth of the calls")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    port = free_port()
    gateway = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "--port", str(port), "--log-level", "warning", "--",
        *SERVER, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        await wait_ready(url)
        direct = await phases(Direct, args.quick)
        through = await phases(lambda: Http(url), args.quick)
        modern = await phases(lambda: Modern(url), args.quick)
        rss = peak_rss_mib(gateway.pid)
    finally:
        gateway.terminate()
        await gateway.wait()
    print("legacy clients (initialize, sessions):")
    report(direct, through)
    print("modern clients (2026-07-28, stateless):")
    report(direct, modern)
    print(f"gateway peak RSS: {rss:.1f} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps({"direct": direct, "gateway": through,
                                               "gateway_modern": modern,
                                               "gateway_peak_rss_mib": rss}, indent=1))


def report(direct: dict, through: dict) -> None:
    print(f"{'phase':8} {'metric':8} {'direct':>10} {'gateway':>10} {'ratio':>7}")
    for phase, metrics in (("echo1", ("rps", "p50_ms", "p99_ms")),
                           ("echo32", ("rps", "p50_ms", "p99_ms")),
                           ("big", ("p50_ms",)), ("sleep", ("wall_s",))):
        for m in metrics:
            d, g = direct[phase][m], through[phase][m]
            print(f"{phase:8} {m:8} {d:10.2f} {g:10.2f} {g / d:7.2f}")


if __name__ == "__main__":
    asyncio.run(main())
