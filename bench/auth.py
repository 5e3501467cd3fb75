#!/usr/bin/env python3
"""What authentication costs a request: modern `tools/call` echo through the gateway with a
static bearer token, with an OAuth JWT (checked once, then remembered), and with a JWT
checked on every request (`cache_tokens: 0`), in interleaved rounds of one run (medians).

The authorization server is the tests' node oidc-provider (tests/node, installed by
scripts/test.sh); the server behind the gateway is tests/servers/basic.py over stdio.

    .venv/bin/python bench/auth.py [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench import ROOT, SERVER, Modern, free_port, run_calls

NODE = ROOT / "tests" / "node" / "node_modules" / ".bin" / "node"
STATIC = "bench-static-token"


class Authed(Modern):
    def __init__(self, url: str, token: str) -> None:
        super().__init__(url)
        self.headers = {"Authorization": f"Bearer {token}"}


async def ready(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(400):
            try:
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} never answered")


def gateway(port: int, issuer: str, cache: int, folder: str) -> subprocess.Popen[bytes]:
    conf = {"listen": {"port": port}, "logging": {"level": "error"},
            "upstreams": {"main": {"command": SERVER[0], "args": SERVER[1:]}},
            "auth": {"bearer_tokens": [STATIC], "oauth": {
                "resource": "http://bench.test/mcp", "issuers": [issuer],
                "cache_tokens": cache}}}
    path = Path(folder) / f"gw-{port}.yaml"
    path.write_text(yaml.safe_dump(conf))
    return subprocess.Popen([sys.executable, "-m", "gateway", "--config", str(path)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


async def token(issuer: str) -> str:
    form = {"grant_type": "client_credentials", "scope": "tools",
            "resource": "http://bench.test/mcp"}
    async with aiohttp.ClientSession() as http, http.post(
            f"{issuer}/token", data=form,
            headers={"Authorization": "Basic cm9ib3Q6cm9ib3Qtc2VjcmV0"}) as resp:
        return str((await resp.json())["access_token"])  # robot:robot-secret


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n1, n32 = (200, 400) if args.quick else (2000, 4000)
    idp_port, cached_port, checked_port = free_port(), free_port(), free_port()
    issuer = f"http://127.0.0.1:{idp_port}"
    with tempfile.TemporaryDirectory() as folder:
        procs = [subprocess.Popen([str(NODE), "tests/node/idp.mjs", str(idp_port), "-",
                                   "http://bench.test/mcp"], cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                 gateway(cached_port, issuer, 10_000, folder),
                 gateway(checked_port, issuer, 0, folder)]
        try:
            await ready(f"{issuer}/jwks")
            for port in (cached_port, checked_port):
                await ready(f"http://127.0.0.1:{port}/readyz")
            jwt = await token(issuer)
            kinds: dict[str, tuple[int, str]] = {
                "static token": (cached_port, STATIC), "JWT (remembered)": (cached_port, jwt),
                "JWT (checked every time)": (checked_port, jwt)}
            seen: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}
            for _ in range(args.rounds):
                for kind, (port, tok) in kinds.items():
                    for phase, n, conc in (("C=1", n1, 1), ("C=32", n32, 32)):
                        client = Authed(f"http://127.0.0.1:{port}/mcp", tok)
                        await client.start()
                        await run_calls(client, 50, 1, {"text": "warm"})
                        got = await run_calls(client, n, conc, {"text": "hello"})
                        await client.close()
                        seen[kind].setdefault(f"{phase} req/s", []).append(got["rps"])
                        seen[kind].setdefault(f"{phase} p50 ms", []).append(got["p50_ms"])
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
    report(seen)


def report(seen: dict[str, dict[str, Any]]) -> None:
    columns = list(next(iter(seen.values())))
    print("| token | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for kind, figures in seen.items():
        cells = [f"{statistics.median(v):,.2f}" if "ms" in c else f"{statistics.median(v):,.0f}"
                 for c, v in figures.items()]
        print(f"| {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    asyncio.run(main())
