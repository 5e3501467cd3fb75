#!/usr/bin/env python3
"""Soak: N tasks created and finished through the gateway, then L live tasks polled for S
seconds at 32 concurrent polls; the gateway's resident memory at each step and every error.

    /tmp/gw/bin/python bench/soak.py [--tasks 100000] [--live 1000] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time

from tasks import TaskClient, create, rss_mib, running, task_gateway

from bench import free_port


async def live_tasks(client: TaskClient, n: int) -> list[str]:
    """`n` tasks that run for longer than the soak (the server sleeps)."""
    ids: list[str] = []
    for _ in range(n):
        result = await client.request("tools/call", {"name": "sleep",
                                                     "arguments": {"ms": 600_000}})
        ids.append(result["taskId"])
    return ids


async def poll_for(client: TaskClient, ids: list[str], seconds: float) -> tuple[int, int]:
    """tasks/get on `ids` round robin, 32 at a time, for `seconds`: (polls, errors)."""
    picks = itertools.cycle(ids)
    counts = {"polls": 0, "errors": 0}
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        while time.monotonic() < deadline:
            try:
                result = await client.request("tasks/get", {"taskId": next(picks)})
                ok = result.get("status") == "working"
            except Exception:  # a dropped connection counts as an error too
                ok = False
            counts["polls"] += 1
            counts["errors"] += not ok

    await asyncio.gather(*(worker() for _ in range(32)))
    return counts["polls"], counts["errors"]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--live", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60)
    args = ap.parse_args()
    conf = task_gateway(free_port(), args.tasks + args.live,
                        max_calls_per_owner=args.live + 64)
    async with running(conf) as (gateway, client):
        start = rss_mib(gateway.pid)
        began = time.perf_counter()
        done = await create(client, args.tasks, 32)
        created_s = time.perf_counter() - began
        after_finished = rss_mib(gateway.pid)
        live = await live_tasks(client, args.live)
        polls, errors = await poll_for(client, live, args.seconds)
        end = rss_mib(gateway.pid)
    print(f"{len(done)} tasks created and finished in {created_s:.1f} s "
          f"({len(done) / created_s:.0f}/s)")
    print(f"RSS: {start[0]:.1f} MiB at the start, {after_finished[0]:.1f} MiB holding them "
          f"(+{after_finished[0] - start[0]:.1f} MiB, "
          f"{(after_finished[0] - start[0]) * 1048576 / len(done):.0f} bytes a task)")
    print(f"{len(live)} live tasks polled for {args.seconds:.0f} s: {polls} polls "
          f"({polls / args.seconds:.0f}/s), {errors} errors; RSS {end[0]:.1f} MiB, "
          f"peak {end[1]:.1f} MiB")


if __name__ == "__main__":
    asyncio.run(main())
