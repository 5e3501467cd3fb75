"""The official Python SDK client (`mcp` 2.x, `mode="legacy"`) through the gateway, compared
call for call with the same client talking to the same SDK server directly over HTTP."""

from __future__ import annotations

import sys
from typing import Any

import mcp_types as types
from conftest import FIXTURE
from mcp import Client


async def session_transcript(url: str) -> dict[str, Any]:
    """Everything a user of the SDK sees in one session, as plain data."""
    asked: list[Any] = []
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"response": "yes"})

    async def on_sample(ctx: Any, params: types.CreateMessageRequestParams
                        ) -> types.CreateMessageResult:
        asked.append(params.messages[0].content.text)
        return types.CreateMessageResult(role="assistant", model="test-model",
                                         content=types.TextContent(type="text", text="42"))

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    out: dict[str, Any] = {}
    async with Client(url, mode="legacy", elicitation_callback=on_elicit,
                      sampling_callback=on_sample) as client:
        out["tools"] = sorted(t.name for t in (await client.list_tools()).tools)
        out["text"] = (await client.call_tool("test_simple_text", {})).content[0].text
        out["error"] = (await client.call_tool("test_error_handling", {})).is_error
        out["progress_result"] = (await client.call_tool(
            "test_tool_with_progress", {}, progress_callback=on_progress)).content[0].text
        out["elicit"] = (await client.call_tool(
            "test_elicitation", {"message": "Proceed?"})).content[0].text
        out["sample"] = (await client.call_tool(
            "test_sampling", {"prompt": "6 x 7?"})).content[0].text
        out["prompts"] = sorted(p.name for p in (await client.list_prompts()).prompts)
        prompt = await client.get_prompt("test_prompt_with_arguments", {"arg1": "a", "arg2": "b"})
        out["prompt"] = prompt.messages[0].content.text
        out["resources"] = sorted(r.uri for r in (await client.list_resources()).resources)
        read = await client.read_resource("test://template/7/data")
        out["resource"] = read.contents[0].text
    out["asked"] = asked
    out["progress"] = progress
    return out


async def test_python_sdk_sees_the_same_through_the_gateway(gateway, direct_url) -> None:
    through = await session_transcript(await gateway([sys.executable, FIXTURE]))
    direct = await session_transcript(direct_url)
    assert through == direct
    # And the transcript is the real thing, not two empty answers:
    assert "test_elicitation" in through["tools"]
    assert through["elicit"] == 'User response: action=accept, content={"response": "yes"}'
    assert through["sample"] == "LLM response: 42"
    assert through["asked"] == ["Proceed?", "6 x 7?"]
    assert [p[0] for p in through["progress"]] == [0, 50, 100]
    assert through["prompt"] == "Prompt with arguments: arg1='a', arg2='b'"
    assert '"id": "7"' in through["resource"]
