#!/usr/bin/env python3
"""Flame graphs of the gateway's hot paths, recorded with py-spy (PyPI `py-spy`): one gateway
per phase, run under `py-spy record`, in front of tests/servers/basic.py, while bench.py's
legacy client drives it (py-spy attaches after a warm-up, so start-up is not sampled).
Writes bench/profiles/<phase>.svg (open in a browser: wider is more time) and prints the
frames with the most samples; with `--raw`, <phase>.txt (collapsed stacks, one a line with
its count) and the frames with the most samples of their own (self time).

    pip install -e ".[profile]"                    # py-spy 0.4.3
    .venv/bin/python bench/profile.py [--phases echo1,echo32,big] [--rate 500] [--raw]
"""

from __future__ import annotations

import argparse
import asyncio
import html
import os
import re
import signal
import sys
from pathlib import Path

from bench import ROOT, SERVER, Http, free_port, run_calls, wait_ready

OUT = ROOT / "bench" / "profiles"
TOP = 40  # frames printed, by samples
PHASES = {  # calls, concurrency, arguments
    "echo1": (4000, 1, {"text": "hello"}),
    "echo32": (12000, 32, {"text": "hello"}),
    "big": (40, 1, {"text": "x" * (1 << 20)}),
}


async def profile(phase: str, rate: int, raw: bool) -> None:
    n, concurrency, args = PHASES[phase]
    port = free_port()
    out = OUT / f"{phase}.{'txt' if raw else 'svg'}"
    gateway = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "--port", str(port), "--log-level", "warning", "--",
        *SERVER, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}/mcp"
    await wait_ready(url)
    client = Http(url)
    await client.start()
    await run_calls(client, 200, 1, {"text": "warm"})  # imports and first calls: not shown
    spy = await asyncio.create_subprocess_exec(  # attached: the phase alone is sampled
        str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(gateway.pid),
        "--rate", str(rate), "--format", "raw" if raw else "flamegraph", "--output", str(out),
        "--nonblocking",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    await asyncio.sleep(0.5)
    figures = await run_calls(client, n, concurrency, args)
    spy.send_signal(signal.SIGINT)  # py-spy writes its graph when interrupted
    await spy.wait()
    await client.close()
    gateway.terminate()
    await gateway.wait()
    print(f"{phase}: {figures['rps']:.0f} req/s, p50 {figures['p50_ms']:.2f} ms under py-spy "
          f"-> {out.relative_to(ROOT)}")
    for share, frame in (own(out, TOP) if raw else top(out, TOP)):
        print(f"  {share:5.1f}%  {frame}")


def top(svg: Path, count: int) -> list[tuple[float, str]]:
    """The frames with the most samples (inclusive), from the flame graph's own titles."""
    found: dict[str, float] = {}
    for title in re.findall(r"<title>(.*?)</title>", svg.read_text()):
        m = re.match(r"(.*) \((\d[\d,]*) samples, ([\d.]+)%\)$", html.unescape(title))
        if m:
            found[m[1]] = max(found.get(m[1], 0.0), float(m[3]))
    return sorted(((share, frame) for frame, share in found.items()), reverse=True)[:count]


def own(collapsed: Path, count: int) -> list[tuple[float, str]]:
    """The frames with the most samples of their own (the leaf of each stack)."""
    found: dict[str, int] = {}
    for line in collapsed.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        leaf = stack.rsplit(";", 1)[-1]
        found[leaf] = found.get(leaf, 0) + int(samples)
    total = sum(found.values()) or 1
    return sorted(((100 * n / total, f) for f, n in found.items()), reverse=True)[:count]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--rate", type=int, default=500, help="samples a second")
    ap.add_argument("--raw", action="store_true", help="collapsed stacks and self time")
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    for phase in args.phases.split(","):
        await profile(phase, args.rate, args.raw)


if __name__ == "__main__":
    asyncio.run(main())
