#!/usr/bin/env python3
"""Round trips to a shared store per task creation and per tasks/get, and calls/s, with wrk
driving peerbench's task phases (../shared/peerbench/wrkload.py) against one replica on a
Redis (docs/performance.md). The gateway counts what it sends the store (`requests` in
/readyz?detail: the store's scripts and reads, the outbox's, leases and channels); the
difference over a phase, divided by the calls wrk made, is the round trips a call costs.

    REDIS_URL=redis://127.0.0.1:6379/0 python3 bench/store_trips.py [--acked 1] [--seconds 8]

`--acked 1` makes every write wait for one store replica (Redis WAIT): attach one first
(`redis-server --port 6380 --replicaof 127.0.0.1 6379`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
import urllib.request

from peerab import PEERBENCH, redis_conf

PORT = 9190


def store_requests() -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/readyz?detail", timeout=5) as r:
        return int(json.loads(r.read())["store"]["requests"])


def phase(mode: str, seconds: int) -> dict[str, float]:
    before = store_requests()
    out = subprocess.run(["python3", str(PEERBENCH / "wrkload.py"), "--url",
                          f"http://127.0.0.1:{PORT}/mcp", "--mode", mode, "--seconds",
                          str(seconds)], capture_output=True, text=True, check=True)
    wrk = json.loads(out.stdout.strip().splitlines()[-1])
    trips = store_requests() - before
    return {"calls_per_s": wrk["calls_per_s"], "bad": wrk["bad"],
            "round_trips_per_call": round(trips / max(1, wrk["requests"]), 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--acked", type=int, default=0)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--gateway", default=os.environ.get("GATEWAY_CMD", "mcp-task-gateway"))
    a = ap.parse_args()
    conf = redis_conf(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), a.acked)
    gateway = subprocess.Popen([*a.gateway.split(), "--config", conf, "--host", "127.0.0.1",
                                "--port", str(PORT), "--", "python3",
                                str(PEERBENCH / "upstream.py")])
    try:
        for _ in range(100):
            try:
                store_requests()
                break
            except OSError:
                time.sleep(0.1)
        results = {mode: phase(mode, a.seconds) for mode in ("task-create", "task-get")}
        print(json.dumps({"acked": a.acked, **results}))
    finally:
        gateway.terminate()
        gateway.wait(10)


if __name__ == "__main__":
    main()
