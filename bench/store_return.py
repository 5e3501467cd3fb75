#!/usr/bin/env python3
"""A store back empty: how soon replicas notice, and what a poller of a live task reads.

Two gateway replicas (the default `store.lease_ms`, 10 s: a beat every 3.3 s) share a
redis-server without persistence. In each round a task runs on replica r0 while a client
polls it on r1 every 50 ms; the store is killed and started again at once, empty. Reported
per round: how long after the store answered again each replica's lease was back (it beat
in the new store: it noticed), when the task was readable on r1 again, and how many polls
read "Task not found" (a poller gives up on those) or "retry" (503, Retry-After).
`--root` names the checkout whose gateway runs (to measure another branch the same way).

    .venv/bin/python bench/store_return.py [--rounds 5] [--lease-ms 10000] [--root DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from bench import free_port, wait_ready

ROOT = Path(__file__).parents[1]
TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
TOKEN = {"Authorization": "Bearer bench-token"}


class Store:
    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.folder = tempfile.mkdtemp(prefix="store-return-")

    def start(self) -> None:
        binary = shutil.which("valkey-server") or shutil.which("redis-server")
        assert binary, "needs redis-server or valkey-server"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.folder],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)


async def answering(client: aioredis.Redis) -> None:
    while True:
        try:
            await client.ping()
            return
        except Exception:  # not up yet
            await asyncio.sleep(0.005)


def replica(root: Path, name: str, store: Store, lease_ms: int
            ) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    conf = {"listen": {"host": "127.0.0.1", "port": port},
            "upstreams": {"main": {"command": sys.executable,
                                   "args": [str(root / "tests/servers/basic.py")]}},
            "tasks": {"defaults": {"mode": "auto", "sync_budget_ms": 200}},
            "auth": {"bearer_tokens": ["bench-token"]},
            "store": {"backend": "redis", "url": f"redis://127.0.0.1:{store.port}/0",
                      "lease_ms": lease_ms},
            "replica": {"id": name, "secret": "a bench secret of the replicas",
                        "url": f"http://127.0.0.1:{port}"},
            "logging": {"level": "error"}}
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        json.dump(conf, f)
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "--config", path], cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}/mcp"


async def modern(http: aiohttp.ClientSession, url: str, method: str, params: dict[str, Any]
                 ) -> tuple[int, dict[str, Any]]:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": TASKS}
    params = {**params, "_meta": meta}
    name = params.get("name", params.get("taskId"))
    headers = {"Content-Type": "application/json",
               "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method, "Mcp-Name": name,
               **TOKEN}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    async with http.post(url, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def round_(http: aiohttp.ClientSession, store: Store, urls: list[str],
                 names: list[str]) -> dict[str, Any]:
    _, made = await modern(http, urls[0], "tools/call", {"name": "sleep",
                                                         "arguments": {"ms": 20_000}})
    task_id = made["result"]["taskId"]
    client = aioredis.Redis(port=store.port)
    store.kill()
    store.start()
    await answering(client)
    back = time.monotonic()
    noticed: dict[str, float] = {}
    polls = {"task": 0, "retry": 0, "not found": 0, "unavailable": 0}
    readable: float | None = None
    while len(noticed) < len(names) or readable is None:
        now = time.monotonic() - back
        if now > 30:
            break
        for name in names:
            if name not in noticed and await client.exists(f"mcpgw:lease:{name}"):
                noticed[name] = now
        status, body = await modern(http, urls[1], "tasks/get", {"taskId": task_id})
        kind = ("task" if status == 200 else "retry" if status == 503 and
                body["error"].get("data", {}).get("reason") == "store_settling" else
                "unavailable" if status == 503 else "not found")
        polls[kind] += 1
        if kind == "task" and readable is None:
            readable = now
        await asyncio.sleep(0.05)
    await modern(http, urls[0], "tasks/cancel", {"taskId": task_id})
    await client.aclose()
    return {"noticed_s": noticed, "readable_on_r1_s": readable, "polls": polls}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lease-ms", type=int, default=10_000)
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args()
    store = Store()
    store.start()
    names = ["r0", "r1"]
    procs = [replica(args.root.resolve(), n, store, args.lease_ms) for n in names]
    urls = [url for _, url in procs]
    rounds = []
    try:
        async with aiohttp.ClientSession() as http:
            for url in urls:
                await wait_ready(url, 30)
            for i in range(args.rounds):
                await asyncio.sleep(1 + i * 0.7)  # a different phase of the beats each round
                rounds.append(await round_(http, store, urls, names))
                print(json.dumps(rounds[-1]))
    finally:
        for proc, _ in procs:
            proc.terminate()
            proc.wait(15)
        store.kill()
        shutil.rmtree(store.folder, ignore_errors=True)
    noticed = [t for r in rounds for t in r["noticed_s"].values()]
    print(f"noticed after (s): median {statistics.median(noticed):.2f}, max {max(noticed):.2f};"
          f" 'not found' polls: {sum(r['polls']['not found'] for r in rounds)}, 'retry' polls: "
          f"{sum(r['polls']['retry'] for r in rounds)}")


if __name__ == "__main__":
    asyncio.run(main())
