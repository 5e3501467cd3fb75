"""The official Python SDK client (`mcp` 2.x) in its default auto mode: it probes
server/discover and must speak 2026-07-28 through the gateway to a LEGACY stdio server, with
the server's elicitation, sampling and roots requests arriving as MRTR rounds answered by
the client's callbacks."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import mcp_types as types
from conftest import node_env
from mcp import Client


async def on_elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"name": f"Ada ({params.message})"})


async def on_sample(ctx: Any, params: types.CreateMessageRequestParams
                    ) -> types.CreateMessageResult:
    return types.CreateMessageResult(role="assistant", model="m",
                                     content=types.TextContent(type="text", text="42"))


async def on_roots(ctx: Any) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[types.Root(uri="file:///work", name="work")])


def text(result: Any) -> str:
    return result.content[0].text


async def test_auto_mode_negotiates_modern_and_bridges_input(gateway) -> None:
    url = await gateway()
    progress: list[float] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(done)

    async with Client(url, elicitation_callback=on_elicit, sampling_callback=on_sample,
                      list_roots_callback=on_roots) as client:
        assert client.protocol_version == "2026-07-28"
        assert client.server_info.name == "basic-test-server"
        assert "echo" in [t.name for t in (await client.list_tools()).tools]
        assert text(await client.call_tool("echo", {"text": "hi"})) == "hi"
        asked = json.loads(text(await client.call_tool("ask", {"message": "Name?"})))
        assert asked == {"action": "accept", "content": {"name": "Ada (Name?)"}}
        sampled = json.loads(text(await client.call_tool("sample", {"prompt": "6x7"})))
        assert sampled["content"]["text"] == "42"
        roots = json.loads(text(await client.call_tool("roots", {})))
        assert roots["roots"][0]["uri"] == "file:///work"
        assert text(await client.call_tool("progress", {"steps": 3},
                                           progress_callback=on_progress)) == "done 3"
        prompt = await client.get_prompt("greet", {"who": "modern"})
        assert prompt.messages[0].content.text == "Hello modern"
        read = await client.read_resource("test://a")
        assert read.contents[0].text == "content of a"
    assert progress == [1, 2, 3]


async def test_cancelling_a_modern_call_cancels_it_upstream(gateway) -> None:
    url = await gateway()
    async with Client(url) as client:
        hung = asyncio.create_task(client.call_tool("hang", {}))
        await asyncio.sleep(0.5)
        hung.cancel()  # the SDK closes the request's stream
        with contextlib.suppress(asyncio.CancelledError):
            await hung
    async with Client(url) as client:
        for _ in range(50):
            seen = json.loads(text(await client.call_tool("cancelled", {})))
            if seen:
                break
            await asyncio.sleep(0.1)
    assert len(seen) == 1  # the upstream was told to stop the hung call


async def test_a_tool_the_server_runs_only_as_its_own_task(gateway) -> None:
    """server-everything's simulate-research-query requires task augmentation: for a modern
    client the gateway runs it as the server's own task and answers when it ends."""
    cwd = Path(__file__).parents[1] / "node"
    url = await gateway(["npx", "-y", "@modelcontextprotocol/server-everything"],
                        upstream={"cwd": str(cwd), "env": {"PATH": node_env()["PATH"]}},
                        tasks={"defaults": {"mode": "never"}})
    async with Client(url) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert "simulate-research-query" in tools
        result = await client.call_tool("simulate-research-query", {"topic": "tides"})
    assert "tides" in text(result) and not result.is_error
