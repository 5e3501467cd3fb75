"""The JSON-RPC 2.0 envelope as plain dicts: codes, builders and classification.

Messages stay plain dicts (parsed with orjson) on the hot path; nothing here validates more
than routing needs.
"""

from __future__ import annotations

from typing import Any, Final, Literal, TypeGuard

import orjson

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
REQUEST_CANCELLED: Final = -32800  # the code LSP and most MCP SDKs use for cancellation

Kind = Literal["request", "notification", "response"]
# Nesting the gateway forwards: orjson writes at most 254 levels (it reads 1024), and the
# gateway wraps what it forwards in a few levels of its own (results, tasks, SSE).
MAX_DEPTH: Final = 200
Message = dict[str, Any]
# spec (base protocol, Requests): an id is a string or an integer, never null (the SDK's
# `RequestId`). An error about a request the gateway could not read carries a null id.
RequestId = str | int


def request(id_: RequestId, method: str, params: dict[str, Any] | None = None) -> Message:
    msg: Message = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def notification(method: str, params: dict[str, Any] | None = None) -> Message:
    msg: Message = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def result(id_: RequestId, value: dict[str, Any] | orjson.Fragment) -> Message:
    """A result message; `value` may be serialized already (a Fragment: embedded as it is)."""
    return {"jsonrpc": "2.0", "id": id_, "result": value}


def error(id_: RequestId | None, code: int, message: str, data: Any = None) -> Message:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": id_, "error": err}


def classify(msg: Any) -> Kind | None:
    """Which of the three JSON-RPC message kinds `msg` is, or None when it is none of them."""
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        return None
    method = msg.get("method")
    if method is not None:
        if not isinstance(method, str):
            return None
        if "id" not in msg:
            return "notification"
        return "request" if valid_id(msg["id"]) else None
    if "id" in msg and ("result" in msg) != ("error" in msg) and (
            valid_id(msg["id"]) or (msg["id"] is None and "error" in msg)):
        return "response"  # null only for an error about a request it could not read
    return None


def valid_id(id_: object) -> TypeGuard[RequestId]:
    # spec (base protocol, Requests): "the ID MUST NOT be null"; strings or integers only.
    return isinstance(id_, str) or (isinstance(id_, int) and not isinstance(id_, bool))


def too_deep(value: Any, size: int, limit: int = MAX_DEPTH) -> bool:
    """Whether `value`, parsed from `size` bytes, nests objects and arrays deeper than
    `limit` (strings and numbers, however big, cost nothing here: only containers are
    visited). Each level takes two bytes at least (its brackets): a message shorter than
    twice the limit is never walked, which is most of them."""
    if size < 2 * limit:
        return False
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, dict | list):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


def dumps(msg: Message) -> bytes:
    return orjson.dumps(msg)


def line(msg: Message) -> bytes:
    """A message as one newline-terminated line, as written to a server: orjson adds the
    newline itself, so a big message is never copied again to get one."""
    return orjson.dumps(msg, option=orjson.OPT_APPEND_NEWLINE)


loads = orjson.loads
JSONDecodeError = orjson.JSONDecodeError
