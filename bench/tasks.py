#!/usr/bin/env python3
"""Task benchmark: create N tasks (mode always, completed at once), then measure tasks/get
throughput and latency at 32 concurrent polls, and the gateway's resident memory before and
after, with N completed tasks held in its store.

    .venv/bin/python bench/tasks.py [--tasks 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from bench import SERVER, Modern, free_port, pct

ROOT = Path(__file__).resolve().parents[1]
TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}


class TaskClient(Modern):
    async def start(self) -> None:
        await super().start()
        self.meta["io.modelcontextprotocol/clientCapabilities"] = TASKS


def rss_mib(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines() if line.startswith(("VmRSS", "VmHWM")))
    return tuple(int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))  # type: ignore


async def create(client: TaskClient, n: int, concurrency: int) -> list[str]:
    ids: list[str] = []
    todo = iter(range(n))

    async def worker() -> None:
        for _ in todo:
            result = await client.request("tools/call", {"name": "echo",
                                                         "arguments": {"text": "hi"}})
            ids.append(result["taskId"])

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ids


async def poll(client: TaskClient, ids: list[str], n: int, concurrency: int) -> dict:
    latencies: list[float] = []
    picks = itertools.cycle(ids[:: max(1, len(ids) // n)])

    async def worker() -> None:
        while len(latencies) < n:
            task_id = next(picks)
            t0 = time.perf_counter()
            result = await client.request("tasks/get", {"taskId": task_id})
            latencies.append(time.perf_counter() - t0)
            assert result["status"] == "completed", result

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - began
    return {"rps": len(latencies) / wall, "p50_ms": pct(latencies, 50) * 1000,
            "p99_ms": pct(latencies, 99) * 1000}


def task_gateway(port: int, tasks: int, **limits: int) -> dict:
    """Settings of a gateway whose every call becomes a task, holding `tasks` of them; no
    rate limits: the engine's own speed is measured."""
    return {"listen": {"port": port},
            "upstreams": {"main": {"command": SERVER[0], "args": SERVER[1:]}},
            "tasks": {"defaults": {"mode": "always", "ttl_ms": 3_600_000}},
            "limits": {"max_tasks": tasks + 10, "max_tasks_per_owner": tasks + 10,
                       "max_finished_tasks_per_owner": tasks + 10,
                       "task_requests_per_s": 0, "task_creations_per_s": 0, **limits},
            "logging": {"level": "warning"}}


@contextlib.asynccontextmanager
async def running(conf: dict, tree: Path = ROOT
                  ) -> AsyncIterator[tuple[asyncio.subprocess.Process, TaskClient]]:
    """The gateway (of `tree`) as a process of its own with `conf`, and a task-capable
    client of it."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        json.dump(conf, f)  # JSON is YAML
    gateway = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "--config", f.name, cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)})
    try:
        await asyncio.sleep(2)
        client = TaskClient(f"http://127.0.0.1:{conf['listen']['port']}/mcp")
        await client.start()
        try:
            yield gateway, client
        finally:
            await client.close()
    finally:
        gateway.terminate()
        await gateway.wait()
        os.unlink(f.name)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    args = ap.parse_args()
    async with running(task_gateway(free_port(), args.tasks)) as (gateway, client):
        before = rss_mib(gateway.pid)
        began = time.perf_counter()
        ids = await create(client, args.tasks, 32)
        created_s = time.perf_counter() - began
        held = rss_mib(gateway.pid)
        polled = await poll(client, ids, 10_000, 32)
    print(f"created {len(ids)} tasks in {created_s:.1f} s ({len(ids) / created_s:.0f}/s)")
    print(f"tasks/get at 32 concurrent: {polled['rps']:.0f} req/s, p50 {polled['p50_ms']:.2f} ms,"
          f" p99 {polled['p99_ms']:.2f} ms")
    print(f"gateway RSS: {before[0]:.1f} MiB before, {held[0]:.1f} MiB holding {len(ids)} "
          f"completed tasks ({(held[0] - before[0]) * 1024 * 1024 / len(ids):.0f} bytes each);"
          f" peak {held[1]:.1f} MiB")


if __name__ == "__main__":
    asyncio.run(main())
