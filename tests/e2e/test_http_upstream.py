"""A Streamable HTTP server as the upstream: the same SDK transcripts as direct, a modern
client with MRTR over it, two upstreams behind one gateway, and an upstream restart."""

from __future__ import annotations

import asyncio

from conftest import free_port, listening, serve_fixture, wait_until_ready
from mcp import Client
from mcp_http import BASIC, text_of
from test_sdk_modern import on_elicit
from test_sdk_python import session_transcript


async def test_python_sdk_transcript_matches_through_an_http_upstream(gateway,
                                                                      direct_url) -> None:
    through = await session_transcript(await gateway(url=direct_url))
    assert through == await session_transcript(direct_url)
    assert through["elicit"].startswith("User response: action=accept")
    assert [p[0] for p in through["progress"]] == [0, 50, 100]


async def test_modern_client_with_mrtr_over_an_http_upstream(gateway, direct_url) -> None:
    async with Client(await gateway(url=direct_url), elicitation_callback=on_elicit) as client:
        assert client.protocol_version == "2026-07-28"
        result = await client.call_tool("test_input_required_result_elicitation", {})
        assert result.content[0].text.startswith("Hello, Ada")


async def test_two_upstreams_behind_one_gateway(gateway, direct_url, client, http) -> None:
    raw = {"upstreams": {
        "local": {"command": BASIC[0], "args": BASIC[1:]},
        "remote": {"url": direct_url, "path": "/remote/mcp"}}, "logging": {"level": "warning"}}
    local = await gateway(raw=raw)
    base = local.removesuffix("/mcp")
    async with http.get(base + "/readyz") as resp:
        upstreams = (await resp.json())["upstreams"]
    assert set(upstreams) == {"local", "remote"} and upstreams["remote"]["url"] == direct_url
    one, two = client(local), client(base + "/remote/mcp")
    await one.initialize()
    await two.initialize()
    assert text_of(await one.call("echo", {"text": "stdio"})) == "stdio"
    assert text_of(await two.call("test_simple_text")) == \
        "This is a simple text response for testing."


async def test_upstream_restart_mid_session(gateway, client, http) -> None:
    port = free_port()
    server = serve_fixture(port)
    try:
        await listening(port)
        url = await gateway(url=f"http://127.0.0.1:{port}/mcp")
        mcp = client(url)
        await mcp.initialize()
        assert text_of(await mcp.call("test_simple_text")).startswith("This is")
        server.terminate()
        server.wait(10)
        failed = await asyncio.wait_for(mcp.call("test_simple_text"), 10)
        assert failed.message["error"]["data"]["upstream"] == "main"  # a clear error, no hang
        server = serve_fixture(port)  # the same server comes back, without the old session
        await listening(port)
        await wait_until_ready(url.removesuffix("/mcp"))
        for _ in range(50):
            reply = await mcp.call("test_simple_text")
            if "result" in reply.message:
                break
            await asyncio.sleep(0.2)
        assert text_of(reply).startswith("This is")  # same client session, new upstream one
    finally:
        server.terminate()
        server.wait(10)


async def test_an_unreachable_http_upstream_is_reported_not_hung(gateway, client, http) -> None:
    url = await gateway(url=f"http://127.0.0.1:{free_port()}/mcp", wait_ready=False,
                        upstream={"startup_timeout_ms": 300})
    await asyncio.sleep(0.5)
    async with http.get(url.replace("/mcp", "/readyz")) as resp:
        assert resp.status == 503
        assert (await resp.json())["upstreams"]["main"]["ready"] is False
    reply = await asyncio.wait_for(client(url).send({
        "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}}}), 5)
    assert reply.status == 503 and "not ready" in reply.body["error"]["message"]
