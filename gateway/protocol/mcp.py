"""MCP names: protocol versions, methods the gateway looks at, and HTTP header names."""

from __future__ import annotations

from typing import Final

# Legacy era: the initialize handshake. Newest first; the first is what the gateway offers.
LEGACY_VERSIONS: Final = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
LATEST_LEGACY: Final = LEGACY_VERSIONS[0]
# spec (Streamable HTTP, Protocol Version Header): with no header and no other way to know,
# "the server SHOULD assume protocol version 2025-03-26".
DEFAULT_HEADERLESS_VERSION: Final = "2025-03-26"

INITIALIZE: Final = "initialize"
INITIALIZED: Final = "notifications/initialized"
PING: Final = "ping"
CANCELLED: Final = "notifications/cancelled"
PROGRESS: Final = "notifications/progress"
LOG_MESSAGE: Final = "notifications/message"
TOOLS_CALL: Final = "tools/call"
SUBSCRIBE: Final = "resources/subscribe"
UNSUBSCRIBE: Final = "resources/unsubscribe"
RESOURCE_UPDATED: Final = "notifications/resources/updated"

# Server-to-client requests, and the client capability each one needs.
CLIENT_CAPABILITY_FOR: Final = {
    "elicitation/create": "elicitation",
    "sampling/createMessage": "sampling",
    "roots/list": "roots",
}

# HTTP header names (aiohttp matches them case-insensitively).
H_SESSION: Final = "Mcp-Session-Id"
H_PROTOCOL: Final = "MCP-Protocol-Version"
H_LAST_EVENT: Final = "Last-Event-ID"
H_ORIGIN: Final = "Origin"
H_ACCEPT: Final = "Accept"
H_AUTH: Final = "Authorization"

CT_JSON: Final = "application/json"
CT_SSE: Final = "text/event-stream"
