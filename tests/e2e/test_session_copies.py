"""What a legacy session keeps of its client's `initialize` is capped the same in both stores
(issue 41, item 3; docs/limits.md): its capabilities and its clientInfo's name, title and
version, at most resume.MAX_RECORD_BYTES as JSON. Before: the memory store kept the whole
initialize (up to max_body_bytes): 60 sessions of 3 MiB took the gateway from 48 to 253 MiB.

The gateway runs as its own process (conftest.Replica), so its memory is read from
/proc/PID/status while Bob opens sessions with huge initializes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import BASIC, Replica
from mcp_http import McpHttp, Reply

from gateway.downstream.resume import MAX_RECORD_BYTES

HUGE = 3 * 1024 * 1024  # as the issue's: 3 MiB in one initialize (max_body_bytes is 4 MiB)
SESSIONS = 60
GROWTH_MIB = 40  # what 60 sessions may grow the process by (before: ~200 MiB)


def memory_mib(pid: int) -> dict[str, float]:
    """The process's VmRSS and VmHWM (peak), in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


class Bob(McpHttp):
    def headers(self, **extra: str) -> dict[str, str]:
        return super().headers(Authorization="Bearer bob-token", **extra)

    async def initialize_with(self, capabilities: dict[str, Any], info: Any) -> Reply:
        body = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": info}}
        reply = await self.send(body, data=json.dumps(body).encode())
        self.session_id = reply.headers.get("Mcp-Session-Id")
        return reply


@pytest.fixture(params=["memory", "redis"])
async def gateway_process(request, redis_server, key_prefix) -> Any:
    conf: dict[str, Any] = {
        "upstreams": {"main": {"command": BASIC[0], "args": BASIC[1:]}},
        "auth": {"bearer_tokens": ["alice-token", "bob-token"]},
        "logging": {"level": "warning"}}
    if request.param == "redis":
        conf["store"] = {"backend": "redis", "url": redis_server.url, "key_prefix": key_prefix}
    replica = Replica("r0", conf)
    await replica.start()
    yield replica
    replica.stop()
    os.unlink(replica.config)


async def test_huge_initializes_hold_at_most_the_cap(gateway_process, http) -> None:
    replica = gateway_process
    assert replica.proc is not None
    warm = Bob(http, replica.url)
    assert (await warm.initialize_with({}, {"name": "warm", "version": "1"})).status == 200
    before = memory_mib(replica.proc.pid)
    # A clientInfo of 3 MiB (a description, icons...): only name, title and version are
    # kept, so the session is made and works.
    info = {"name": "bob", "version": "1", "description": "x" * HUGE}
    for _ in range(SESSIONS):
        bob = Bob(http, replica.url)
        made = await bob.initialize_with({"elicitation": {}}, info)
        assert made.status == 200, made.raw[:200]
        assert (await bob.send({"jsonrpc": "2.0", "id": 1, "method": "ping"})).status == 200
    # Capabilities of 3 MiB (or just past the cap): what the gateway reads is over the cap,
    # so no session is made: 400 with a JSON-RPC error saying why.
    huge, over = {"experimental": {"blob": "x" * HUGE}}, \
        {"experimental": {"blob": "x" * MAX_RECORD_BYTES}}
    for caps in [huge] * (SESSIONS // 2) + [over]:
        refused = await Bob(http, replica.url).initialize_with(caps, {"name": "bob"})
        assert refused.status == 400
        error = refused.message["error"]
        assert error["code"] == -32602 and str(MAX_RECORD_BYTES) in error["message"]
        assert "Mcp-Session-Id" not in refused.headers
    after = memory_mib(replica.proc.pid)
    # Held and at the peak (VmHWM: one 3 MiB body read and parsed at a time).
    assert after["VmRSS"] - before["VmRSS"] < GROWTH_MIB, (before, after)
    assert after["VmHWM"] - before["VmRSS"] < GROWTH_MIB, (before, after)
    # Just under the cap is kept.
    fits = {"experimental": {"blob": "x" * (MAX_RECORD_BYTES - 400)}}
    assert (await Bob(http, replica.url).initialize_with(fits, info)).status == 200
