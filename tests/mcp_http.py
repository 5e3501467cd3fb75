"""A raw Streamable HTTP client for tests that need to see exactly what went over the wire
(status codes, headers, SSE events), which the SDK clients hide."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

HERE = Path(__file__).parent
BASIC = [sys.executable, str(HERE / "servers" / "basic.py")]
ACCEPT_BOTH = "application/json, text/event-stream"


@dataclass
class Reply:
    status: int
    headers: Any
    body: Any = None  # parsed JSON body, when JSON
    events: list[dict[str, Any]] = field(default_factory=list)  # parsed SSE data, when SSE
    event_ids: list[str] = field(default_factory=list)
    raw: bytes = b""

    @property
    def message(self) -> Any:
        """The JSON-RPC response: the JSON body, or the SSE event with an id and a result."""
        if self.body is not None:
            return self.body
        for event in self.events:
            if "id" in event and ("result" in event or "error" in event):
                return event
        return None


def parse_sse(raw: bytes) -> tuple[list[dict[str, Any]], list[str]]:
    events, ids = [], []
    for block in raw.decode().split("\n\n"):
        data = [line[5:].lstrip() for line in block.split("\n") if line.startswith("data:")]
        if data and data[0]:
            events.append(json.loads("\n".join(data)))
            ids += [line[3:].strip() for line in block.split("\n") if line.startswith("id:")]
    return events, ids


class McpHttp:
    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http = http
        self.url = url
        self.session_id: str | None = None
        self.version = "2025-06-18"
        self.ids = itertools.count(1)

    def headers(self, **extra: str) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": ACCEPT_BOTH}
        if self.session_id:
            h["Mcp-Session-Id"] = self.session_id
            h["MCP-Protocol-Version"] = self.version
        h.update(extra)
        return h

    async def initialize(self, capabilities: dict[str, Any] | None = None,
                         version: str = "2025-06-18", headers: dict[str, str] | None = None
                         ) -> Reply:
        extra = headers or {}
        reply = await self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": capabilities or {},
            "clientInfo": {"name": "test", "version": "1"}}}, **extra)
        self.session_id = reply.headers.get("Mcp-Session-Id")
        self.version = reply.body["result"]["protocolVersion"]
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"}, **extra)
        return reply

    async def send(self, msg: Any, *, data: bytes | None = None, **headers: str) -> Reply:
        body: Any = data if data is not None else json.dumps(msg).encode()
        if len(body) > 1 << 20:
            body = io.BytesIO(body)  # aiohttp warns that big raw bytes block its loop
        async with self.http.post(self.url, data=body, headers=self.headers(**headers)) as resp:
            return await read(resp)

    async def call(self, name: str, arguments: dict[str, Any] | None = None,
                   meta: dict[str, Any] | None = None, **headers: str) -> Reply:
        params: dict[str, Any] = {"name": name, "arguments": arguments or {}}
        if meta:
            params["_meta"] = meta
        return await self.send({"jsonrpc": "2.0", "id": next(self.ids), "method": "tools/call",
                                "params": params}, **headers)

    async def call_answering(self, name: str, arguments: dict[str, Any],
                             content: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """A call whose server asks this client for input on the call's own SSE stream:
        the request it asked (an elicitation, accepted with `content`) and the final
        answer read from that stream."""
        body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": name, "arguments": arguments}}
        async with self.http.post(self.url, json=body, headers=self.headers()) as stream:
            asked = await next_event(stream)
            await self.send({"jsonrpc": "2.0", "id": asked["id"],
                             "result": {"action": "accept", "content": content}})
            return asked, await next_event(stream)


async def next_event(resp: aiohttp.ClientResponse, timeout_s: float = 5.0) -> dict[str, Any]:
    """The next data event of an SSE response still streaming (a GET stream, a slow call)."""
    data: list[str] = []
    while True:
        line = (await asyncio.wait_for(resp.content.readline(), timeout_s)).decode()
        if not line:
            raise EOFError("the stream ended")
        if line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "\n" and any(data):
            return json.loads("\n".join(data))
        elif line == "\n":
            data = []  # an event with no data: a stream's priming event


async def read(resp: aiohttp.ClientResponse) -> Reply:
    raw = await resp.read()
    reply = Reply(resp.status, resp.headers, raw=raw)
    ctype = resp.headers.get("Content-Type", "")
    if ctype.startswith("text/event-stream"):
        reply.events, reply.event_ids = parse_sse(raw)
    elif ctype.startswith("application/json") and raw:
        reply.body = json.loads(raw)
    return reply


def text_of(reply: Reply) -> str:
    return reply.message["result"]["content"][0]["text"]
