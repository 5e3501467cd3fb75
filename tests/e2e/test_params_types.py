"""Params of every JSON type, for every method the gateway reads, in both eras: a clear
JSON-RPC error or a normal answer, never an HTTP 500 (MCP: params are objects; JSON-RPC
2.0: -32602 for invalid params)."""

from __future__ import annotations

import itertools
from typing import Any

import aiohttp
import pytest
from mcp_http import ACCEPT_BOTH, McpHttp

MODERN = "2026-07-28"
METHODS = ["initialize", "ping", "tools/list", "tools/call", "resources/list", "resources/read",
           "resources/subscribe", "resources/unsubscribe", "prompts/get", "logging/setLevel",
           "completion/complete", "tasks/get", "tasks/list", "tasks/result", "tasks/cancel",
           "tasks/update", "server/discover", "subscriptions/listen", "no/such-method"]
NOTIFICATIONS = ["notifications/cancelled", "notifications/initialized",
                 "notifications/roots/list_changed"]
JSON_VALUES: list[Any] = [None, True, 0, -1.5, "text", [], [1, "a"], {}, {"k": [None]}]
NOT_OBJECTS = [v for v in JSON_VALUES if not isinstance(v, dict) and v is not None]
# Fields of params the gateway reads somewhere, each given every JSON type.
FIELDS = ["name", "arguments", "task", "_meta", "taskId", "uri", "level", "cursor",
          "requestState", "inputResponses", "requestId", "protocolVersion", "capabilities"]
ids = itertools.count(1)


def modern_meta() -> dict[str, Any]:
    return {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {
                "extensions": {"io.modelcontextprotocol/tasks": {}}, "elicitation": {}}}


async def post(http: aiohttp.ClientSession, url: str, msg: dict[str, Any],
               headers: dict[str, str]) -> tuple[int, Any]:
    """Status and JSON body (None for an SSE stream, which is not read: a listen stream
    stays open)."""
    async with http.post(url, json=msg, headers={"Content-Type": "application/json",
                                                 "Accept": ACCEPT_BOTH, **headers}) as resp:
        if resp.content_type == "application/json":
            return resp.status, await resp.json()
        return resp.status, None


def messages(method: str, modern: bool) -> list[dict[str, Any]]:
    """`method` with params of every JSON type, and with each field of every JSON type."""
    out: list[dict[str, Any]] = []
    for value in JSON_VALUES:
        out.append({"params": value})
        for field in FIELDS:
            params = {field: value}
            if modern and field != "_meta":
                params["_meta"] = modern_meta()
            out.append({"params": params})
    return [{"jsonrpc": "2.0", "method": method, **m} for m in out]


def answered_clearly(status: int, body: Any) -> bool:
    if status == 202 and body is None:
        return True
    if body is None:  # an SSE answer: a stream opened (subscriptions/listen, a slow call)
        return status == 200
    return status < 500 or (status == 503 and "error" in body)


@pytest.mark.slow
@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_every_method_with_every_json_type_of_params(gateway, http, era: str) -> None:
    url = await gateway()
    headers: dict[str, str] = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "x"}
    if era == "legacy":
        client = McpHttp(http, url)
        await client.initialize({"elicitation": {}, "tasks": {}}, version="2025-11-25")
        headers = client.headers()
    refused = []
    for method in [*METHODS, *NOTIFICATIONS]:
        for msg in messages(method, era == "modern"):
            if method not in NOTIFICATIONS:
                msg["id"] = next(ids)
            if era == "modern":
                headers["Mcp-Method"] = method
            status, body = await post(http, url, msg, headers)
            if not answered_clearly(status, body):
                refused.append((method, msg.get("params"), status, body))
            params = msg.get("params")
            if not isinstance(params, dict) and params is not None:
                # Not an object: refused at the edge, saying so, whatever the method.
                assert status == 400 and body["error"]["code"] == -32602, (method, params)
                assert "params must be an object" in body["error"]["message"]
    assert not refused, refused[:5]


@pytest.mark.parametrize("task_ids", [[{}], [[1]], [None, 1, "t"], "t", {"a": 1}])
async def test_listen_task_ids_of_any_json_type(gateway, http, task_ids: Any) -> None:
    """Before: a taskIds list holding an object or a list was an HTTP 500 (unhashable)."""
    url = await gateway()
    params = {"notifications": {"taskIds": task_ids}, "_meta": modern_meta()}
    status, _ = await post(http, url, {"jsonrpc": "2.0", "id": 1, "method":
                                       "subscriptions/listen", "params": params},
                           {"MCP-Protocol-Version": MODERN, "Mcp-Method": "subscriptions/listen"})
    assert status in (200, 400)
