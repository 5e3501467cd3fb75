#!/usr/bin/env python3
"""How close the gateway comes to what any HTTP bridge can reach on this host, one run:
the direct stdio floor, the gateway, the thinnest aiohttp bridge (bench/thin_bridge.py: an
id rewritten, nothing else), and two bridges with no server behind them (thin_bridge.py
`--null` on aiohttp, bench/null_bridge.mjs on Node): what HTTP alone costs with this load
generator. Interleaved rounds, medians. Besides latency and throughput, the CPU each bridge
spends per echo call (from /proc) and what this load generator spends itself: a bridge can
serve no faster than its client can ask.

    .venv/bin/python bench/ceiling.py [--rounds 3] [--calls 4000] [--node PATH] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from ab import usage

from bench import ROOT, SERVER, Direct, Http, free_port, peak_rss_mib, run_calls

BIG = {"text": "x" * (1 << 20)}
NODE = ROOT / "tests" / "node" / "node_modules" / "node" / "bin" / "node"


def bridges(node: str | None) -> dict[str, Callable[[int], list[str]]]:
    """The command of each bridge, given its port."""
    py, here = sys.executable, str(ROOT / "bench")
    made: dict[str, Callable[[int], list[str]]] = {
        "gateway": lambda port: [py, "-m", "gateway", "--port", str(port),
                                 "--log-level", "warning", "--", *SERVER],
        "thin": lambda port: [py, f"{here}/thin_bridge.py", "--port", str(port), "--",
                              *SERVER],
        "null-aiohttp": lambda port: [py, f"{here}/thin_bridge.py", "--port", str(port),
                                      "--null"],
    }
    if node:
        made["null-node"] = lambda port: [node, f"{here}/null_bridge.mjs", str(port)]
    return made


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(make: Callable[[], Any], calls: int, pid: int | None
                  ) -> dict[str, float]:
    """echo1 p50, echo32 calls/s with the CPU per call of bridge and load generator, and
    the 1 MiB echo's p50, each on a fresh session."""
    out: dict[str, float] = {}
    for phase, n, conc, args in (("echo1", calls // 2, 1, {"text": "hello"}),
                                 ("echo32", calls, 32, {"text": "hello"}),
                                 ("big", 20, 1, BIG)):
        client = make()
        await client.start()
        await run_calls(client, 20, 1, {"text": "warm"})
        cpu0, mine0 = usage(pid)[0] if pid else 0.0, own_cpu()
        got = await run_calls(client, n, conc, args)
        if phase == "echo32":
            out["bridge_us"] = ((usage(pid)[0] if pid else 0.0) - cpu0) / n * 1e6
            out["client_us"] = (own_cpu() - mine0) / n * 1e6
            out["echo32_rps"] = got["rps"]
        else:
            out[f"{phase}_p50_ms"] = got["p50_ms"]
        await client.close()
    return out


async def started(cmd: list[str], url: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.DEVNULL)
    if not await answering(url):
        proc.kill()
        raise SystemExit(f"{cmd[0]} never answered at {url}")
    return proc


async def answering(url: str, timeout_s: float = 10) -> bool:
    """Whether the bridge at `url` answers initialize within `timeout_s` (not all of them
    have a /readyz)."""
    for _ in range(int(timeout_s / 0.05)):
        probe = Http(url)
        try:
            await probe.start()
            await probe.close()
            return True
        except (aiohttp.ClientError, KeyError, RuntimeError):
            if hasattr(probe, "http"):
                await probe.http.close()
            await asyncio.sleep(0.05)
    return False


async def one_round(made: dict[str, Callable[[int], list[str]]], calls: int
                    ) -> dict[str, dict[str, float]]:
    figures = {"direct": await measure(Direct, calls, None)}
    for name, cmd in made.items():
        port = free_port()
        url = f"http://127.0.0.1:{port}/mcp"
        proc = await started(cmd(port), url)
        try:
            figures[name] = await measure(lambda u=url: Http(u), calls, proc.pid)
            figures[name]["rss_mib"] = peak_rss_mib(proc.pid)
        finally:
            proc.terminate()
            await proc.wait()
    return figures


def report(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    med = {name: {k: statistics.median(r[name][k] for r in rounds) for k in rounds[0][name]}
           for name in rounds[0]}
    floor = med["direct"]
    print(f"{'bridge':13} {'echo1 p50':>10} {'x floor':>7} {'echo32/s':>9} {'% floor':>7} "
          f"{'1 MiB p50':>10} {'x floor':>7} {'bridge µs':>9} {'client µs':>9} {'RSS':>6}")
    for name, m in med.items():
        x1 = m["echo1_p50_ms"] / floor["echo1_p50_ms"]
        share = 100 * m["echo32_rps"] / floor["echo32_rps"]
        print(f"{name:13} {m['echo1_p50_ms']:10.3f} {x1:7.2f} {m['echo32_rps']:9.0f} {share:6.0f}%"
              f" {m['big_p50_ms']:10.2f} {m['big_p50_ms'] / floor['big_p50_ms']:7.2f}"
              f" {m.get('bridge_us', 0):9.0f} {m['client_us']:9.0f} {m.get('rss_mib', 0):6.1f}")
    return med


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=4000, help="echo calls at concurrency 32")
    ap.add_argument("--node", default=str(NODE) if NODE.exists() else shutil.which("node"),
                    help="node for bench/null_bridge.mjs (left out without one)")
    ap.add_argument("--json", help="also write the medians to this file")
    args = ap.parse_args()
    made = bridges(args.node)
    rounds = [await one_round(made, args.calls) for _ in range(args.rounds)]
    med = report(rounds)
    if args.json:
        Path(args.json).write_text(json.dumps({"medians": med, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
