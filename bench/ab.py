#!/usr/bin/env python3
"""Two builds of the gateway side by side, in alternating rounds of one run: the gateway's
own CPU time per call (read from /proc, so less noisy than latency on a shared host), its
minor page faults per call (memory it had to touch afresh) and the calls a second, for
legacy echo calls against tests/servers/basic.py. For before/after figures of a change to
the hot path:

    git worktree add /tmp/before HEAD~1
    .venv/bin/python bench/ab.py /tmp/before . [--rounds 4] [--calls 4000] [--concurrency 8]
        [--payload BYTES]                     # e.g. --payload 1048576 --calls 100 --concurrency 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from pathlib import Path

from bench import SERVER, Http, free_port, wait_ready


def usage(pid: int) -> tuple[float, int]:
    """CPU seconds and minor page faults of process `pid` so far (proc(5): stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


async def one(tree: Path, calls: int, concurrency: int, payload: int
              ) -> tuple[float, float, float]:
    """(CPU µs per call, calls a second, page faults per call) of the gateway built from
    `tree`."""
    port = free_port()
    gateway = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "--port", str(port), "--log-level", "warning", "--",
        *SERVER, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)})
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        await wait_ready(url)
        client = Http(url)
        await client.start()
        echo = {"name": "echo", "arguments": {"text": "x" * payload}}
        for _ in range(20):  # warm-up
            await client.request("tools/call", echo)
        todo = iter(range(calls))

        async def worker() -> None:
            for _ in todo:
                await client.request("tools/call", echo)

        (used, faults), began = usage(gateway.pid), asyncio.get_running_loop().time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = asyncio.get_running_loop().time() - began
        used, faults = (now - then for now, then in zip(usage(gateway.pid), (used, faults),
                                                          strict=True))
        await client.close()
    finally:
        gateway.terminate()
        await gateway.wait()
    return used / calls * 1e6, calls / wall, faults / calls


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calls", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--payload", type=int, default=5, help="bytes of text echoed")
    args = ap.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    seen: dict[str, list[tuple[float, float, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            seen[name].append(await one(tree, args.calls, args.concurrency, args.payload))
    for name, rows in seen.items():
        cpu, rate, faults = ([round(x) for x in column] for column in zip(*rows, strict=True))
        print(f"{name:7} CPU µs/call {cpu} (median {statistics.median(cpu):.0f}); "
              f"calls/s {rate} (median {statistics.median(rate):.0f}); "
              f"page faults/call median {statistics.median(faults):.0f}")


if __name__ == "__main__":
    asyncio.run(main())
