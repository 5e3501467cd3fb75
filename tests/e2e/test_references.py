"""A request borrows no other principal's task (issue 41, item 6; docs/security.md, Isolation
between principals): a related-task reference (`io.modelcontextprotocol/related-task` _meta) in a
client's request reaches the server only when it names a task its sender created, one of
the gateway's or one the server runs itself; any other is stripped. Alice and Bob are two
static tokens on real basic.py servers (/native runs tasks of its own, and labels what a
plain call asks with the task its request names, as the TypeScript SDK does)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from conftest import free_port, wait_until_ready
from mcp_http import BASIC, Reply, next_event, text_of
from test_tenancy import TOKENS, As  # Alice and Bob: two static tokens

from gateway.app import create_app
from gateway.settings.load import from_mapping

RELATED = "io.modelcontextprotocol/related-task"
MODERN = "2026-07-28"


def naming(task_id: str) -> dict[str, Any]:
    return {RELATED: {"taskId": task_id}}


@pytest.fixture
async def base(aiohttp_server) -> str:
    port = free_port()
    basic = {"command": BASIC[0], "args": BASIC[1:]}
    app = create_app(from_mapping({
        "upstreams": {"a": {**basic, "path": "/a"},
                      "native": {**basic, "path": "/native", "env": {"BASIC_TASKS": "1"}}},
        "auth": {"bearer_tokens": list(TOKENS.values())}, "logging": {"level": "warning"}}))
    await aiohttp_server(app, port=port)
    origin = f"http://127.0.0.1:{port}"
    await wait_until_ready(origin)
    return origin


async def session(http: aiohttp.ClientSession, url: str, who: str) -> As:
    c = As(http, url, who)
    await c.initialize({"elicitation": {}, "tasks": {}}, version="2025-11-25")
    return c


def meta_seen(reply: Reply) -> dict[str, Any]:
    """What the `meta` tool says reached the server."""
    seen: dict[str, Any] = json.loads(text_of(reply))
    return seen


async def modern_meta(http: aiohttp.ClientSession, url: str, who: str, meta: dict[str, Any]
                      ) -> dict[str, Any]:
    """The `meta` tool called in the modern era, as `who`, with `meta` in its _meta."""
    envelope = {"io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "meta", "arguments": {}, "_meta": {**envelope, **meta}}}
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": MODERN,
               "Mcp-Method": "tools/call", "Mcp-Name": "meta",
               "Authorization": f"Bearer {TOKENS[who]}"}
    async with http.post(url, json=body, headers=headers) as resp:
        reply = Reply(resp.status, resp.headers, await resp.json())
    return meta_seen(reply)


async def test_bobs_reference_to_alices_server_task_asks_alice_nothing(base, http) -> None:
    """Before: Bob's plain `ask` naming Alice's task of the server's own was forwarded as it
    was; the server labelled its elicitation with her task, so the gateway asked Alice
    Bob's question, and her answer became Bob's result."""
    url = base + "/native"
    alice = await session(http, url, "alice")
    for _ in range(50):  # until the gateway has the server's tools (a loaded host: later)
        created = await alice.request("tools/call", {
            "name": "sleep", "arguments": {"ms": 20_000}, "task": {}})
        hers = created.message["result"]["task"]["taskId"]
        if hers.startswith("native-"):
            break
        await alice.request("tasks/cancel", {"taskId": hers})  # the gateway's own task
        await asyncio.sleep(0.1)
    assert hers.startswith("native-")  # the server's own, live
    bob = await session(http, url, "bob")
    async with alice.stream() as a_stream:
        borrowing = asyncio.ensure_future(bob.request("tools/call", {
            "name": "ask", "arguments": {"message": "Bob asks: your card number?"},
            "_meta": naming(hers)}))
        # Alice hears nothing at all (before: Bob's question, labelled with her task).
        with pytest.raises(TimeoutError):
            await next_event(a_stream, timeout_s=1.5)
        # Unlabelled now, the question may be Alice's task's while it runs: the gateway
        # does not guess, and Bob's call hears the refusal.
        borrowed = await asyncio.wait_for(borrowing, 10)
        assert "Bob asks" not in borrowed.raw.decode()
    # The reference never reached the server; Alice's own to her own task does.
    assert RELATED not in meta_seen(await bob.call("meta", meta=naming(hers)))
    assert meta_seen(await alice.call("meta", meta=naming(hers)))[RELATED] == {"taskId": hers}
    # In the modern era alike.
    assert RELATED not in await modern_meta(http, url, "bob", naming(hers))
    assert (await modern_meta(http, url, "alice", naming(hers)))[RELATED]["taskId"] == hers
    await alice.request("tasks/cancel", {"taskId": hers})


async def test_a_reference_to_a_gateway_task_passes_for_its_owner_only(base, http) -> None:
    url = base + "/a"
    alice = await session(http, url, "alice")
    created = await alice.request("tools/call", {"name": "sleep", "arguments": {"ms": 20_000},
                                                 "task": {}})
    hers = created.message["result"]["task"]["taskId"]  # the gateway's own task
    bob = await session(http, url, "bob")
    assert RELATED not in meta_seen(await bob.call("meta", meta=naming(hers)))
    assert meta_seen(await alice.call("meta", meta=naming(hers)))[RELATED] == {"taskId": hers}
    assert RELATED not in await modern_meta(http, url, "bob", naming(hers))
    assert (await modern_meta(http, url, "alice", naming(hers)))[RELATED]["taskId"] == hers
    # An unknown id and a malformed reference are stripped too; other _meta stays.
    for meta in (naming("no-such-task"), {RELATED: "x"}):
        seen = meta_seen(await bob.call("meta", meta={**meta, "example.com/trace": "t"}))
        assert RELATED not in seen and seen["example.com/trace"] == "t"
    await alice.request("tasks/cancel", {"taskId": hers})
