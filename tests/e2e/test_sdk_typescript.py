"""The official TypeScript SDK client (tests/node/client.mjs) through the gateway: against the
conformance fixture (compared with the direct server) and the published server-everything."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURE, NODE_BIN, free_port, node_env, served

pytestmark = pytest.mark.node
CLIENT = Path(__file__).parents[1] / "node" / "client.mjs"


async def ts_client(url: str, plan: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        str(NODE_BIN / "node"), str(CLIENT), url, plan, env=node_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err.decode()
    return json.loads(out.splitlines()[-1])


async def test_typescript_sdk_sees_the_same_through_the_gateway(gateway, direct_url) -> None:
    through = await ts_client(await gateway([sys.executable, FIXTURE]), "fixture")
    direct = await ts_client(direct_url, "fixture")
    assert through == direct
    assert through["elicit"] == ('User response: action=accept, '
                                 'content={"response": "yes", "name": "Ada"}')
    assert through["sample"] == "LLM response: 42"
    assert through["asked"] == ["Proceed?", "6 x 7?"]
    assert [p[0] for p in through["progress"]] == [0, 50, 100]
    assert through["resource"] == "This is the content of the static text resource."


async def test_server_everything_through_the_gateway(gateway) -> None:
    node_env()  # fails with a clear message when the tools are not installed
    # As a user runs it: npx, which finds the copy scripts/test.sh installed in tests/node.
    url = await gateway(["npx", "-y", "@modelcontextprotocol/server-everything"],
                        upstream={"cwd": str(CLIENT.parent), "env": {"PATH": node_env()["PATH"]}})
    seen = await ts_client(url, "everything")
    assert seen["server"] == "mcp-servers/everything"
    assert {"trigger-long-running-operation", "trigger-elicitation-request",
            "trigger-sampling-request"} <= set(seen["tools"])
    assert seen["progress"] == [[1, 4], [2, 4], [3, 4], [4, 4]]
    assert "Long running operation completed" in seen["longRunning"]
    assert "Ada" in seen["elicit"]  # the answer our elicitation callback gave
    assert "42" in seen["sample"]
    assert len(seen["asked"]) == 2
    # Its task-only tool runs as the server's own task, passed through the gateway.
    assert seen["research"][0] == "taskCreated" and "tides" in seen["research"][-1]


@pytest.mark.parametrize(("mode", "path"), [("streamableHttp", "/mcp"), ("sse", "/sse")])
async def test_server_everything_over_http_through_the_gateway(gateway, http, mode,
                                                              path) -> None:
    """The reference server in its own HTTP modes, fronted by URL (sse: the HTTP+SSE
    transport of 2024-11-05): its progress, elicitation and sampling arrive on its HTTP
    streams and reach the TypeScript client."""
    port = free_port()
    everything = CLIENT.parent / "node_modules" / "@modelcontextprotocol" / "server-everything"
    env = {**node_env(), "PORT": str(port)}
    async with served([str(NODE_BIN / "node"), str(everything / "dist" / "index.js"),
                       mode], port, env) as base:
        url = await gateway(url=base + path)
        async with http.get(url.replace("/mcp", "/readyz?detail")) as resp:
            transport = (await resp.json())["upstreams"]["main"]["transport"]
        assert transport == ("http+sse" if mode == "sse" else "streamable-http")
        seen = await ts_client(url, "everything")
    assert seen["server"] == "mcp-servers/everything"
    assert seen["progress"] == [[1, 4], [2, 4], [3, 4], [4, 4]]
    assert "Ada" in seen["elicit"] and "42" in seen["sample"]
    assert seen["research"][0] == "taskCreated" and "tides" in seen["research"][-1]
