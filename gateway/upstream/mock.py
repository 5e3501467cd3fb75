"""`MockTransport`: a transport whose server is a function, for unit tests (like httpx's).

The handler gets each message the connection writes (parsed) and returns the messages the
server sends back, delivered on the next loop turn; `server_sends` pushes one unprompted.
`MockOwner` and `MockSink` stand for a downstream party and a call's holder, recording what
reaches them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.errors import UpstreamDown, UpstreamExited
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.upstream.correlator import Call, Host
from gateway.upstream.transport import Link

Handler = Callable[[Message], list[Message]]


class MockTransport:
    kind = "mock"

    def __init__(self, link: Link, handler: Handler) -> None:
        self.link = link
        self.handler = handler
        self.state = "starting"
        self.restarts = 0
        self.written: list[Message] = []  # everything the connection sent, in order
        self.headers: list[dict[str, str] | None] = []
        self.up: asyncio.Task[str] | None = None

    def start(self) -> None:
        self.state = "initializing"
        self.up = asyncio.get_running_loop().create_task(self.link.on_up())

    def write(self, data: bytes, call: Call | None = None,
              headers: dict[str, str] | None = None) -> None:
        if self.state == "down":
            raise UpstreamDown("mock", "upstream 'mock' is not running")
        msg = jsonrpc.loads(data)
        self.written.append(msg)
        self.headers.append(headers)
        for out in self.handler(msg):
            self.server_sends(out)

    def server_sends(self, msg: Message) -> None:
        asyncio.get_running_loop().call_soon(self.link.on_message, jsonrpc.dumps(msg))

    def lose(self, why: str = "gone") -> None:
        """The server goes away: calls in flight fail."""
        self.state = "down"
        self.link.on_lost(UpstreamExited("mock", f"upstream 'mock' {why}"))

    def abort(self, call: Call) -> bool:
        return False

    async def close(self) -> None:
        if self.up is not None:
            self.up.cancel()

    def status(self) -> dict[str, Any]:
        return {}


class MockOwner:
    """A client that declared `caps`; what reaches it outside any call is in `delivered`."""

    def __init__(self, key: str, *caps: str, principal: str | None = None) -> None:
        self.key = key
        self.principal = key if principal is None else principal
        self.capabilities: dict[str, Any] = {c: {} for c in caps}
        self.level: str | None = None
        self.modern = False
        self.delivered: list[Message] = []

    def accepts(self, method: str) -> bool:
        cap = mcp.CLIENT_CAPABILITY_FOR.get(method)
        return cap is None or cap in self.capabilities

    def deliver(self, msg: Message) -> None:
        self.delivered.append(msg)

    def expect_reply(self, asked_id: str, host: Host) -> None:
        pass

    def is_subscribed(self, uri: str) -> bool:
        return False


class MockSink:
    """A call's holder: its related messages, its response, the capabilities refused."""

    takes_mrtr = False

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.responses: list[Message] = []
        self.refused: list[str] = []

    def on_message(self, msg: Message) -> None:
        self.messages.append(msg)

    def on_response(self, msg: Message) -> None:
        self.responses.append(msg)

    def on_refused(self, capability: str) -> None:
        self.refused.append(capability)
