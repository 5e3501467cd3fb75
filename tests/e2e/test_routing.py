"""Routing both ways: responses, progress, cancellation, broadcasts, and server-to-client
requests, which must never reach a client they do not belong to."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from mcp_http import McpHttp, read, text_of

Answer = dict[str, Any]


async def call_answering(mcp: McpHttp, name: str, answers: dict[str, Answer],
                         args: dict[str, Any] | None = None) -> tuple[dict, list[dict]]:
    """tools/call `name`, answering server requests on its SSE stream from `answers` (by
    method). Returns the final response and the server requests seen."""
    body = {"jsonrpc": "2.0", "id": f"c-{name}", "method": "tools/call",
            "params": {"name": name, "arguments": args or {}}}
    seen: list[dict] = []
    async with mcp.http.post(mcp.url, json=body, headers=mcp.headers()) as resp:
        if not resp.headers["Content-Type"].startswith("text/event-stream"):
            return (await read(resp)).message, seen
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or not line[5:].strip():
                continue  # not data, or a priming event's empty data
            msg = json.loads(line[5:])
            if "method" in msg and "id" in msg:
                seen.append(msg)
                reply = {"jsonrpc": "2.0", "id": msg["id"], "result": answers[msg["method"]]}
                assert (await mcp.send(reply)).status == 202
            elif "id" in msg:
                return msg, seen
    raise AssertionError("stream ended without a response")


async def test_elicitation_goes_to_the_caller_and_back(gateway, client) -> None:
    mcp = client(await gateway())
    await mcp.initialize({"elicitation": {}})
    answer = {"action": "accept", "content": {"name": "Ada"}}
    final, seen = await call_answering(mcp, "ask", {"elicitation/create": answer})
    assert [s["method"] for s in seen] == ["elicitation/create"]
    assert json.loads(final["result"]["content"][0]["text"]) == answer  # reached the server


async def test_sampling_and_roots_reach_the_caller(gateway, client) -> None:
    mcp = client(await gateway())
    await mcp.initialize({"sampling": {}, "roots": {"listChanged": True}})
    sample = {"role": "assistant", "content": {"type": "text", "text": "42"}, "model": "m"}
    final, _ = await call_answering(mcp, "sample", {"sampling/createMessage": sample})
    assert json.loads(text_of_msg(final)) == sample
    roots = {"roots": [{"uri": "file:///tmp", "name": "tmp"}]}
    final, _ = await call_answering(mcp, "roots", {"roots/list": roots})
    assert json.loads(text_of_msg(final)) == roots


def text_of_msg(msg: dict) -> str:
    return msg["result"]["content"][0]["text"]


async def test_undeclared_capability_is_refused_to_the_upstream(gateway, client) -> None:
    mcp = client(await gateway())
    await mcp.initialize({})  # declares no elicitation
    final, seen = await call_answering(mcp, "ask", {})
    assert seen == []
    refusal = json.loads(text_of_msg(final))
    assert refusal["code"] == -32601 and "elicitation" in refusal["message"]


async def test_requests_are_never_guessed_across_owners(gateway, client) -> None:
    url = await gateway()
    alice, bob = client(url), client(url)
    await alice.initialize({"elicitation": {}})
    await bob.initialize({"elicitation": {}})
    slow = asyncio.create_task(alice.call("sleep", {"ms": 1500}))
    await asyncio.sleep(0.3)  # alice's call is in flight: two owners now
    final, seen = await call_answering(bob, "ask", {"elicitation/create": {"action": "decline"}})
    assert seen == []
    assert "cannot tell which client" in json.loads(text_of_msg(final))["message"]
    assert text_of(await slow) == "slept 1500"


async def test_client_isolation_routes_exactly(gateway, client) -> None:
    url = await gateway(upstream={"isolation": "client"})
    alice, bob = client(url), client(url)
    await alice.initialize({"elicitation": {}})
    await bob.initialize({"elicitation": {}})
    assert text_of(await alice.call("whoami")) == text_of(await alice.call("whoami"))
    assert text_of(await alice.call("whoami")) != text_of(await bob.call("whoami"))
    slow = asyncio.create_task(alice.call("sleep", {"ms": 1000}))
    await asyncio.sleep(0.2)
    final, seen = await call_answering(bob, "ask", {"elicitation/create": {"action": "decline"}})
    assert [s["method"] for s in seen] == ["elicitation/create"]
    assert json.loads(text_of_msg(final)) == {"action": "decline"}
    await slow


async def test_call_isolation_uses_a_fresh_process_per_call(gateway, client) -> None:
    mcp = client(await gateway(upstream={"isolation": "call", "pool_size": 2}))
    await mcp.initialize()
    pids = {text_of(await mcp.call("whoami")) for _ in range(4)}
    assert len(pids) == 4
    listed = await mcp.send({"jsonrpc": "2.0", "id": 5, "method": "tools/list"})
    assert "whoami" in [t["name"] for t in listed.body["result"]["tools"]]


async def test_equal_progress_tokens_from_two_clients_do_not_mix(gateway, client) -> None:
    url = await gateway()
    alice, bob = client(url), client(url)
    await alice.initialize()
    await bob.initialize()
    a, b = await asyncio.gather(
        alice.call("progress", {"steps": 3, "delay_ms": 30}, meta={"progressToken": 1}),
        bob.call("progress", {"steps": 5, "delay_ms": 20}, meta={"progressToken": 1}))
    for reply, steps in ((a, 3), (b, 5)):
        progress = [e["params"] for e in reply.events if e.get("method") ==
                    "notifications/progress"]
        assert [p["total"] for p in progress] == [steps] * steps
        assert {p["progressToken"] for p in progress} == {1}


async def test_cancellation_is_mapped_to_the_upstream_id(gateway, client) -> None:
    mcp = client(await gateway())
    await mcp.initialize()
    hung = asyncio.create_task(mcp.send({"jsonrpc": "2.0", "id": "h1", "method": "tools/call",
                                         "params": {"name": "hang", "arguments": {}}}))
    await asyncio.sleep(0.3)
    note = {"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": "h1", "reason": "user pressed stop"}}
    assert (await mcp.send(note)).status == 202
    reply = await asyncio.wait_for(hung, 5)  # the POST ends instead of hanging
    assert reply.message["error"]["code"] == -32800
    seen = json.loads(text_of(await mcp.call("cancelled")))
    assert len(seen) == 1 and isinstance(seen[0], int)  # the upstream's id, not "h1"


async def test_list_changes_reach_everyone_and_updates_only_subscribers(gateway, client,
                                                                        http) -> None:
    url = await gateway()
    alice, bob = client(url), client(url)
    await alice.initialize()
    await bob.initialize()
    sub = {"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe",
           "params": {"uri": "test://a"}}
    assert (await alice.send(sub)).body["result"] == {}
    streams = [await http.get(url, headers={"Mcp-Session-Id": c.session_id,
                                            "Accept": "text/event-stream"})
               for c in (alice, bob)]
    await alice.call("touch", {"uri": "test://a"})
    await alice.call("changed")
    got = []
    for stream in streams:
        methods = []
        while "notifications/tools/list_changed" not in methods:
            line = (await asyncio.wait_for(stream.content.readline(), 5)).decode()
            if line.startswith("data:") and line[5:].strip():  # a priming event has none
                methods.append(json.loads(line[5:])["method"])
        stream.close()
        got.append(methods)
    assert got[0] == ["notifications/resources/updated", "notifications/tools/list_changed"]
    assert got[1] == ["notifications/tools/list_changed"]


async def test_shared_subscriptions_are_counted(gateway, client) -> None:
    url = await gateway()
    alice, bob = client(url), client(url)
    await alice.initialize()
    await bob.initialize()

    def msg(method: str) -> dict:
        return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"uri": "test://a"}}

    for c in (alice, bob):
        assert (await c.send(msg("resources/subscribe"))).body["result"] == {}
    # Bob leaving must not end Alice's subscription upstream: the gateway answers him itself.
    assert (await bob.send(msg("resources/unsubscribe"))).body["result"] == {}
    assert (await alice.send(msg("resources/unsubscribe"))).body["result"] == {}


async def test_unknown_reply_ids_are_refused(gateway, client) -> None:
    mcp = client(await gateway())
    await mcp.initialize()
    reply = await mcp.send({"jsonrpc": "2.0", "id": "gw-999999", "result": {}})
    assert reply.status == 400 and "gw-999999" in reply.body["error"]["message"]
