#!/usr/bin/env python3
"""What an Idempotency-Key costs on the call path (issue 50): wrk at 32 connections sends
echo on one legacy session of one gateway in front of peerbench's stdio upstream, in
interleaved rounds of three kinds, and the gateway's own CPU a call is read from /proc:

    plain    tools/call echo, no key (peerbench's `wrk32` phase)
    keyed    each call with a fresh key: each runs once as a task (created, run, its end
             written, its answer read)
    replay   every call with the same key: each is answered from the one task kept

    GATEWAY_CMD=.venv/bin/mcp-task-gateway python3 bench/keyed.py --rounds 3

Task creation is unrated here (`limits.task_creations_per_s: 0`): a keyed call is a task,
and by default a principal makes at most 100 a second.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
UPSTREAM = HERE.parents[1] / "shared" / "peerbench" / "upstream.py"
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
LUA = r"""
local n = 0
bad = 0
local threads = {}
function setup(thread) table.insert(threads, thread) end
local session, kind = os.getenv("MCP_SESSION"), os.getenv("KIND")
function request()
  n = n + 1
  local h = {["Content-Type"] = "application/json",
             ["Accept"] = "application/json, text/event-stream",
             ["MCP-Protocol-Version"] = "2025-06-18", ["Mcp-Session-Id"] = session}
  if kind == "keyed" then h["Idempotency-Key"] = "k-" .. n
  elseif kind == "replay" then h["Idempotency-Key"] = "the-one" end
  local body = '{"jsonrpc":"2.0","id":' .. n .. ',"method":"tools/call","params":' ..
               '{"name":"echo","arguments":{"text":"hello world"}}}'
  return wrk.format("POST", nil, h, body)
end
function response(status, headers, body)
  if status ~= 200 or not string.find(body, '"hello world"', 1, true) then bad = bad + 1 end
end
function done(summary, latency, requests)
  local b = 0
  for _, t in ipairs(threads) do b = b + t:get("bad") end
  io.write(string.format('WRKJSON {"bad":%d,"requests":%d,"duration_us":%d,"p50_us":%d}\n',
    b, summary.requests, summary.duration, latency:percentile(50)))
end
"""


def post(url: str, body: dict[str, object], sid: str | None = None) -> str | None:
    headers = {**HEADERS, **({"Mcp-Session-Id": sid} if sid else {})}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()
        return resp.headers.get("Mcp-Session-Id")


def session(url: str) -> str:
    sid = post(url, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "bench-keyed", "version": "1"}}})
    assert sid
    post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    return sid


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(url: str, sid: str, kind: str, pid: int, seconds: int, script: str) -> dict[str, float]:
    before = cpu_s(pid)
    out = subprocess.run(["wrk", "-t1", "-c32", f"-d{seconds}s", "--timeout", "10s", "-s",
                          script, url], capture_output=True, text=True, check=True,
                         env={**os.environ, "MCP_SESSION": sid, "KIND": kind}).stdout
    used = cpu_s(pid) - before
    line = next(x for x in out.splitlines() if x.startswith("WRKJSON "))
    r = json.loads(line[len("WRKJSON "):])
    if r["bad"]:
        raise SystemExit(f"{kind}: {r['bad']} answers without the echo")
    return {"calls_per_s": r["requests"] / (r["duration_us"] / 1e6),
            "cpu_us_per_call": used / r["requests"] * 1e6, "p50_us": r["p50_us"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--port", type=int, default=9140)
    a = ap.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    folder = Path(tempfile.mkdtemp())
    conf = folder / "keyed.json"
    conf.write_text(json.dumps({"logging": {"level": "warning"},
                                "limits": {"task_creations_per_s": 0}}))
    script = folder / "keyed.lua"
    script.write_text(LUA)
    cmd = os.environ.get("GATEWAY_CMD", "mcp-task-gateway").split()
    proc = subprocess.Popen([*cmd, "--config", str(conf), "--host", "127.0.0.1", "--port",
                             str(a.port), "--", "python3", str(UPSTREAM)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{a.port}/mcp"
    try:
        for _ in range(100):
            try:
                sid = session(url)
                break
            except OSError:
                time.sleep(0.1)
        got: dict[str, list[dict[str, float]]] = {"plain": [], "keyed": [], "replay": []}
        for _ in range(a.rounds):
            for kind, results in got.items():
                results.append(run(url, sid, kind, proc.pid, a.seconds, str(script)))
        print(f"{'kind':8} {'calls/s':>9} {'CPU us a call':>14} {'p50 us':>8}  (medians of "
              f"{a.rounds} rounds)")
        for kind, results in got.items():
            med = {k: statistics.median(r[k] for r in results) for k in results[0]}
            print(f"{kind:8} {med['calls_per_s']:9.0f} {med['cpu_us_per_call']:14.0f} "
                  f"{med['p50_us']:8.0f}")
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
