"""MCP names: protocol versions, methods the gateway looks at, and HTTP header names."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final

# Legacy era: the initialize handshake. Newest first; the first is what the gateway offers.
LEGACY_VERSIONS: Final = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
LATEST_LEGACY: Final = LEGACY_VERSIONS[0]
# spec 2025-11-25 (SSE polling): streams open with a priming event of empty data; clients of
# older versions may read that empty data as a JSON message and fail (the SDKs prime only these).
PRIMED_VERSIONS: Final = frozenset({"2025-11-25"})

# Modern era: no handshake; every request carries its version in `_meta`.
MODERN_VERSIONS: Final = ("2026-07-28",)
SUPPORTED_VERSIONS: Final = MODERN_VERSIONS + LEGACY_VERSIONS

# Per-request `_meta` keys of the modern era (spec 2026-07-28, basic: General fields).
META_VERSION: Final = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES: Final = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT_INFO: Final = "io.modelcontextprotocol/clientInfo"
META_LOG_LEVEL: Final = "io.modelcontextprotocol/logLevel"
META_SERVER_INFO: Final = "io.modelcontextprotocol/serverInfo"
# spec tasks-2025-11-25: what a request or notification about a task carries in its _meta.
RELATED_TASK: Final = "io.modelcontextprotocol/related-task"
META_SUBSCRIPTION: Final = "io.modelcontextprotocol/subscriptionId"
MODERN_META_KEYS: Final = (META_VERSION, META_CAPABILITIES, META_CLIENT_INFO, META_LOG_LEVEL)

# Modern error codes (spec 2026-07-28, basic: Error Codes).
HEADER_MISMATCH: Final = -32020
MISSING_CAPABILITY: Final = -32021
UNSUPPORTED_VERSION: Final = -32022
LEGACY_RESOURCE_NOT_FOUND: Final = -32002  # replaced by -32602 in 2026-07-28

# The HTTP status of a modern response that carries a JSON-RPC error, by its code: the one
# table every path uses (forwarded from a modern upstream, bridged from a legacy one, the
# gateway's own errors in errors.py). spec 2026-07-28:
# - basic, Per-request protocol fields: a request missing a required `_meta` field is
#   -32602 and "the response status MUST be 400"; -32021 "MUST be 400 Bad Request";
# - Streamable HTTP, Protocol Version Header: -32020 and -32022 are 400; an unimplemented
#   method "MUST respond with 404 Not Found and ... -32601";
# - Streamable HTTP, Sending Messages: a message the server cannot accept gets an HTTP
#   error status (e.g. 400): so do -32700 and -32600, and -32602 whatever the param (the
#   official conformance suite wants 400 for tasks/get of an unknown id).
# Every other code (-32603, the legacy -32000..-32019, application codes) is an answer the
# server gave to a request it took: 200, as JSON-RPC over HTTP carries any result.
MODERN_ERROR_STATUS: Final[dict[int, int]] = {
    -32700: 400,  # parse error
    -32600: 400,  # invalid request
    -32601: 404,  # method not found
    -32602: 400,  # invalid params (a resource not found too, since 2026-07-28)
    HEADER_MISMATCH: 400,
    MISSING_CAPABILITY: 400,
    UNSUPPORTED_VERSION: 400,
}


def modern_error_status(error: Any) -> int:
    """The HTTP status of a modern response whose `error` member is `error` (see
    MODERN_ERROR_STATUS); 200 for a code the table does not name or a malformed error."""
    code = error.get("code") if isinstance(error, dict) else error
    if isinstance(code, bool) or not isinstance(code, int):
        return 200
    return MODERN_ERROR_STATUS.get(code, 200)


class TaskStatus(StrEnum):
    """A task's status, as both task specs name it (spec tasks-2025-11-25 `TaskStatus`; the
    2026-07-28 extension's are the same): here, below tasks/, so what counts ended tasks
    (observability/counters.py) keys them by it. Which may follow which is the task
    model's (tasks/model.py `TRANSITIONS`)."""

    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


DISCOVER: Final = "server/discover"
LISTEN: Final = "subscriptions/listen"
ACKNOWLEDGED: Final = "notifications/subscriptions/acknowledged"
# The modern ClientRequest union (spec 2026-07-28 schema); anything else is -32601 / 404.
MODERN_METHODS: Final = frozenset({
    DISCOVER, "completion/complete", "prompts/get", "prompts/list", "resources/list",
    "resources/templates/list", "resources/read", LISTEN, "tools/call", "tools/list"})
# Requests that may answer `input_required` (spec 2026-07-28, MRTR: Supported Requests).
MRTR_METHODS: Final = frozenset({"tools/call", "prompts/get", "resources/read"})
# Results that carry caching hints (spec 2026-07-28, caching: Cacheable Results).
CACHEABLE_METHODS: Final = frozenset({
    DISCOVER, "tools/list", "prompts/list", "resources/list", "resources/templates/list",
    "resources/read"})
# Requests whose `Mcp-Name` header mirrors a body field (spec 2026-07-28, Streamable HTTP).
NAME_FIELD: Final = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri",
                     "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}
LOG_LEVELS: Final = ("debug", "info", "notice", "warning", "error", "critical", "alert",
                     "emergency")

INITIALIZE: Final = "initialize"
INITIALIZED: Final = "notifications/initialized"
PING: Final = "ping"
CANCELLED: Final = "notifications/cancelled"
PROGRESS: Final = "notifications/progress"
LOG_MESSAGE: Final = "notifications/message"
TOOLS_CALL: Final = "tools/call"
RESOURCES_READ: Final = "resources/read"
ROOTS_LIST: Final = "roots/list"
TOOLS_LIST: Final = "tools/list"
TOOLS_CHANGED: Final = "notifications/tools/list_changed"
SUBSCRIBE: Final = "resources/subscribe"
SET_LEVEL: Final = "logging/setLevel"
UNSUBSCRIBE: Final = "resources/unsubscribe"
RESOURCE_UPDATED: Final = "notifications/resources/updated"

# Every method a client may send, in either era, core tasks included: metrics label requests
# by these names only (anything else is "other"), so clients cannot grow the label set.
METHODS: Final = MODERN_METHODS | frozenset({
    INITIALIZE, INITIALIZED, PING, CANCELLED, PROGRESS, SUBSCRIBE, UNSUBSCRIBE, SET_LEVEL,
    "notifications/roots/list_changed", "tasks/get", "tasks/result", "tasks/list",
    "tasks/cancel", "tasks/update", "notifications/tasks/status"})

# Server-to-client requests, and the client capability each one needs.
CLIENT_CAPABILITY_FOR: Final = {
    "elicitation/create": "elicitation",
    "sampling/createMessage": "sampling",
    "roots/list": "roots",
}

# Keys of input requests (MRTR `inputRequests`, a task's outstanding inputs): one prefix per
# kind, numbered; a legacy server may name its own with this `_meta` hint (a gateway
# extension: keys are the server's to choose).
INPUT_KEY_PREFIX: Final = {"elicitation/create": "elicitation",
                           "sampling/createMessage": "sampling", "roots/list": "roots"}
INPUT_KEY_HINT: Final = "mcp-task-gateway/inputKey"
# A client's webhook for its own task (gateway/push/client.py): the gateway's, never sent on.
META_WEBHOOK: Final = "mcp-task-gateway/webhook"


def input_key(request: dict[str, Any], number: int, used: set[str]) -> str:
    """The key for a server-to-client request, unique among `used` (which it joins)."""
    params = request.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    hint = meta.get(INPUT_KEY_HINT) if isinstance(meta, dict) else None
    key = hint if isinstance(hint, str) and hint and hint not in used else (
        f"{INPUT_KEY_PREFIX.get(request.get('method', ''), 'input')}-{number}")
    used.add(key)
    return key


def progress_token(params: dict[str, Any]) -> str | int | None:
    """The progress token a request's `_meta` carries (spec: a string or an integer)."""
    meta = params.get("_meta")
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    return token if isinstance(token, str | int) and not isinstance(token, bool) else None


def listed_tools(msg: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool objects of a tools/list response (none for an error)."""
    result = msg.get("result")
    tools = result.get("tools") if isinstance(result, dict) else None
    return [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []


def header_params(schema: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], str]:
    """A tool inputSchema's `x-mcp-header` annotations: argument path -> header name part
    (spec 2026-07-28 Streamable HTTP, Schema Extension: reachable through `properties` only).
    """
    props = schema.get("properties") if isinstance(schema, dict) else None
    found: dict[tuple[str, ...], str] = {}
    for key, sub in (props.items() if isinstance(props, dict) else ()):
        if isinstance(sub, dict):
            name = sub.get("x-mcp-header")
            if isinstance(name, str) and name:
                found[(*path, key)] = name
            found.update(header_params(sub, (*path, key)))
    return found


def header_text(value: Any) -> str:
    """A primitive argument as its header carries it (spec: Value Encoding)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# HTTP header names (aiohttp matches them case-insensitively).
H_SESSION: Final = "Mcp-Session-Id"
H_PROTOCOL: Final = "MCP-Protocol-Version"
H_LAST_EVENT: Final = "Last-Event-ID"
H_ORIGIN: Final = "Origin"
H_ACCEPT: Final = "Accept"
H_AUTH: Final = "Authorization"
H_METHOD: Final = "Mcp-Method"
H_NAME: Final = "Mcp-Name"
H_PARAM: Final = "Mcp-Param-"
# Set by a replica on a request it hands to another (downstream/handoff.py): the principal
# it vouches for, sealed with the replicas' secret (auth/replicas.py); never relayed again.
H_RELAYED: Final = "Mcp-Gateway-Relayed"

CT_JSON: Final = "application/json"
CT_SSE: Final = "text/event-stream"
