#!/usr/bin/env python3
"""What webhooks cost (issue 52): one gateway process in front of peerbench's stdio upstream,
every echo a task at once (mode always, modern, the tasks extension), driven at 32 calls
at a time from here; the gateway's CPU a call read from /proc, its resident memory, and
each delivery's latency (its arrival at a receiver here minus the status's time,
`data.lastUpdatedAt`). Kinds, in interleaved rounds:

    none     no webhook configured
    hooked   one webhook, a receiver that answers 204 at once
    slow     one webhook whose receiver takes 2 s an answer (1,000 tasks ending at once:
             deliveries queue; calls must not notice, memory stays bounded)
    trickle  one webhook, a fast receiver, one call at a time (200 calls): the latency of a
             delivery that does not queue behind others

    python3 bench/push.py --rounds 3 [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import aiohttp
from aiohttp import web

from bench import wait_ready

HERE = Path(__file__).resolve().parent
UPSTREAM = HERE.parents[1] / "shared" / "peerbench" / "upstream.py"
SECRET = "whsec_" + base64.b64encode(b"bench receiver secret, 32 bytes!").decode()
META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": {"io.modelcontextprotocol/tasks": {}}}}
HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
           "Mcp-Method": "tools/call", "Mcp-Name": "echo"}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int, key: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


class Receiver:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.delay_s = 0.0

    async def hook(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        status_at = datetime.fromisoformat(body["data"]["lastUpdatedAt"]).timestamp()
        self.latencies.append(time.time() - status_at)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return web.Response(status=204)


async def calls(url: str, n: int, concurrency: int = 32) -> list[float]:
    """n task-creating echoes, `concurrency` at a time: each one's seconds."""
    took: list[float] = []
    sent = iter(range(n))
    async with aiohttp.ClientSession() as http:
        async def one() -> None:
            for i in sent:
                body = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
                    "name": "echo", "arguments": {"text": "hello"}, "_meta": META}}
                began = time.perf_counter()
                async with http.post(url, json=body, headers=HEADERS) as resp:
                    reply = await resp.json()
                assert reply["result"]["resultType"] == "task", reply
                took.append(time.perf_counter() - began)
        await asyncio.gather(*(one() for _ in range(concurrency)))
    return took


def config(port: int, hook: str | None) -> str:
    conf = {"listen": {"port": port}, "logging": {"level": "warning"},
            "upstreams": {"main": {"command": sys.executable, "args": [str(UPSTREAM)]}},
            "tasks": {"defaults": {"mode": "always"}},
            "limits": {"task_creations_per_s": 0, "task_requests_per_s": 0,
                       "max_tasks": 100_000, "max_tasks_per_owner": 100_000,
                       "max_finished_tasks_per_owner": 100_000}}
    if hook:
        conf["webhooks"] = [{"url": hook, "secret": SECRET}]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as out:
        json.dump(conf, out)
    return out.name


async def round_of(kind: str, n: int, receiver: Receiver, hook_url: str) -> dict[str, float]:
    port = 18_700
    receiver.latencies.clear()
    receiver.delay_s = 2.0 if kind == "slow" else 0.0
    path = config(port, None if kind == "none" else hook_url)
    cmd = os.environ.get("GATEWAY_CMD", f"{sys.executable} -m gateway").split()
    proc = subprocess.Popen([*cmd, "--config", path], cwd=HERE.parent,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        await wait_ready(url)
        await calls(url, 200)  # warm
        before, rss0 = cpu_s(proc.pid), rss_kib(proc.pid)
        began = time.perf_counter()
        took = await calls(url, n, 1 if kind == "trickle" else 32)
        wall = time.perf_counter() - began
        used = cpu_s(proc.pid) - before
        measured = kind in ("hooked", "trickle")
        for _ in range(100 if measured else 0):
            if len(receiver.latencies) >= n + 200:
                break
            await asyncio.sleep(0.1)
        lat = sorted(receiver.latencies[200:] if measured else [])
        return {"cpu_us": used / n * 1e6, "calls_s": n / wall,
                "p50_ms": statistics.median(took) * 1000,
                "rss_mib": rss_kib(proc.pid) / 1024,
                "rss_growth_mib": (rss_kib(proc.pid) - rss0) / 1024,
                "push_p50_ms": lat[len(lat) // 2] * 1000 if lat else 0.0,
                "push_p99_ms": lat[int(len(lat) * 0.99)] * 1000 if lat else 0.0}
    finally:
        proc.terminate()
        proc.wait(10)
        os.unlink(path)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/hook", receiver.hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 18_701).start()
    results: dict[str, list[dict[str, float]]] = {"none": [], "hooked": [], "slow": [],
                                                  "trickle": []}
    for _ in range(args.rounds):
        for kind in results:
            n = {"slow": 1000, "trickle": 200}.get(kind, args.calls)
            results[kind].append(await round_of(kind, n, receiver,
                                                "http://127.0.0.1:18701/hook"))
    await runner.cleanup()
    print(f"{'kind':8} " + " ".join(f"{k:>14}" for k in results["none"][0]))
    for kind, rows in results.items():
        print(f"{kind:8} " + " ".join(f"{statistics.median(r[k] for r in rows):14.1f}"
                                      for k in rows[0]))


if __name__ == "__main__":
    asyncio.run(main())
