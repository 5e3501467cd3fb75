"""What a server sends, checked once, at the boundary: a line that is not a well-formed
JSON-RPC message, or whose fields the gateway routes on have the wrong types, is logged with
the upstream's name and the reason and dropped alone, so nothing further on meets a type it
does not expect (spec: MCP params are objects; ids, progress tokens and request ids are
strings or integers; a resource URI is a string).
"""

from __future__ import annotations

from gateway.observability import log
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Kind, Message

# Fields the gateway routes on, by notification: each must be a JSON-RPC id.
_ID_FIELDS = {mcp.PROGRESS: "progressToken", mcp.CANCELLED: "requestId"}


def check(data: bytes | memoryview, upstream: str) -> tuple[Message, Kind] | None:
    """The message and its kind, or None (logged) when it cannot be routed. An answer
    nested too deep to forward becomes an error answer for its call, which would otherwise
    wait forever."""
    try:
        msg = jsonrpc.loads(data)
    except jsonrpc.JSONDecodeError:
        msg = None
    kind = jsonrpc.classify(msg)
    flaw = "not a JSON-RPC 2.0 message" if kind is None else _flaw(msg, kind)
    if flaw is None and jsonrpc.too_deep(msg):
        if kind == "response":
            return jsonrpc.error(msg["id"], jsonrpc.INTERNAL_ERROR, (
                f"upstream '{upstream}' answered with JSON nested deeper than "
                f"{jsonrpc.MAX_DEPTH} levels, more than the gateway forwards")), "response"
        flaw = f"nested deeper than {jsonrpc.MAX_DEPTH} levels"
    if flaw is not None or kind is None:
        log.warning("upstream.bad_message", upstream=upstream, size=len(data), why=flaw)
        return None
    return msg, kind


def _flaw(msg: Message, kind: Kind) -> str | None:
    """What makes a well-formed JSON-RPC message one the gateway cannot route, if anything."""
    if kind == "response":
        return None
    params = msg.get("params")
    if params is not None and not isinstance(params, dict):
        return "params is not an object"
    if kind == "request":
        return None
    method, given = msg["method"], params or {}
    field = _ID_FIELDS.get(method)
    if field is not None and not jsonrpc.valid_id(given.get(field)):
        return f"{field} is not a string or an integer"
    if method == mcp.RESOURCE_UPDATED and not isinstance(given.get("uri"), str):
        return "uri is not a string"
    return None
