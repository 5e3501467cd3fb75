"""What an upstream's tools/list answers said that the gateway must know of each tool: the
tools it runs as tasks of its own (2025-11-25 `execution.taskSupport`, see native_tasks.py)
and the arguments a tool mirrors in `Mcp-Param-*` headers (spec 2026-07-28 Streamable HTTP,
x-mcp-header). Learned from every tools/list answer on the way to a client; tool names come
from the upstream, never from a client, so the maps stay as small as its catalogue."""

from __future__ import annotations

from typing import Any

from gateway.protocol import mcp
from gateway.protocol.jsonrpc import Message
from gateway.upstream import native_tasks


class Catalogue:
    def __init__(self) -> None:
        self.tools: set[str] = set()  # every name listed (metrics label tools by these only)
        self.native_tools: dict[str, str] = {}  # tool -> its own taskSupport
        self.param_headers: dict[str, dict[tuple[str, ...], str]] = {}

    def learn(self, msg: Message, init_result: dict[str, Any] | None) -> Message:
        """Note what a tools/list answer says of each tool; the answer, untouched."""
        native = native_tasks.serves_tasks(init_result)
        for tool in mcp.listed_tools(msg):
            name = str(tool.get("name"))
            self.tools.add(name)
            support = native_tasks.own_support(tool)
            if native and support in ("required", "optional"):
                self.native_tools[name] = support
            else:
                self.native_tools.pop(name, None)
            if headers := mcp.header_params(tool.get("inputSchema")):
                self.param_headers[name] = headers
            else:
                self.param_headers.pop(name, None)
        return msg

    def own_task_support(self, tool: Any) -> str | None:
        """The tool's taskSupport when the upstream runs it as a task itself."""
        return self.native_tools.get(str(tool))
