"""Issue 41, item 1: what one principal's answers can make the gateway hold. A gateway process
of its own (its peak resident memory read from /proc) in front of tests/servers/unruly_http.py,
whose `big` tool answers as many MiB as asked; two static tokens, Alice's and Bob's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import ROOT, stop, wait_until_ready
from mcp_http import McpHttp
from test_upstream_edges import unruly

MIB = 1 << 20
TOKENS = {"auth": {"bearer_tokens": ["alice", "bob"]}}


@contextlib.asynccontextmanager
async def gateway_process(upstream: str, limits: dict[str, Any]
                          ) -> AsyncIterator[tuple[str, int]]:
    """A gateway as its own process (`python -m gateway`) for the block: its MCP URL, pid."""
    from conftest import free_port
    port = free_port()
    conf = {"listen": {"host": "127.0.0.1", "port": port}, "logging": {"level": "error"},
            "upstreams": {"main": {"url": upstream}}, "limits": limits, **TOKENS}
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        json.dump(conf, f)  # JSON is YAML
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "--config", path], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await wait_until_ready(f"http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{port}/mcp", proc.pid
    finally:
        stop(proc)
        Path(path).unlink()


def peak_mib(pid: int) -> float:
    """The process's peak resident memory (proc(5): VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@contextlib.asynccontextmanager
async def principal(url: str, token: str) -> AsyncIterator[McpHttp]:
    """A legacy session of the principal whose bearer token is `token`."""
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"},
                                     timeout=aiohttp.ClientTimeout(total=60)) as http:
        session = McpHttp(http, url)
        await session.initialize()
        yield session


def text_length(msg: dict[str, Any]) -> int:
    assert "result" in msg, msg
    return len(msg["result"]["content"][0]["text"])


# -- (a) an HTTP upstream's answer is bounded like a stdio line ------------------------------
@pytest.mark.parametrize("how", ["json", "chunked", "sse"])
async def test_an_http_answer_over_max_message_bytes_fails_its_call_alone(how: str) -> None:
    """Bob's 48 MiB answer over a 4 MiB bound fails his call with an error that names the
    bound, and is not read into the gateway's memory; Alice's 2 MiB answer on the same
    upstream, at the same time, comes whole, and Bob's next call on the same session too."""
    async with unruly() as base, gateway_process(base + "/mcp", {
            "max_message_bytes": 4 * MIB}) as (url, pid), \
            principal(url, "alice") as alice, principal(url, "bob") as bob:
        await alice.call("big", {"mib": 1, "how": how})  # warm: what any answer costs
        before = peak_mib(pid)
        bobs, alices = await asyncio.gather(bob.call("big", {"mib": 48, "how": how}),
                                            alice.call("big", {"mib": 2, "how": how}))
        error = bobs.message["error"]
        assert error["data"] == {"upstream": "main", "reason": "too_large",
                                 "limit": "limits.max_message_bytes", "maxBytes": 4 * MIB}
        assert "limits.max_message_bytes (4194304 bytes)" in error["message"]
        assert text_length(alices.message) == 2 * MIB
        grown = peak_mib(pid) - before
        assert grown < 24, f"the gateway grew {grown:.1f} MiB for a refused 48 MiB answer"
        again = await bob.call("big", {"mib": 1, "how": how})  # the session goes on
        assert text_length(again.message) == MIB


async def test_a_refusal_that_inflates_past_the_bound_is_cut_there() -> None:
    """An HTTP 400 to a request that carried the session id is read to see whether it
    speaks of the session; a small gzip body that inflates to 100 MiB is read only to
    max_message_bytes: Bob's call fails, the gateway does not grow by the 100 MiB, and
    Alice's call and Bob's next one are served."""
    async with unruly() as base, gateway_process(base + "/mcp", {
            "max_message_bytes": 4 * MIB}) as (url, pid), \
            principal(url, "alice") as alice, principal(url, "bob") as bob:
        await alice.call("big", {"mib": 1})  # warm
        before = peak_mib(pid)
        refused = await bob.call("big", {"mib": 100, "how": "gzip400"})
        assert "answered HTTP 400" in refused.message["error"]["message"], refused.message
        grown = peak_mib(pid) - before
        assert grown < 24, f"the gateway grew {grown:.1f} MiB for a refused gzip body"
        assert text_length((await alice.call("big", {"mib": 2})).message) == 2 * MIB
        assert text_length((await bob.call("big", {"mib": 1})).message) == MIB


# -- (b) one budget for the bytes of answers clients have not read ---------------------------
async def unread_call(url: str, session: McpHttp, rid: int, mib: int
                      ) -> asyncio.StreamWriter:
    """A call of Bob's session whose answer Bob never reads (its socket is kept open)."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {
        "name": "big", "arguments": {"mib": mib}}}).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in {
        **session.headers(), "Host": f"{host}:{port}", "Authorization": "Bearer bob",
        "Content-Length": str(len(body))}.items())
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"POST /mcp HTTP/1.1\r\n{head}\r\n".encode() + body)
    await writer.drain()
    return writer


async def test_answers_bob_does_not_read_hold_his_share_not_alices() -> None:
    """Bob opens eight calls of 8 MiB answers and reads none: the gateway holds his share
    (16 MiB), his next call fails naming the bound, and Alice's calls, two at once, are
    answered whole meanwhile; the gateway grows by about the budget, not by 64 MiB."""
    async with unruly() as base, gateway_process(base + "/mcp", {
            "max_inflight_bytes_per_principal": 16 * MIB, "max_inflight_bytes": 64 * MIB,
            "slow_reader_ms": 60_000}) as (url, pid), \
            principal(url, "alice") as alice, principal(url, "bob") as bob:
        await alice.call("big", {"mib": 8})  # warm: what one answer costs
        before = peak_mib(pid)
        writers = [await unread_call(url, bob, 100 + i, 8) for i in range(8)]
        await asyncio.sleep(3)  # every answer is in (each 8 MiB takes milliseconds)
        over = (await bob.call("big", {"mib": 8})).message["error"]
        assert over["data"]["limit"] == "limits.max_inflight_bytes_per_principal", over
        assert "max_inflight_bytes_per_principal (16777216 bytes)" in over["message"]
        for _ in range(3):
            twice = await asyncio.wait_for(asyncio.gather(
                alice.call("big", {"mib": 6}), alice.call("big", {"mib": 6})), 10)
            assert [text_length(r.message) for r in twice] == [6 * MIB] * 2
        grown = peak_mib(pid) - before
        assert grown < 48, f"the gateway grew {grown:.1f} MiB for 64 MiB of unread answers"
        for writer in writers:
            writer.close()


# -- a body sent compressed is refused, never inflated ---------------------------------------
def cpu_seconds(pid: int) -> float:
    """The process's user and system CPU time (proc(5): stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_a_compressed_request_body_is_refused_and_never_inflated() -> None:
    """A second look at issue 41: a 1 MiB deflate body that inflates to 1 GiB, answered 401
    at once, was still inflated by aiohttp's lingering read for up to 10 s on the event
    loop (Alice waited seconds). Now any Content-Encoding is 415 before the credential is
    read, the body is not inflated, and Alice's next call is served as usual."""
    bomb = zlib.compress(b"\0" * (1 << 30), 9)
    async with unruly() as base, gateway_process(base + "/mcp", {}) as (url, pid), \
            principal(url, "alice") as alice:
        before = cpu_seconds(pid)
        async with aiohttp.ClientSession() as http:
            for token in (None, "bob"):
                headers = {"Content-Type": "application/json", "Content-Encoding": "deflate",
                           "Accept": "application/json, text/event-stream"}
                if token:
                    headers["Authorization"] = f"Bearer {token}"
                async with http.post(url, data=bomb, headers=headers) as resp:
                    assert resp.status == 415, resp.status
                    assert "Content-Encoding" in (await resp.json())["error"]["message"]
        assert text_length((await alice.call("big", {"mib": 1})).message) == MIB
        spent = cpu_seconds(pid) - before
        assert spent < 3, f"the gateway spent {spent:.1f} s of CPU on two refused bodies"
