#!/usr/bin/env python3
"""bench/inproc.py's variants on real sockets, side by side in alternating rounds: each
served by a process of its own, driven by peerbench's wrk load (legacy echo, 32
connections); the server's own CPU a call from /proc, calls a second, wrk's p50 latency.
A variant that is a directory is a build of the gateway (`python -m gateway` from it, as
bench/ab.py runs); `thin` is bench/thin_bridge.py.

    PYTHONPATH=. .venv/bin/python bench/below_ab.py [--variants aiohttp,gateway,raw]
        [--rounds 4]                    # or --variants /tmp/before,.
        [--mode task-get --config bench/gateway-tasks.yaml]   # another of wrkload's phases
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ab import usage

from bench import free_port

HERE = Path(__file__).resolve().parent
WRKLOAD = HERE.parent.parent / "shared" / "peerbench" / "wrkload.py"


def ready(url: str) -> None:
    for _ in range(100):
        try:
            urllib.request.urlopen(url.replace("/mcp", "/healthz"), timeout=1).read()
            return
        except urllib.error.HTTPError:  # listening (the thin bridge has no /healthz)
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("not ready")


def one(variant: str, seconds: int, connections: int, mode: str = "echo",
        config: str | None = None) -> tuple[float, float, float]:
    port = free_port()
    if Path(variant).is_dir():  # a build of the gateway, as ab.py runs one
        server = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--port", str(port), "--log-level", "warning",
             *(["--config", str(Path(config).resolve())] if config else []),
             "--", sys.executable, str(HERE.parent / "tests" / "servers" / "basic.py")],
            cwd=variant, env={**os.environ, "PYTHONPATH": variant}, stderr=subprocess.DEVNULL)
    elif variant == "thin":  # bench/thin_bridge.py: the ratio the targets are in
        server = subprocess.Popen(
            [sys.executable, str(HERE / "thin_bridge.py"), "--port", str(port), "--",
             sys.executable, str(HERE.parent / "tests" / "servers" / "basic.py")],
            stderr=subprocess.DEVNULL)
    else:
        server = subprocess.Popen([sys.executable, str(HERE / "inproc.py"), "--serve",
                                   variant, "--port", str(port)], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        ready(url)
        before = usage(server.pid)[0]
        out = subprocess.run([sys.executable, str(WRKLOAD), "--url", url, "--seconds",
                              str(seconds), "--connections", str(connections),
                              "--mode", mode],
                             capture_output=True, text=True, check=True).stdout
        used = usage(server.pid)[0] - before
    finally:
        server.terminate()
        server.wait()
    result = json.loads(out.strip().splitlines()[-1])
    calls = result.get("requests") or result.get("calls")
    rate = result.get("calls_per_s") or calls / (result["duration_us"] / 1e6)
    return used / calls * 1e6, rate, result["p50_us"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default="aiohttp,gateway")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--mode", default="echo", help="wrkload.py's: echo, echo-modern, "
                    "task-create, task-get")
    ap.add_argument("--config", help="the gateways' settings (bench/gateway-tasks.yaml)")
    args = ap.parse_args()
    seen: dict[str, list[tuple[float, float, float]]] = {
        v: [] for v in args.variants.split(",")}
    for _ in range(args.rounds):
        for variant, rows in seen.items():
            rows.append(one(variant, args.seconds, args.connections, args.mode, args.config))
    for variant, rows in seen.items():
        cpu, rate, p50 = ([round(x) for x in column] for column in zip(*rows, strict=True))
        print(f"{variant:8} CPU µs/call {cpu} median {statistics.median(cpu)}; "
              f"calls/s {rate} median {statistics.median(rate)}; "
              f"p50 µs median {statistics.median(p50)}")


if __name__ == "__main__":
    main()
