#!/usr/bin/env python3
"""Replicas: one gateway with the memory store, one with a Redis store, and three sharing
one Redis, in the same run. For each: task creation rate (32 concurrent clients spread over
the replicas), store round trips per task created and per tasks/get, tasks/get throughput and
p99 per replica with wrk (16 connections on each replica at once), resident memory per
replica; with three, `tasks/get` on one replica of tasks running on another (answered from
announcements). Needs redis-server (or valkey-server) and wrk on PATH (Debian: redis-server, wrk).

    /tmp/gw/bin/python bench/replicas.py [--tasks 6000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tasks import TaskClient, rss_mib, running, task_gateway

from bench import free_port

WRK_SCRIPT = """
ids = {%s}
i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["MCP-Protocol-Version"] = "2026-07-28"
wrk.headers["Mcp-Method"] = "tasks/get"
request = function()
  i = i %% #ids + 1
  wrk.headers["Mcp-Name"] = ids[i]
  wrk.body = '{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"' .. ids[i] ..
    '","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",' ..
    '"io.modelcontextprotocol/clientCapabilities":{"extensions":' ..
    '{"io.modelcontextprotocol/tasks":{}}}}}}'
  return wrk.format()
end
"""


@contextlib.contextmanager
def redis_server() -> Any:
    binary = shutil.which("valkey-server") or shutil.which("redis-server")
    if binary is None:
        raise SystemExit("needs redis-server or valkey-server on PATH")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL)
    try:
        yield port
    finally:
        proc.kill()
        proc.wait()


async def store_requests(members: list[tuple[Any, TaskClient, int]]) -> int:
    """Requests the replicas have made to the store (their /readyz says)."""
    total = 0
    for _, client, port in members:
        async with client.http.get(f"http://127.0.0.1:{port}/readyz?detail") as resp:
            total += (await resp.json())["store"]["requests"]
    return total


@contextlib.asynccontextmanager
async def group(n: int, tasks: int, store: dict[str, Any] | None
                ) -> AsyncIterator[list[tuple[Any, TaskClient, int]]]:
    async with contextlib.AsyncExitStack() as stack:
        members = []
        for i in range(n):
            port = free_port()
            conf = task_gateway(port, tasks + 250)  # room for the running ones
            conf["tasks"]["defaults"]["mode"] = "always"
            if store is not None:
                conf["store"], conf["replica"] = store, {"id": f"r{i}",
                                                         "secret": "x" * 32}
            gateway, client = await stack.enter_async_context(running(conf))
            members.append((gateway, client, port))
        yield members


async def create(clients: list[TaskClient], n: int) -> list[str]:
    """n calls of 5 ms (meant to outlive the store's write: those that do not are answered
    inline, and are left out of the ids), 32 at a time, spread."""
    ids: list[str] = []
    todo = iter(range(n))

    async def worker(client: TaskClient) -> None:
        for _ in todo:
            result = await client.request("tools/call", {"name": "sleep",
                                                         "arguments": {"ms": 5}})
            if "taskId" in result:
                ids.append(result["taskId"])

    await asyncio.gather(*(worker(clients[i % len(clients)]) for i in range(32)))
    return ids


async def start_long(client: TaskClient, n: int) -> list[str]:
    """n tasks of a 60 s call on one replica, left running."""
    async def one(_: int) -> str:
        result = await client.request("tools/call", {"name": "sleep",
                                                     "arguments": {"ms": 60_000}})
        return str(result["taskId"])
    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def poll_running(members: list[tuple[Any, TaskClient, int]], seconds: float) -> str:
    """tasks/get on the second replica of tasks running on the first."""
    ids = await start_long(members[0][1], 200)
    before = await store_requests(members[1:2])
    rps, p99 = await wrk(members[1][2], ids, seconds)
    per_get = (await store_requests(members[1:2]) - before) / (rps * seconds)
    return (f"; running tasks read on another replica: {rps:.0f} req/s, p99 {p99:.1f} ms, "
            f"{per_get:.3f} round trips a get")


async def wrk(port: int, ids: list[str], seconds: float) -> tuple[float, float]:
    """tasks/get req/s and p99 (ms) on one replica."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(WRK_SCRIPT % ",".join(json.dumps(i) for i in ids[:2000]))
    proc = await asyncio.create_subprocess_exec(
        "wrk", "-t1", "-c16", f"-d{seconds:g}s", "--latency", "-s", f.name,
        f"http://127.0.0.1:{port}/mcp", stdout=asyncio.subprocess.PIPE)
    out = (await proc.communicate())[0].decode()
    Path(f.name).unlink()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    value, unit = re.search(r"99%\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
    return rps, float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


async def measure(label: str, n: int, tasks: int, seconds: float,
                  store: dict[str, Any] | None) -> None:
    async with group(n, tasks, store) as members:
        clients = [client for _, client, _ in members]
        before = await store_requests(members)
        loop = asyncio.get_running_loop()
        began = loop.time()
        ids = await create(clients, tasks)
        made_s = loop.time() - began
        per_task = (await store_requests(members) - before) / len(ids)
        before = await store_requests(members)
        polled = await asyncio.gather(*(wrk(port, ids, seconds) for _, _, port in members))
        total = sum(rps for rps, _ in polled)
        per_get = (await store_requests(members) - before) / (total * seconds)
        rss = [rss_mib(gateway.pid)[0] for gateway, _, _ in members]
        elsewhere = await poll_running(members, seconds) if n > 1 else ""
    print(f"{label}: {len(ids)} tasks created at {len(ids) / made_s:.0f}/s "
          f"({tasks - len(ids)} calls answered inline), "
          f"{per_task:.1f} store round trips a task; tasks/get {total:.0f} req/s in all ("
          + ", ".join(f"{rps:.0f}" for rps, _ in polled) + " per replica), p99 "
          + ", ".join(f"{p99:.1f}" for _, p99 in polled) + " ms, "
          + f"{per_get:.2f} round trips a get; RSS " + ", ".join(f"{r:.0f}" for r in rss)
          + " MiB" + elsewhere)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=6000)
    ap.add_argument("--seconds", type=float, default=10)
    args = ap.parse_args()
    with redis_server() as port:
        store = {"backend": "redis", "url": f"redis://127.0.0.1:{port}/0", "lease_ms": 10000}
        await measure("1 replica, memory store", 1, args.tasks, args.seconds, None)
        await measure("1 replica, Redis store", 1, args.tasks, args.seconds,
                      {**store, "key_prefix": "one:"})
        await measure("3 replicas, one Redis", 3, args.tasks, args.seconds,
                      {**store, "key_prefix": "three:"})


if __name__ == "__main__":
    asyncio.run(main())
