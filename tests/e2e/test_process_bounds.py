"""Issue 41, item 2: isolated upstreams' server processes are bounded, overall and per
principal. Two static tokens (alice, bob) in front of the stdio test server with
`isolation: client` or `isolation: call`: Bob's flood of sessions or calls gets at most his
share of processes (counted as the test process's children in /proc, and by the pids
`whoami` answers), his excess is refused with an error naming the bound, Alice's sessions
and calls are served within seconds meanwhile, and idle processes are reaped."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp_http import McpHttp, Reply, text_of
from test_modern import call as modern_call

TOKENS = {"auth": {"bearer_tokens": ["alice", "bob"]}}
SHARE = 4


BEFORE: set[int] = set()  # children of earlier tests', not counted (see `gateway_here`)


def children() -> set[int]:
    """The pids of this process's children started by this test's gateway (it runs here,
    its servers are them)."""
    return _all_children() - BEFORE


@pytest.fixture(autouse=True)
def gateway_here() -> None:
    BEFORE.clear()
    BEFORE.update(_all_children())


def _all_children() -> set[int]:
    me, found = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == me and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


async def settle(expected: int, timeout_s: float = 10) -> int:
    """The number of children once it is `expected` (or whatever it is at the timeout)."""
    for _ in range(int(timeout_s * 10)):
        if len(children()) == expected:
            break
        await asyncio.sleep(0.1)
    return len(children())


@pytest.fixture
async def https() -> AsyncIterator[dict[str, aiohttp.ClientSession]]:
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer alice"}) as alice, \
            aiohttp.ClientSession(headers={"Authorization": "Bearer bob"}) as bob:
        yield {"alice": alice, "bob": bob}


async def opened(http: aiohttp.ClientSession, url: str) -> tuple[McpHttp, Reply]:
    """A legacy session's initialize: the client (with its id when it got one) and reply."""
    c = McpHttp(http, url)
    reply = await c.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}}})
    c.session_id = reply.headers.get("Mcp-Session-Id")
    return c, reply


def limits(**more: Any) -> dict[str, Any]:
    return {"limits": {"max_processes": 16, "max_processes_per_principal": SHARE,
                       "process_wait_ms": 300, "process_idle_ms": 1000, **more}}


async def test_client_isolation_bounds_bobs_sessions_not_alices(gateway, https) -> None:
    url = await gateway(upstream={"isolation": "client"}, **TOKENS, **limits())
    base = await settle(1)  # the primary process
    flood = await asyncio.gather(*(opened(https["bob"], url) for _ in range(40)))
    mine = [c for c, reply in flood if reply.status == 200]
    refused = [reply for _, reply in flood if reply.status != 200]
    assert len(mine) == SHARE and len(refused) == 40 - SHARE
    assert {r.status for r in refused} == {503}
    error = refused[0].body["error"]
    assert "max_processes_per_principal" in error["message"]
    assert error["data"]["bound"] == "max_processes_per_principal"
    assert error["data"]["maxProcesses"] == SHARE
    bobs = {text_of(await c.call("whoami")) for c in mine}
    assert len(bobs) == SHARE
    assert len(children()) == base + SHARE
    # Alice, during a second flood of Bob's: her own processes, answered within seconds.
    again = asyncio.gather(*(opened(https["bob"], url) for _ in range(20)))
    started = time.monotonic()
    alices = [await opened(https["alice"], url) for _ in range(2)]
    assert [reply.status for _, reply in alices] == [200, 200]
    pids = {text_of(await c.call("whoami")) for c, _ in alices}
    assert time.monotonic() - started < 5
    assert len(pids) == 2 and not pids & bobs
    assert all(reply.status == 503 for _, reply in await again)
    # Idle, every session's process is reaped, and Bob may open sessions again.
    assert await settle(base) == base
    assert (await mine[0].call("whoami")).status == 404  # its session ended with it
    fresh, reply = await opened(https["bob"], url)
    assert reply.status == 200 and text_of(await fresh.call("whoami")) not in bobs


async def test_the_overall_bound_names_itself(gateway, https) -> None:
    url = await gateway(upstream={"isolation": "client"}, **TOKENS,
                        **limits(max_processes=3))
    bob = [await opened(https["bob"], url) for _ in range(3)]
    assert [reply.status for _, reply in bob] == [200, 200, 200]
    _, refused = await opened(https["alice"], url)
    assert refused.status == 503
    assert "limits.max_processes)" in refused.body["error"]["message"]


async def test_call_isolation_bounds_bobs_calls_and_counts_the_pool(gateway, https) -> None:
    url = await gateway(upstream={"isolation": "call", "pool_size": 2}, **TOKENS, **limits())
    base = await settle(3)  # the control process and two warm ones
    bob, _ = await opened(https["bob"], url)
    alice, _ = await opened(https["alice"], url)
    flood = [asyncio.create_task(bob.call("sleep", {"ms": 3000})) for _ in range(12)]
    await asyncio.sleep(1.0)
    started = time.monotonic()
    assert text_of(await alice.call("echo", {"text": "mine"})) == "mine"
    assert time.monotonic() - started < 5
    assert len(children()) <= base + SHARE + 1  # his share running, the pool refilled
    replies = await asyncio.gather(*flood)
    answered = [r for r in replies if "result" in r.message]
    refused = [r.message["error"] for r in replies if "error" in r.message]
    assert len(answered) == SHARE and len(refused) == 12 - SHARE
    assert all(e["data"]["bound"] == "max_processes_per_principal" for e in refused)
    assert await settle(base) == base  # retired: the pool again


async def test_call_isolation_pool_counts_against_the_overall_bound(gateway, https) -> None:
    url = await gateway(upstream={"isolation": "call", "pool_size": 2}, **TOKENS,
                        **limits(max_processes=2))
    bob, _ = await opened(https["bob"], url)
    alice, _ = await opened(https["alice"], url)
    held = [asyncio.create_task(bob.call("sleep", {"ms": 2000})) for _ in range(2)]
    await asyncio.sleep(0.5)
    assert len(children()) == 3  # the control process and the two it may run
    refused = (await alice.call("echo", {"text": "x"})).message["error"]
    assert refused["data"]["bound"] == "max_processes"
    await asyncio.gather(*held)
    later = await alice.call("echo", {"text": "later"})
    assert "result" in later.message, later.message
    assert text_of(later) == "later"


async def test_modern_principal_process_is_bounded_and_reaped(gateway, https) -> None:
    url = await gateway(upstream={"isolation": "client"}, **TOKENS, **limits())
    base = await settle(1)
    first = await modern_call(https["bob"], url, "whoami")
    assert first.status == 200, first.body
    assert await settle(base + 1) == base + 1
    assert text_of(await modern_call(https["bob"], url, "whoami")) == text_of(first)
    assert await settle(base) == base  # idle: closed
    assert text_of(await modern_call(https["bob"], url, "whoami")) != text_of(first)
