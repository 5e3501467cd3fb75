#!/usr/bin/env python3
"""The gateway beside the stdio -> Streamable HTTP bridges people use today, in one run.

Each bridge fronts the same stdio server (tests/servers/basic.py) and gets bench.py's legacy
phases (echo at 1 and 32 concurrent calls, a 1 MiB request, 200 concurrent 2-second calls),
in interleaved rounds; then its peak resident memory. Bridges not installed are skipped.

    bench/peers.sh                          # installs the peers into bench/.peers
    .venv/bin/python bench/peers.py [--rounds 3] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import aiohttp

from bench import ROOT, SERVER, Http, free_port, peak_rss_mib, phases

PEERS_DIR = Path(os.environ.get("PEERS_DIR", ROOT / "bench" / ".peers"))
NPM_BIN = PEERS_DIR / "npm" / "node_modules" / ".bin"


def commands(port: int) -> dict[str, list[str]]:
    """The command that serves SERVER on `port` at /mcp, for each bridge."""
    server = " ".join(SERVER)
    return {
        "gateway": [sys.executable, "-m", "gateway", "--port", str(port), "--log-level",
                    "warning", "--", *SERVER],
        "mcp-proxy (PyPI)": [str(PEERS_DIR / "venv" / "bin" / "mcp-proxy"), "--host",
                             "127.0.0.1", "--port", str(port), "--log-level", "WARNING",
                             "--", *SERVER],
        "supergateway (npm)": [str(NPM_BIN / "supergateway"), "--stdio", server,
                               "--outputTransport", "streamableHttp", "--stateful", "--port",
                               str(port), "--logLevel", "none"],
        "mcp-proxy (npm)": [str(NPM_BIN / "mcp-proxy"), "--host", "127.0.0.1", "--port",
                            str(port), "--server", "stream", "--", *SERVER],
    }


async def measure(name: str, quick: bool) -> dict[str, Any] | None:
    port = free_port()
    cmd = commands(port)[name]
    if not Path(cmd[0]).exists():
        return None
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        await listening(url)
        figures: dict[str, Any] = await phases(lambda: Http(url), quick)
        figures["peak_rss_mib"] = peak_rss_mib(proc.pid)
        return figures
    except Exception as exc:  # a bridge that fails a phase is reported, not fatal
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}
    finally:
        proc.terminate()
        await proc.wait()


async def listening(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            try:
                async with http.get(url):
                    return
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} never listened")


def summary(runs: list[dict[str, Any]]) -> dict[str, float] | str:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]["error"]
    med = statistics.median
    return {"echo1_rps": med(r["echo1"]["rps"] for r in ok),
            "echo1_p50_ms": med(r["echo1"]["p50_ms"] for r in ok),
            "echo32_rps": med(r["echo32"]["rps"] for r in ok),
            "big_p50_ms": med(r["big"]["p50_ms"] for r in ok),
            "sleep_wall_s": med(r["sleep"]["wall_s"] for r in ok),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in ok)}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a tenth of the calls")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):  # interleaved: every bridge sees the same noise
        for name in commands(0):
            if (figures := await measure(name, args.quick)) is not None:
                runs.setdefault(name, []).append(figures)
    table = {name: summary(r) for name, r in runs.items()}
    print(f"{'bridge':20} {'C=1 req/s':>10} {'p50 ms':>7} {'C=32 req/s':>11} "
          f"{'1 MiB ms':>9} {'200x2s s':>9} {'peak MiB':>9}")
    for name, row in table.items():
        if isinstance(row, str):
            print(f"{name:20} failed: {row}")
            continue
        print(f"{name:20} {row['echo1_rps']:10.0f} {row['echo1_p50_ms']:7.2f} "
              f"{row['echo32_rps']:11.0f} {row['big_p50_ms']:9.1f} {row['sleep_wall_s']:9.2f} "
              f"{row['peak_rss_mib']:9.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
